"""Faults (hf_vanilla/io/safe_loading.py, hf_vanilla/training/resilience.py): kill and resume, damaged and malicious checkpoint files, atomic saves.

In-process tests use the project's ``PaperSeq2SeqTrainer``; the slow
tests launch ``scripts/train.py`` (through tests/train_driver.py) and kill it with SIGTERM, SIGINT (Ctrl-C) or SIGKILL.
"""

from __future__ import annotations

import ast
import json
import logging
import os
import pickle
import random
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from helpers import Outputs, _env, gloo_threads, tiny_model
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import (
    AutoModelForSeq2SeqLM,
    DataCollatorForSeq2Seq,
    PreTrainedTokenizerFast,
    Seq2SeqTrainer,
    TrainerCallback,
)
from transformers.trainer_utils import get_last_checkpoint

from hf_vanilla.data.loading import load_local_files
from hf_vanilla.data.tokenization import tokenize_translations
from hf_vanilla.io.atomic import atomic_directory, save_pretrained_atomic
from hf_vanilla.io.checked_loading import load_pretrained_checked
from hf_vanilla.io.checkpoints import find_complete_checkpoints, last_complete_checkpoint, verify_checkpoint
from hf_vanilla.io.checksums import CHECKSUMS_NAME
from hf_vanilla.io.errors import CorruptCheckpointError, UnsafeCheckpointError
from hf_vanilla.io.pickles import pickle_globals, verify_pickle_file
from hf_vanilla.io.safe_loading import verify_model_folder
from hf_vanilla.training import trainer as training
from hf_vanilla.training.arguments import PaperTrainingArguments
from hf_vanilla.training.checkpoints import (
    STAGING_DIR_NAME,
    StateMismatchError,
    check_optimizer_state,
)
from hf_vanilla.training.resilience import SaveOnSignalCallback, StoppedBySignal
from hf_vanilla.training.trainer import PaperSeq2SeqTrainer

ROOT = Path(__file__).resolve().parents[2]
WORDS = [f"w{i}" for i in range(4, 40)]


def test_the_project_trainer_is_the_one_trainer_subclass() -> None:
    """The in-process tests below exercise the Trainer that hf-vanilla-train uses: hf_vanilla's one
    ``Trainer`` subclass, whose docstring names every private Trainer method it overrides."""
    found, todo = [], [transformers.Trainer]
    while todo:
        todo += todo.pop().__subclasses__()
        found += [cls for cls in todo if cls.__module__.startswith("hf_vanilla.") and cls not in found]
    assert found == [PaperSeq2SeqTrainer]
    private = [
        name
        for name in vars(PaperSeq2SeqTrainer)
        if name.startswith("_") and not name.startswith("__") and hasattr(transformers.Seq2SeqTrainer, name)
    ]
    assert private and [name for name in private if f"``{name}``" not in PaperSeq2SeqTrainer.__doc__] == []


def _dataset(tmp_path: Path, tokenizer: Any, n: int = 40) -> Any:
    rng = random.Random(0)
    lines = []
    for _ in range(n):
        words = rng.choices(WORDS, k=rng.randint(2, 7))
        lines.append(f"{' '.join(words)}\t{' '.join(reversed(words))}\n")
    path = tmp_path / "train.tsv"
    path.write_text("".join(lines), encoding="utf-8")
    return tokenize_translations(load_local_files({"train": [str(path)]}, "en", "de"), tokenizer, "en", "de")[
        "train"
    ]


def _trainer(
    output_dir: Path,
    tokenizer: Any,
    data: Any,
    callbacks: tuple = (),
    model_overrides: dict[str, Any] | None = None,
    **overrides: Any,
) -> PaperSeq2SeqTrainer:
    defaults = {
        "output_dir": str(output_dir),
        "max_steps": 8,
        "warmup_steps": 1,
        "learning_rate": 1e-3,
        "max_tokens": None,  # sentence-count batches of per_device_train_batch_size
        "per_device_train_batch_size": 4,
        "save_strategy": "steps",
        "save_steps": 3,
        "eval_strategy": "no",
        "do_eval": False,
        "logging_steps": 1,
        "report_to": "none",
        "disable_tqdm": True,
        "use_cpu": True,
        "seed": 0,
    }
    args = PaperTrainingArguments(**{**defaults, **overrides})
    model = tiny_model(
        seed=1, dropout=0.1, **(model_overrides or {})
    ).train()  # dropout on: resuming must restore the RNG too
    trainer = PaperSeq2SeqTrainer(
        model=model,
        args=args,
        train_dataset=data,
        processing_class=tokenizer,
        data_collator=DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=-100),
        callbacks=list(callbacks),
    )
    return trainer


def _params(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(folder / "model.safetensors")


def _assert_same_weights(got: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert got.keys() == expected.keys()
    for key in expected:
        torch.testing.assert_close(got[key], expected[key], rtol=1e-5, atol=1e-6, msg=key)


def _word_tokenizer() -> PreTrainedTokenizerFast:
    """conftest's tokenizer (96 words, <pad> 0, <s> 1, </s> 2, <unk> 3), for module-scoped fixtures."""
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3, **{f"w{i}": i + 4 for i in range(96)}}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 2)])
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerFast:
    return _word_tokenizer()


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory, tokenizer: Any) -> Any:
    return _dataset(tmp_path_factory.mktemp("data"), tokenizer)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory, tokenizer: Any, data: Any) -> Path:
    """An uninterrupted run of 8 steps with checkpoints at 3 and 6 (and the final model). Read only."""
    out = tmp_path_factory.mktemp("run") / "straight"
    trainer = _trainer(out, tokenizer, data)
    trainer.train()
    trainer.save_model()
    return out


# --------------------------------------------------------------------------------------------------
# Kill and resume
# --------------------------------------------------------------------------------------------------
@pytest.fixture
def python_sigint() -> Iterator[None]:
    """Python's own SIGINT handler for the test, whatever the process inherited: a process started in
    the background (``cmd &``, some CI runners) begins with SIGINT ignored, and the callback rightly
    restores what it found."""
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, inherited)


class _SignalAtStep(TrainerCallback):
    def __init__(self, step: int, signum: int = signal.SIGTERM) -> None:
        self.step, self.signum = step, signum

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step == self.step:
            signal.raise_signal(self.signum)  # the Python handler has run when this returns


@pytest.mark.parametrize(
    ("signum", "max_tokens"), [(signal.SIGTERM, None), (signal.SIGTERM, 60), (signal.SIGINT, None)]
)
def test_a_signal_saves_the_current_step_and_resuming_gives_the_same_weights(
    tmp_path: Path, tokenizer: Any, data: Any, run: Path, signum: int, max_tokens: int | None
) -> None:
    """SIGTERM (preemption) and SIGINT (Ctrl-C) alike."""
    if max_tokens is not None:  # token-budget batches (§5.1): a different sampler to resume mid-epoch
        straight = tmp_path / "straight-tokens"
        trainer = _trainer(straight, tokenizer, data, max_tokens=max_tokens)
        trainer.train()
        trainer.save_model()
    else:
        straight = run
    out = tmp_path / "killed"
    previous_handler = signal.getsignal(signum)
    saver = SaveOnSignalCallback()
    trainer = _trainer(
        out, tokenizer, data, callbacks=(_SignalAtStep(5, signum), saver), max_tokens=max_tokens
    )
    with pytest.raises(StoppedBySignal) as exit_info:  # a SystemExit
        trainer.train()
    assert exit_info.value.code == 128 + signum  # 143 for SIGTERM, 130 for SIGINT
    assert signal.getsignal(signum) == previous_handler  # a second signal acts at once
    # Step 5 is not a save step (3, 6): the signal made it one, and nothing ran past it.
    assert sorted(p.name for p in out.iterdir() if p.name.startswith("checkpoint")) == [
        "checkpoint-3",
        "checkpoint-5",
    ]
    assert json.loads((out / "checkpoint-5" / "trainer_state.json").read_text())["global_step"] == 5
    assert not (out / STAGING_DIR_NAME).exists()

    resumed = _trainer(out, tokenizer, data, max_tokens=max_tokens)
    resumed.train(resume_from_checkpoint=True)  # the newest whole checkpoint: 5
    resumed.save_model()
    _assert_same_weights(_params(out), _params(straight))
    _assert_same_weights(_params(out / "checkpoint-6"), _params(straight / "checkpoint-6"))


class _TwoSignalsAtStep(_SignalAtStep):
    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        super().on_step_end(args, state, control, **kwargs)
        super().on_step_end(args, state, control, **kwargs)


def test_a_signal_stopped_run_ends_its_process_group_once_the_trainer_is_gone(
    gloo_group_of_one: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """scripts/train.py, after every process saved the step a signal stopped it at: the group ends,
    gloo's threads too, only once the Trainer is garbage (see end_process_group), and the process
    exits 128 + signal. A live gloo group can abort the exit, and the launcher would read the saved run
    as failed."""
    import hf_vanilla.cli.train as train_cli
    import hf_vanilla.training.run as run

    def stopped_run(*arguments: Any) -> None:
        trainer = {"model": torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 2))}
        trainer["self"] = trainer  # a Trainer's reference cycles keep its wrapped model alive
        raise StoppedBySignal(143)

    monkeypatch.setattr(run, "run_training", stopped_run)
    monkeypatch.setattr(run, "setup_logging", lambda training_args: None)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    with pytest.raises(SystemExit) as exit_info:
        train_cli._run(["--output_dir", str(tmp_path / "out")])
    assert exit_info.value.code == 143
    assert not torch.distributed.is_initialized()
    assert gloo_threads() == 0


def test_a_second_ctrl_c_stops_at_once_without_saving(
    tmp_path: Path, tokenizer: Any, data: Any, python_sigint: None
) -> None:
    out = tmp_path / "twice"
    trainer = _trainer(
        out, tokenizer, data, callbacks=(_TwoSignalsAtStep(5, signal.SIGINT), SaveOnSignalCallback())
    )
    with pytest.raises(KeyboardInterrupt):  # Python's own handler, restored by the first Ctrl-C
        trainer.train()
    assert sorted(p.name for p in out.iterdir() if p.name.startswith("checkpoint")) == ["checkpoint-3"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


class _FailAtStep(TrainerCallback):
    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step == 2:
            raise RuntimeError("a failure in the middle of training")


def test_a_run_that_fails_leaves_no_signal_handler_behind(
    tmp_path: Path, tokenizer: Any, data: Any, python_sigint: None
) -> None:
    """A failed run (no ``on_train_end``) must not leave its handler installed: it would swallow the
    next Ctrl-C of the process (a notebook, or the next run, which then saves instead of stopping)."""
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    failing = _trainer(tmp_path / "fails", tokenizer, data, callbacks=(_FailAtStep(), SaveOnSignalCallback()))
    with pytest.raises(RuntimeError, match="in the middle of training"):
        failing.train()
    assert {sig: signal.getsignal(sig) for sig in before} == before
    test_a_second_ctrl_c_stops_at_once_without_saving(tmp_path, tokenizer, data, python_sigint)


def test_resume_true_skips_a_half_written_checkpoint(
    tmp_path: Path, tokenizer: Any, data: Any, run: Path
) -> None:
    out = tmp_path / "crashed"
    shutil.copytree(run / "checkpoint-3", out / "checkpoint-3")
    # A kill during saving: checkpoint-6 has its weights half written and no trainer_state.json yet.
    shutil.copytree(run / "checkpoint-6", out / "checkpoint-6")
    (out / "checkpoint-6" / "trainer_state.json").unlink()
    weights = out / "checkpoint-6" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])

    assert get_last_checkpoint(str(out)).endswith("checkpoint-6")  # what the plain Trainer would pick
    assert last_complete_checkpoint(out) == out / "checkpoint-3"
    assert find_complete_checkpoints(out) == [out / "checkpoint-3"]

    trainer = _trainer(out, tokenizer, data)
    trainer.train(resume_from_checkpoint=True)
    trainer.save_model()
    _assert_same_weights(_params(out), _params(run))
    verify_checkpoint(out / "checkpoint-6")  # re-saved whole over the half-written one


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.mark.parametrize("really_missing", [None, "model.encoder.layers.0.fc1.weight"])
def test_resuming_reports_no_tied_weight_as_missing_and_still_reports_a_missing_one(
    checkpoints: tuple[Path, Path], tokenizer: Any, data: Any, tmp_path: Path, really_missing: str | None
) -> None:
    """The shared embedding is saved once; its other names (the encoder's and decoder's embeddings, the
    output projection) are restored through it, so the Trainer's "missing keys" warning about them was a
    false alarm on every resume. A weight really missing from the checkpoint is still reported."""
    good, _ = checkpoints
    if really_missing is not None:
        weights = load_file(good / "model.safetensors")
        del weights[really_missing]
        save_file(weights, good / "model.safetensors", metadata={"format": "pt"})
        (good / CHECKSUMS_NAME).unlink()
    records = _Records()
    trainer_logger = logging.getLogger("transformers.trainer")
    trainer_logger.addHandler(records)
    try:
        _trainer(tmp_path / "resume", tokenizer, data).train(resume_from_checkpoint=str(good))
    finally:
        trainer_logger.removeHandler(records)
    missing = [m for m in records.messages if "missing keys" in m]
    if really_missing is None:
        assert missing == []
    else:
        assert len(missing) == 1 and really_missing in missing[0]
        assert "embed_tokens" not in missing[0] and "lm_head" not in missing[0]


def test_checkpoints_are_written_then_renamed_with_checksums(
    tmp_path: Path, tokenizer: Any, data: Any
) -> None:
    out = tmp_path / "out"
    trainer = _trainer(out, tokenizer, data, save_steps=2, save_total_limit=2)
    trainer.train()
    names = sorted(p.name for p in out.iterdir())
    assert names == ["checkpoint-6", "checkpoint-8"]  # rotation ran after the rename
    for step in (6, 8):
        verify_checkpoint(out / f"checkpoint-{step}")
        listed = (out / f"checkpoint-{step}" / CHECKSUMS_NAME).read_text().split("\n")
        assert any(line.endswith("  optimizer.pt") for line in listed)


def test_a_crash_while_saving_leaves_no_half_written_checkpoint(
    tmp_path: Path, tokenizer: Any, data: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out"
    trainer = _trainer(out, tokenizer, data)
    original = trainer._save_rng_state

    def failing(output_dir: str) -> None:
        if output_dir.endswith("checkpoint-6"):
            raise OSError("No space left on device")
        original(output_dir)

    monkeypatch.setattr(trainer, "_save_rng_state", failing)
    with pytest.raises(OSError, match="No space left"):
        trainer.train()
    assert sorted(p.name for p in out.iterdir() if p.name.startswith("checkpoint")) == ["checkpoint-3"]
    assert get_last_checkpoint(str(out)).endswith("checkpoint-3")  # even the plain Trainer resumes right
    verify_checkpoint(out / "checkpoint-3")


def test_every_process_waits_until_the_checkpoints_model_folder_is_checked(
    tmp_path: Path, tokenizer: Any, data: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under DDP a process other than the main one saves no model and goes straight on to write its
    ``rng_state_<rank>.pth`` into the checkpoint; were it not held at a barrier until the main process
    has written and checked the model folder (which refuses any pickle in it), the check would find the
    file and stop the run. One process, each step recorded in the order it happens."""
    events: list[str] = []
    trainer = _trainer(tmp_path / "out", tokenizer, data, max_steps=1, save_steps=1)

    def recorded(name: str, function: Any, when: str = "done") -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if when == "begun":
                events.append(name)
            result = function(*args, **kwargs)
            if when == "done":
                events.append(name)
            return result

        return wrapper

    monkeypatch.setattr(
        training, "finish_model_folder", recorded("model checked", training.finish_model_folder)
    )
    monkeypatch.setattr(
        trainer.accelerator, "wait_for_everyone", recorded("barrier", trainer.accelerator.wait_for_everyone)
    )
    for method in ("_save_optimizer_and_scheduler", "_save_rng_state"):
        monkeypatch.setattr(trainer, method, recorded("trainer state", getattr(trainer, method), "begun"))
    trainer.train()
    checked, first_state = events.index("model checked"), events.index("trainer state")
    assert checked < first_state and "barrier" in events[checked:first_state], events
    assert (tmp_path / "out" / "checkpoint-1" / "rng_state.pth").is_file()


def test_a_crash_while_saving_the_final_model_keeps_the_old_one(
    tmp_path: Path, tokenizer: Any, data: Any, run: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out"
    shutil.copytree(run, out)
    before = (out / "model.safetensors").read_bytes()
    trainer = _trainer(out, tokenizer, data, max_steps=1, save_strategy="no")

    def failing(self: Any, output_dir: str | None = None, state_dict: Any = None) -> None:
        Path(output_dir).mkdir(parents=True, exist_ok=True)
        Path(output_dir, "model.safetensors").write_bytes(b"half a file")
        raise OSError("No space left on device")

    monkeypatch.setattr(PaperSeq2SeqTrainer, "_save", failing)
    with pytest.raises(OSError, match="No space left"):
        trainer.save_model()
    assert (out / "model.safetensors").read_bytes() == before
    monkeypatch.undo()
    with torch.no_grad():
        trainer.model.lm_head.weight.add_(1.0)
    trainer.save_model()  # and a successful save replaces it, leaving nothing temporary behind
    assert (out / "model.safetensors").read_bytes() != before
    assert not [p for p in out.iterdir() if p.name.startswith(".")]


def test_atomic_directory_keeps_the_old_folder_on_failure(tmp_path: Path) -> None:
    target = tmp_path / "model"
    target.mkdir()
    (target / "weights").write_text("old")
    with pytest.raises(RuntimeError, match="boom"), atomic_directory(target) as staged:
        (staged / "weights").write_text("half")
        raise RuntimeError("boom")
    assert (target / "weights").read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]

    model = tiny_model()
    save_pretrained_atomic(target, model, checksums=True)
    assert not (target / "weights").exists()  # replaced as a whole, not merged
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]
    reloaded = load_pretrained_checked(target)
    _assert_same_weights(reloaded.state_dict(), model.state_dict())


# --------------------------------------------------------------------------------------------------
# Damaged files
# --------------------------------------------------------------------------------------------------
@pytest.fixture
def checkpoints(run: Path, tmp_path: Path) -> tuple[Path, Path]:
    """Copies of the run's two checkpoints, free to damage."""
    out = tmp_path / "damaged"
    for name in ("checkpoint-3", "checkpoint-6"):
        shutil.copytree(run / name, out / name)
    return out / "checkpoint-3", out / "checkpoint-6"


def test_truncated_weights_give_a_clear_error_and_the_previous_checkpoint_loads(
    checkpoints: tuple[Path, Path],
) -> None:
    good, bad = checkpoints
    weights = bad / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])

    with pytest.raises(CorruptCheckpointError, match=r"model\.safetensors.*truncated") as error:
        load_pretrained_checked(bad)
    assert str(weights) in str(error.value) and "earlier checkpoint" in str(error.value)
    with pytest.raises(CorruptCheckpointError, match="truncated"):
        verify_checkpoint(bad)
    assert last_complete_checkpoint(good.parent) == good
    state, saved = load_pretrained_checked(good).state_dict(), _params(good)
    _assert_same_weights({key: state[key] for key in saved}, saved)


def test_garbage_bytes_in_the_header_give_a_clear_error(checkpoints: tuple[Path, Path]) -> None:
    _, bad = checkpoints
    weights = bad / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[8:40] = os.urandom(32)
    weights.write_bytes(bytes(data))
    with pytest.raises(CorruptCheckpointError, match=r"model\.safetensors.*(header|damaged)"):
        verify_model_folder(bad)
    data[:8] = b"\xff" * 8  # an absurd header length
    weights.write_bytes(bytes(data))
    with pytest.raises(CorruptCheckpointError, match="header claims"):
        verify_model_folder(bad)


def test_garbage_bytes_in_the_tensor_data_are_caught_by_the_checksum(checkpoints: tuple[Path, Path]) -> None:
    good, bad = checkpoints
    weights = bad / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-64:] = os.urandom(64)  # same length, header intact: only a checksum can tell
    weights.write_bytes(bytes(data))
    with pytest.raises(CorruptCheckpointError, match=r"model\.safetensors.*sha256"):
        verify_checkpoint(bad)
    assert last_complete_checkpoint(bad.parent) == good


def test_truncated_optimizer_state_gives_a_clear_error(checkpoints: tuple[Path, Path]) -> None:
    _, bad = checkpoints
    (bad / CHECKSUMS_NAME).unlink()  # the file's own structure must tell, not only the checksum
    optimizer = bad / "optimizer.pt"
    optimizer.write_bytes(optimizer.read_bytes()[:200])
    with pytest.raises(CorruptCheckpointError, match=r"optimizer\.pt"):
        verify_checkpoint(bad)


def test_a_checkpoint_mixing_two_saves_is_refused(checkpoints: tuple[Path, Path]) -> None:
    good, bad = checkpoints
    shutil.copy2(good / "trainer_state.json", bad / "trainer_state.json")
    with pytest.raises(CorruptCheckpointError, match="global_step 3"):
        verify_checkpoint(bad, checksums=False)


def test_resuming_from_a_damaged_checkpoint_names_the_file(
    checkpoints: tuple[Path, Path], tokenizer: Any, data: Any, tmp_path: Path
) -> None:
    _, bad = checkpoints
    weights = bad / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    trainer = _trainer(tmp_path / "resume", tokenizer, data)
    with pytest.raises(CorruptCheckpointError, match=r"model\.safetensors"):
        trainer.train(resume_from_checkpoint=str(bad))


@pytest.mark.parametrize(
    ("other_model", "expected"),
    [
        (
            {"d_model": 16},
            r"exp_avg\S* of model\.\S+ has shape \[100, 16\], the parameter \[100, 32\]",
        ),  # smaller
        (
            {"d_model": 64},
            r"exp_avg\S* of model\.\S+ has shape \[100, 64\], the parameter \[100, 32\]",
        ),  # larger
        ({"encoder_layers": 1}, r"parameter group \d has \d+ parameters, the model's \d+"),
    ],
)
def test_an_optimizer_state_of_another_model_is_refused_before_any_step(
    checkpoints: tuple[Path, Path],
    tokenizer: Any,
    data: Any,
    tmp_path: Path,
    other_model: dict,
    expected: str,
) -> None:
    """An optimizer.pt of another run copied into a checkpoint (its manifest rewritten: the copier
    writes it) holds plain tensors; resuming must refuse it, naming the file, before the first step
    (the fused Adam step would otherwise read past the end of smaller moments, or train on with
    larger ones)."""
    other = _trainer(tmp_path / "other", tokenizer, data, model_overrides=other_model, max_steps=3)
    other.train()
    good, _ = checkpoints
    shutil.copy2(tmp_path / "other" / "checkpoint-3" / "optimizer.pt", good / "optimizer.pt")
    (good / CHECKSUMS_NAME).unlink()
    resumed = _trainer(tmp_path / "resume", tokenizer, data)

    def no_step(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a training step ran with the other run's optimizer state")

    resumed.training_step = no_step  # type: ignore[method-assign]
    with pytest.raises(StateMismatchError, match=expected) as error:
        resumed.train(resume_from_checkpoint=str(good))
    assert str(good / "optimizer.pt") in str(error.value)
    assert "--model_name_or_path" in str(error.value)


def test_a_scheduler_state_of_another_optimizer_is_refused(
    checkpoints: tuple[Path, Path], tokenizer: Any, data: Any, tmp_path: Path
) -> None:
    good, _ = checkpoints
    scheduler = torch.load(good / "scheduler.pt", weights_only=True)
    scheduler["base_lrs"] = scheduler["base_lrs"][:1]  # one parameter group where this run has two
    torch.save(scheduler, good / "scheduler.pt")
    (good / CHECKSUMS_NAME).unlink()
    resumed = _trainer(tmp_path / "resume", tokenizer, data)
    with pytest.raises(
        StateMismatchError, match=r"scheduler\.pt.*\['base_lrs'\] has 1 entries, this run's 2"
    ):
        resumed.train(resume_from_checkpoint=str(good))


def test_an_optimizer_state_is_checked_entry_by_entry() -> None:
    """The check itself: counts, entries per parameter, shapes (factored moments allowed), dtypes."""
    first, second = torch.nn.Parameter(torch.zeros(4, 3)), torch.nn.Parameter(torch.zeros(2, 3))
    optimizer = torch.optim.Adam([first, second])
    moments = {"step": torch.tensor(1.0), "exp_avg": torch.zeros(4, 3), "exp_avg_sq": torch.zeros(4, 3)}
    state = {
        "state": {
            0: moments,
            1: {"step": torch.tensor(1.0), "exp_avg": torch.zeros(2, 3), "exp_avg_sq": torch.zeros(2, 3)},
        },
        "param_groups": [{"params": [0, 1]}],
    }
    check_optimizer_state(state, optimizer, "optimizer.pt")
    names = {id(first): "first"}
    cases = [
        ({0: {**moments, "exp_avg_sq": torch.zeros(4)}}, None),  # factored (Adafactor's row)
        (
            {0: {**moments, "exp_avg": torch.zeros(4, 2)}},
            r"exp_avg of first has shape \[4, 2\], the parameter \[4, 3\]",
        ),
        (
            {0: {**moments, "exp_avg": torch.zeros(4, 3, dtype=torch.int64)}},
            "exp_avg of first is torch.int64",
        ),
        ({0: {**moments, "step": torch.ones(2)}}, "the step of first has 2 values"),
        (
            {0: {"step": moments["step"], "exp_avg": moments["exp_avg"]}},
            r"parameter 1 holds the entries \['exp_avg', 'exp_avg_sq', 'step'\], first \['exp_avg', 'step'\]",
        ),
        ({5: moments}, "parameter 5, which the optimizer does not have"),
    ]
    for changed, expected in cases:
        edited = {**state, "state": {**state["state"], **changed}}
        if expected is None:
            check_optimizer_state(edited, optimizer, "optimizer.pt", names)
            continue
        with pytest.raises(StateMismatchError, match=expected):
            check_optimizer_state(edited, optimizer, "optimizer.pt", names)
    for malformed in ({"x": 1}, {"state": {}, "param_groups": [[0, 1]]}, {**state, "state": {0: [1, 2]}}):
        with pytest.raises(
            StateMismatchError, match=r"not an optimizer state|not those of an optimizer|not entries"
        ):
            check_optimizer_state(malformed, optimizer, "optimizer.pt")
    with pytest.raises(StateMismatchError, match="1 parameter group"):
        check_optimizer_state(
            {**state, "param_groups": [{"params": [0, 1]}]},
            torch.optim.Adam([{"params": [first]}, {"params": [second]}]),
            "optimizer.pt",
        )


# --------------------------------------------------------------------------------------------------
# Untrusted files
# --------------------------------------------------------------------------------------------------
class _Payload:
    """Unpickling this creates a marker file: proof that code ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (Path.touch, (self.marker,))


def _malicious_torch_file(path: Path, marker: Path) -> None:
    torch.save({"state": {}, "param_groups": [], "x": _Payload(marker)}, path)


def _malicious_raw_pickle(path: Path, marker: Path) -> None:
    path.write_bytes(pickle.dumps(_Payload(marker)))


@pytest.mark.parametrize("name", ["optimizer.pt", "rng_state.pth", "scheduler.pt"])
@pytest.mark.parametrize("writer", [_malicious_torch_file, _malicious_raw_pickle])
def test_a_malicious_pickle_in_a_checkpoint_is_refused_without_running(
    checkpoints: tuple[Path, Path], tmp_path: Path, name: str, writer: Any
) -> None:
    _, bad = checkpoints
    marker = tmp_path / "pwned"
    writer(bad / name, marker)
    with pytest.raises(UnsafeCheckpointError, match=rf"{name}.*(would import|raw or legacy pickle)") as error:
        verify_checkpoint(bad, checksums=False)
    assert "pathlib" in str(error.value) or "raw or legacy" in str(error.value)
    assert not marker.exists()
    assert last_complete_checkpoint(bad.parent) == bad.parent / "checkpoint-3"  # skipped, not loaded
    assert not marker.exists()


def test_resuming_a_malicious_checkpoint_never_runs_the_payload(
    checkpoints: tuple[Path, Path], tokenizer: Any, data: Any, tmp_path: Path
) -> None:
    _, bad = checkpoints
    marker = tmp_path / "pwned"
    (bad / CHECKSUMS_NAME).unlink()
    _malicious_torch_file(bad / "rng_state.pth", marker)
    trainer = _trainer(tmp_path / "resume", tokenizer, data)
    with pytest.raises(UnsafeCheckpointError, match=r"rng_state\.pth"):
        trainer.train(resume_from_checkpoint=str(bad))
    # The plain Trainer (no mixin) refuses it too: it loads with torch.load(weights_only=True).
    plain = Seq2SeqTrainer(
        model=trainer.model,
        args=trainer.args,
        train_dataset=data,
        processing_class=tokenizer,
        data_collator=trainer.data_collator,
    )
    with pytest.raises(Exception, match=r"(?i)weights.only"):
        plain.train(resume_from_checkpoint=str(bad))
    assert not marker.exists()


def test_pickled_model_weights_with_code_are_refused(tmp_path: Path) -> None:
    folder = tmp_path / "model"
    tiny_model().save_pretrained(folder)
    (folder / "model.safetensors").unlink()
    marker = tmp_path / "pwned"
    _malicious_torch_file(folder / "pytorch_model.bin", marker)
    with pytest.raises(UnsafeCheckpointError, match=r"pytorch_model\.bin"):
        load_pretrained_checked(folder)
    with pytest.raises(Exception, match=r"(?i)weights.only|unpickl"):
        AutoModelForSeq2SeqLM.from_pretrained(folder)  # transformers refuses it as well
    assert not marker.exists()


def test_plain_pickled_weights_pass(tmp_path: Path) -> None:
    folder = tmp_path / "model"
    model = tiny_model()
    model.save_pretrained(folder)
    (folder / "model.safetensors").unlink()
    torch.save(model.state_dict(), folder / "pytorch_model.bin")
    verify_model_folder(folder)


def test_dcp_metadata_is_scanned_without_unpickling(tmp_path: Path) -> None:
    import torch.distributed.checkpoint as dcp

    folder = tmp_path / "checkpoint-1" / "pytorch_model_fsdp_0"
    with pytest.warns(UserWarning, match="single process"):
        dcp.save({"w": torch.ones(2, 3)}, checkpoint_id=str(folder), no_dist=True)
    verify_pickle_file(folder / ".metadata")  # torch.distributed.checkpoint dataclasses only
    assert any(
        g.startswith("torch.distributed.checkpoint.")
        for g in pickle_globals((folder / ".metadata").read_bytes())
    )

    marker = tmp_path / "pwned"
    _malicious_raw_pickle(folder / ".metadata", marker)
    with pytest.raises(UnsafeCheckpointError, match=r"\.metadata.*pathlib\.Path\.touch"):
        verify_pickle_file(folder / ".metadata")
    assert not marker.exists()


def test_pickle_globals_reads_protocol_4_stack_globals() -> None:
    data = pickle.dumps(_Payload(Path("x")), protocol=4)
    assert any(g.endswith(".touch") for g in pickle_globals(data))
    assert pickle_globals(pickle.dumps({"a": [1, 2.0, "s"]})) == set()


def test_the_package_never_unpickles_without_weights_only() -> None:
    """Every torch.load in hf_vanilla passes weights_only=True; pickle.load(s) is never called."""
    offenders = []
    for path in sorted((ROOT / "hf_vanilla").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
                continue
            owner = node.func.value.id if isinstance(node.func.value, ast.Name) else None
            if node.func.attr == "load" and owner == "torch":
                weights_only = [k for k in node.keywords if k.arg == "weights_only"]
                if not weights_only or not (
                    isinstance(weights_only[0].value, ast.Constant) and weights_only[0].value.value is True
                ):
                    offenders.append(f"{path.name}:{node.lineno} torch.load without weights_only=True")
            if node.func.attr in ("load", "loads", "Unpickler") and owner in (
                "pickle",
                "dill",
                "cloudpickle",
            ):
                offenders.append(f"{path.name}:{node.lineno} {owner}.{node.func.attr}")
    assert offenders == []


# --------------------------------------------------------------------------------------------------
# A real training process, killed (slow)
# --------------------------------------------------------------------------------------------------
def _train_cmd(tokenizer_dir: Path, data_file: Path, out: Path, max_steps: int = 8) -> list[str]:
    return [
        sys.executable,
        str(ROOT / "tests" / "train_driver.py"),
        "--train_files", str(data_file),
        "--tokenizer_name_or_path", str(tokenizer_dir),
        "--d_model", "32", "--layers", "2", "--attention_heads", "4", "--ffn_dim", "64",
        "--max_steps", str(max_steps), "--save_steps", "3", "--warmup_steps", "1", "--learning_rate", "1e-3",
        "--per_device_train_batch_size", "4", "--logging_steps", "1", "--eval_strategy", "no",
        "--do_eval", "false", "--report_to", "none", "--use_cpu", "--disable_tqdm", "true",
        "--output_dir", str(out),
    ]  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL])
def test_train_script_killed_and_resumed_ends_with_the_same_weights(
    tmp_path: Path, tokenizer: Any, signum: int
) -> None:
    tokenizer_dir = tmp_path / "tokenizer"
    tokenizer.save_pretrained(tokenizer_dir)
    rng = random.Random(0)
    data_file = tmp_path / "train.tsv"
    data_file.write_text(
        "".join(
            f"{' '.join(w)}\t{' '.join(reversed(w))}\n"
            for w in (rng.choices(WORDS, k=rng.randint(2, 7)) for _ in range(24))
        ),
        encoding="utf-8",
    )
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    # The uninterrupted run and the run to be killed go side by side (8 steps over 6-batch epochs).
    reference = subprocess.Popen(
        _train_cmd(tokenizer_dir, data_file, straight), env=_env(tmp_path / "rec-straight"),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    victim = subprocess.Popen(
        _train_cmd(tokenizer_dir, data_file, killed), env=_env(tmp_path / "rec-killed", HF_VANILLA_BLOCK_AT_STEP="5"),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        output = Outputs(victim)
        output.wait_for(r"^train_driver: blocked after step 5", timeout=600)
        victim.send_signal(signum)
        victim.wait(timeout=120)
        log = output.closed(victim, timeout=60)
        assert victim.returncode in (128 + signum, -signum), log[-3000:]
        checkpoints = sorted(p.name for p in killed.iterdir() if p.name.startswith("checkpoint"))
        # SIGTERM, Ctrl-C: the run saved the step it was on; SIGKILL: only what was saved before (step 3) survives.
        assert checkpoints == (
            ["checkpoint-3"] if signum == signal.SIGKILL else ["checkpoint-3", "checkpoint-5"]
        )
        assert not (killed / "model.safetensors").exists()  # it never got to the end

        resume = subprocess.run(
            [*_train_cmd(tokenizer_dir, data_file, killed), "--resume_from_checkpoint", str(last_complete_checkpoint(killed))],
            env=_env(tmp_path / "rec-resumed"), capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        assert resume.returncode == 0, (resume.stdout + resume.stderr)[-3000:]
        out = reference.communicate(timeout=600)[0]
        assert reference.returncode == 0, out[-3000:]
        _assert_same_weights(_params(killed), _params(straight))
    finally:  # nothing left running, whatever failed
        reference.kill()
        victim.kill()
