"""Bad input and misuse, as a new user meets them: one table of cases and what must happen.

Each row of :data:`CLI_CASES` runs a command in-process through its ``main(argv)`` and states the outcome:
the exit status, a fragment of the one ``error:`` line on stderr, and the file or folder that must come
through unchanged (a marker written before the run: nothing the user had is lost). Add a row when a user
finds a new way in. :data:`API_CASES` does the same for library calls that must raise ``ValueError``.
A few cases run as real processes, to see that stderr holds no traceback.
"""

from __future__ import annotations

import logging
import os
import runpy
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import CARD_ARGS, tiny_model
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast
from transformers.modeling_outputs import BaseModelOutput

from hf_vanilla.cli import run_cli
from hf_vanilla.data import read_split_files
from hf_vanilla.demo import main as demo_main
from hf_vanilla.durability import atomic_directory, atomic_file
from hf_vanilla.training import ModelArguments, PaperSeq2SeqTrainer, PaperTrainingArguments, build_model
from hf_vanilla.translate import translate, translate_stream

ROOT = Path(__file__).resolve().parents[1]
MARKER = "the user's own file\n"


def _word_tokenizer(words: int = 96) -> PreTrainedTokenizerFast:
    """conftest's tokenizer (<pad> 0, <s> 1, </s> 2, <unk> 3, then w0 w1 ...), with ``words`` words."""
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3, **{f"w{i}": i + 4 for i in range(words)}}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 2)])
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )


def script_main(name: str) -> Callable[[list[str]], int]:
    """``main(argv)`` of ``scripts/<name>.py``, or of ``python -m hf_vanilla.demo`` for ``"demo"``."""
    if name == "demo":
        return demo_main
    return runpy.run_path(str(ROOT / "scripts" / f"{name}.py"))["main"]


def _train_argv(data: Path, tokenizer: Path, out: Path, *extra: str) -> list[str]:
    return [
        "--train_files", str(data), "--source_lang", "en", "--target_lang", "de",
        "--tokenizer_name_or_path", str(tokenizer),
        "--d_model", "32", "--layers", "2", "--attention_heads", "4", "--ffn_dim", "64",
        "--max_steps", "2", "--save_steps", "1", "--warmup_steps", "1", "--learning_rate", "1e-3",
        "--per_device_train_batch_size", "4", "--eval_strategy", "no", "--do_eval", "false",
        "--report_to", "none", "--use_cpu", "--disable_tqdm", "true", "--dataloader_num_workers", "0",
        "--output_dir", str(out), *extra,
    ]  # fmt: skip


@dataclass(frozen=True)
class World:
    """Read-only inputs shared by the cases (copy before damaging)."""

    model: Path  # a tiny model folder with its 100-token tokenizer
    small_tokenizer: Path  # a 54-token tokenizer with the same special tokens
    source: Path  # a few sentences to translate
    data: Path  # a TSV training file
    run: Path  # a finished 2-step training run: checkpoint-1, checkpoint-2 and the final model


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> World:
    root = tmp_path_factory.mktemp("world")
    tokenizer = _word_tokenizer()
    tiny_model().save_pretrained(root / "model")
    tokenizer.save_pretrained(root / "model")
    _word_tokenizer(50).save_pretrained(root / "small_tokenizer")
    (root / "source.txt").write_text("w1 w2 w3\nw4\n", encoding="utf-8")
    (root / "data.tsv").write_text(
        "".join(f"w{i} w{i + 1} w{i + 2}\tw{i + 2} w{i + 1} w{i}\n" for i in range(16)), encoding="utf-8"
    )
    assert script_main("train")(_train_argv(root / "data.tsv", root / "model", root / "run")) == 0
    return World(
        root / "model", root / "small_tokenizer", root / "source.txt", root / "data.tsv", root / "run"
    )


# --------------------------------------------------------------------------------------------------
# The table
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Case:
    """A command run on bad input. ``setup(world, tmp)`` prepares the scene and returns the path that
    must survive unchanged (a file, or a folder whose every file must), ``argv(world, tmp)`` the arguments."""

    script: str
    argv: Callable[[World, Path], list[str]]
    message: str
    setup: Callable[[World, Path], Path]
    status: int = 1


def _file(tmp: Path, name: str = "out.txt") -> Path:
    (tmp / name).write_text(MARKER, encoding="utf-8")
    return tmp / name


def _folder(tmp: Path, name: str = "out", marker: str = "README.md") -> Path:
    (tmp / name).mkdir()
    (tmp / name / marker).write_text(MARKER, encoding="utf-8")
    return tmp / name


def _copy_model(world: World, tmp: Path) -> Path:
    return Path(shutil.copytree(world.model, tmp / "model"))


def _truncated_weights(world: World, tmp: Path) -> Path:
    weights = _copy_model(world, tmp) / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    return _file(tmp)


def _damaged_tokenizer(world: World, tmp: Path) -> Path:
    tokenizer = _copy_model(world, tmp) / "tokenizer.json"
    tokenizer.write_text(tokenizer.read_text()[:200], encoding="utf-8")
    return _file(tmp)


def _damaged_checkpoint(world: World, tmp: Path) -> Path:
    weights = Path(shutil.copytree(world.run / "checkpoint-1", tmp / "ckpt")) / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-64])
    return _folder(tmp)


def _input(tmp: Path, data: bytes) -> Path:
    (tmp / "in.txt").write_bytes(data)
    return _file(tmp)


def _model_inside(world: World, tmp: Path, name: str = "") -> Path:
    """A copy of the tiny model at ``tmp/cv/name`` (``tmp/cv`` itself by default); returns ``tmp/cv``."""
    shutil.copytree(world.model, tmp / "cv" / name)
    return tmp / "cv"


def _translate(*extra: str, model: str | None = None) -> Callable[[World, Path], list[str]]:
    def argv(world: World, tmp: Path) -> list[str]:
        source = tmp / "in.txt" if (tmp / "in.txt").exists() else world.source
        chosen = str(tmp / "model") if model == "copy" else model or str(world.model)
        return ["--model_name_or_path", chosen, "--input_file", str(source), "--output_file", str(tmp / "out.txt"),
                "--device", "cpu", *extra]  # fmt: skip

    return argv


def _evaluate(*extra: str) -> Callable[[World, Path], list[str]]:
    def argv(world: World, tmp: Path) -> list[str]:
        return ["--model_name_or_path", str(world.model), "--validation_files", str(world.data), "--source_lang",
                "en", "--target_lang", "de", "--output_dir", str(tmp / "eval"), "--device", "cpu", *extra]  # fmt: skip

    return argv


def _tokenizer_argv(world: World, tmp: Path) -> list[str]:
    return ["--train_files", str(world.data), "--source_lang", "en", "--target_lang", "de",
            "--output_dir", str(tmp / "out")]  # fmt: skip


def _average(*extra: str, output: str = "out") -> Callable[[World, Path], list[str]]:
    def argv(world: World, tmp: Path) -> list[str]:
        out = world.run if output == "run" else tmp / output
        return ["--run_dir", str(world.run), "--last_n", "2", "--output_dir", str(out), *extra]

    return argv


def _train(*extra: str, output: str = "out") -> Callable[[World, Path], list[str]]:
    def argv(world: World, tmp: Path) -> list[str]:
        out = world.run if output == "run" else tmp / output
        return _train_argv(world.data, world.model, out, *extra)

    return argv


CLI_CASES: dict[str, Case] = {
    # No command deletes or overwrites what it did not create (issue 17, items 1 and 2).
    "average into an existing folder": Case(
        "average_checkpoints", _average(), "already exists", lambda w, t: _folder(t)
    ),
    "average into the run folder itself": Case(
        "average_checkpoints",
        _average("--overwrite", output="run"),
        "holds the checkpoint",
        lambda w, t: w.run,
    ),
    "average a damaged checkpoint with --overwrite": Case(
        "average_checkpoints",
        lambda w, t: [
            "--checkpoints",
            str(t / "ckpt"),
            str(w.run / "checkpoint-2"),
            "--output_dir",
            str(t / "out"),
            "--overwrite",
        ],
        "is truncated",
        lambda w, t: _damaged_checkpoint(w, t),
    ),
    "translate onto an existing output file": Case(
        "translate", _translate(), "already exists", lambda w, t: _file(t)
    ),
    "translate binary input over an old output": Case(
        "translate",
        _translate("--overwrite"),
        "in.txt, line 2: not UTF-8",
        lambda w, t: _input(t, b"w1\n\xff\xfe\n"),
    ),
    "translate a file with a NUL byte": Case(
        "translate", _translate("--overwrite"), "line 1: a NUL byte", lambda w, t: _input(t, b"w1\x00w2\n")
    ),
    "translate with a smaller tokenizer": Case(
        "translate",
        lambda w, t: [*_translate("--overwrite")(w, t), "--tokenizer_name_or_path", str(w.small_tokenizer)],
        "the tokenizer's vocabulary has 54 tokens but the model's has 100",
        lambda w, t: _file(t),
    ),
    "translate with truncated weights": Case(
        "translate",
        _translate("--overwrite", model="copy"),
        "model.safetensors' is truncated",
        _truncated_weights,
    ),
    "translate with a damaged tokenizer.json": Case(
        "translate", _translate("--overwrite", model="copy"), "tokenizer.json' is damaged", _damaged_tokenizer
    ),
    "translate with a missing model folder": Case(
        "translate",
        _translate(model="runs/no/such/model"),
        "no such folder",
        lambda w, t: _file(t, "other.txt"),
    ),
    "evaluate onto existing results": Case(
        "evaluate_bleu",
        _evaluate(),
        "validation.results.json' already exists",
        lambda w, t: _folder(t, "eval", "validation.results.json") / "validation.results.json",
    ),
    "evaluate with a smaller tokenizer over old results": Case(
        "evaluate_bleu",
        lambda w, t: [*_evaluate("--overwrite")(w, t), "--tokenizer_name_or_path", str(w.small_tokenizer)],
        "Tokenizer and model disagree",
        lambda w, t: _folder(t, "eval", "validation.results.json"),
    ),
    "publish over a hand-written README": Case(
        "publish",
        lambda w, t: ["--model_name_or_path", str(w.model), "--output_dir", str(t / "out")],
        "already exists",
        lambda w, t: _folder(t),
    ),
    "publish with --overwrite but no scores": Case(
        "publish",
        lambda w, t: ["--model_name_or_path", str(w.model), "--output_dir", str(t / "out"), "--overwrite"],
        "hf-vanilla-evaluate",
        lambda w, t: _folder(t),
    ),
    "export over an existing folder": Case(
        "export_ctranslate2",
        lambda w, t: ["--model_dir", str(w.model), "--output_dir", str(t / "out")],
        "already exists",
        lambda w, t: _folder(t),
    ),
    "convert over an existing folder": Case(
        "convert",
        lambda w, t: ["--source", str(w.model), "--output_dir", str(t / "out")],
        "already exists",
        lambda w, t: _folder(t),
    ),
    "convert a model that is not Marian or FSMT, --overwrite": Case(
        "convert",
        lambda w, t: ["--source", str(w.model), "--output_dir", str(t / "out"), "--overwrite"],
        "hf_vanilla converts 'marian'",
        lambda w, t: _folder(t),
    ),
    "train a tokenizer too small to exist, --overwrite": Case(
        "train_tokenizer",
        lambda w, t: [*_tokenizer_argv(w, t), "--vocab_size", "100", "--overwrite"],
        "vocab_size >= 260",
        lambda w, t: _folder(t),
    ),
    "train a tokenizer over an existing folder": Case(
        "train_tokenizer",
        lambda w, t: [*_tokenizer_argv(w, t), "--vocab_size", "300"],
        "already exists",
        lambda w, t: _folder(t),
    ),
    "plot over an existing picture": Case(
        "plot",
        lambda w, t: ["--positional_encoding", "--output_dir", str(t)],
        "positional_encoding.png' already exists",
        lambda w, t: _file(t, "positional_encoding.png"),
    ),
    "plot a missing run with --overwrite": Case(
        "plot",
        lambda w, t: ["--training_run", str(t / "no-run"), "--output_dir", str(t), "--overwrite"],
        "no-run",
        lambda w, t: _file(t, "training_curves.png"),
    ),
    "the demo into an existing folder": Case(
        "demo",
        lambda w, t: ["--quick", "--output_dir", str(t / "out")],
        "already exists",
        lambda w, t: _folder(t),
    ),
    "train into a folder that is not empty": Case(
        "train", _train(), "already exists", lambda w, t: _folder(t)
    ),
    "train afresh into a run with checkpoints, --overwrite": Case(
        "train", _train("--overwrite", output="run"), "already holds checkpoints", lambda w, t: w.run
    ),
    # Model, tokenizer and flags must agree (items 3 and 4).
    "fine-tune with a smaller tokenizer": Case(
        "train",
        lambda w, t: [
            *_train("--model_name_or_path", str(w.model))(w, t),
            "--tokenizer_name_or_path",
            str(w.small_tokenizer),
        ],
        "has 54 tokens but the model's has 100",
        lambda w, t: w.model,
    ),
    "fine-tune from a folder that does not exist": Case(
        "train",
        _train("--model_name_or_path", str(ROOT / "no-such-run")),
        "does not exist",
        lambda w, t: w.model,
    ),
    "fine-tune a model with other sizes, --overwrite": Case(
        "train",
        _train("--model_name_or_path", "MODEL", "--d_model", "64", "--overwrite"),
        "--d_model 64 (it has d_model 32)",
        lambda w, t: w.model,
    ),
    "resume with another number of layers": Case(
        "train",
        _train("--resume_from_checkpoint", "last", "--layers", "3", output="run"),
        "--layers 3 (it has encoder_layers 2, decoder_layers 2)",
        lambda w, t: w.run,
    ),
    "resume with another dropout": Case(
        "train",
        _train("--resume_from_checkpoint", "last", "--dropout", "0.3", output="run"),
        "--dropout 0.3 (it has dropout 0.1)",
        lambda w, t: w.run,
    ),
    # Options that cannot be met fail before training.
    "average more checkpoints than the run saves": Case(
        "train",
        _train("--average_last_n_checkpoints", "5"),
        "will have 2 checkpoint(s)",
        lambda w, t: _file(t),
    ),
    "average with no checkpoints saved": Case(
        "train",
        _train("--average_last_n_checkpoints", "1", "--save_strategy", "no"),
        "will have 0 checkpoint(s)",
        lambda w, t: _file(t),
    ),
    "a negative learning rate": Case(
        "train", _train("--learning_rate", "-1"), "must be >= 0", lambda w, t: _file(t)
    ),
    # Round two: outputs and --overwrite (issue 26)
    "average --overwrite onto a file": Case(
        "average_checkpoints",
        _average("--overwrite", output="notes.txt"),
        "is a file, and this command writes a folder",
        lambda w, t: _file(t, "notes.txt"),
    ),
    "train a tokenizer --overwrite onto a file": Case(
        "train_tokenizer",
        lambda w, t: [*_tokenizer_argv(w, t), "--vocab_size", "300", "--overwrite"],
        "is a file, and this command writes a folder",
        lambda w, t: _file(t, "out"),
    ),
    "translate --overwrite onto a folder": Case(
        "translate",
        _translate("--overwrite"),
        "is a folder, and this command writes a file",
        lambda w, t: _folder(t, "out.txt"),
    ),
    "draw a picture --overwrite onto a folder": Case(
        "plot",
        lambda w, t: ["--positional_encoding", "--output_dir", str(t / "plots"), "--overwrite"],
        "is a folder, and this command writes a file",
        lambda w, t: _folder(_folder(t, "plots"), "positional_encoding.png"),
    ),
    "translate to a file name ending in /": Case(
        "translate",
        lambda w, t: [*_translate()(w, t)[:-4], "--output_file", f"{t}/newdir/", "--device", "cpu"],
        "ends with '/'",
        lambda w, t: _file(t, "other.txt").parent,  # the folder must not gain a file named newdir
    ),
    "translate onto its own input, --overwrite": Case(
        "translate",
        lambda w, t: [*_translate("--overwrite")(w, t), "--output_file", str(t / "in.txt")],
        "is the input",
        lambda w, t: _input(t, b"w1 w2\nw3\n").with_name("in.txt"),
    ),
    "convert into the folder of its source, --overwrite": Case(
        "convert",
        lambda w, t: ["--source", str(t / "cv" / "src"), "--output_dir", str(t / "cv"), "--overwrite"],
        "holds the input",
        lambda w, t: _model_inside(w, t, "src"),
    ),
    "export CTranslate2 into the model's own folder, --overwrite": Case(
        "export_ctranslate2",
        lambda w, t: ["--model_dir", str(t / "cv"), "--output_dir", str(t / "cv"), "--overwrite"],
        "is the input",
        lambda w, t: _model_inside(w, t),
    ),
    "export ONNX into a folder holding the model, --overwrite": Case(
        "export_onnx",
        lambda w, t: ["--model_dir", str(t / "cv" / "model"), "--output_dir", str(t / "cv"), "--overwrite"],
        "holds the input",
        lambda w, t: _model_inside(w, t, "model"),
    ),
    "publish into a folder holding the model, --overwrite": Case(
        "publish",
        lambda w, t: [
            "--model_name_or_path",
            str(t / "cv" / "model"),
            "--output_dir",
            str(t / "cv"),
            "--overwrite",
        ],
        "holds the input",
        lambda w, t: _model_inside(w, t, "model"),
    ),
    "train a tokenizer into the folder of its data, --overwrite": Case(
        "train_tokenizer",
        lambda w, t: [
            "--train_files",
            str(t / "cv" / "data.tsv"),
            "--source_lang",
            "en",
            "--target_lang",
            "de",
            "--vocab_size",
            "300",
            "--output_dir",
            str(t / "cv"),
            "--overwrite",
        ],
        "holds the input",
        lambda w, t: Path(shutil.copy(w.data, Path(_folder(t, "cv")) / "data.tsv")).parent,
    ),
    "translate a missing input file, before loading the model": Case(
        "translate",
        lambda w, t: [*_translate(model="runs/no/such/model")(w, t), "--input_file", str(t / "no.txt")],
        "no.txt' does not exist. Check the path",
        lambda w, t: _file(t, "other.txt"),
    ),
    "translate a folder given as the input file": Case(
        "translate",
        lambda w, t: [*_translate("--overwrite")(w, t), "--input_file", str(t)],
        "is a folder; give a text file",
        lambda w, t: _file(t),
    ),
    "fine-tune a model into its own folder, --overwrite": Case(
        "train",
        lambda w, t: _train_argv(
            w.data, w.model, t / "cv", "--model_name_or_path", str(t / "cv"), "--overwrite"
        ),
        "is the input",
        lambda w, t: _model_inside(w, t),
    ),
}


def _snapshot(path: Path) -> dict[str, bytes]:
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    return {str(p.relative_to(path) if path.is_dir() else p.name): p.read_bytes() for p in files}


@pytest.mark.parametrize("name", list(CLI_CASES))
def test_bad_input_ends_in_one_line_and_loses_nothing(
    name: str, world: World, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    case = CLI_CASES[name]
    kept = case.setup(world, tmp_path)
    before = _snapshot(kept)
    argv = [str(world.model) if a == "MODEL" else a for a in case.argv(world, tmp_path)]
    status = script_main(case.script)(argv)
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1] if err.strip() else ""
    assert status == case.status, err[-2000:]
    assert last.startswith("error: ") and case.message in last, err[-2000:]
    assert "Traceback" not in err
    assert _snapshot(kept) == before  # the user's file or folder is exactly as it was
    leftovers = [p.name for p in tmp_path.rglob("*") if ".tmp-" in p.name or ".old-" in p.name]
    assert leftovers == []


# --------------------------------------------------------------------------------------------------
# Library calls that must raise ValueError saying what is wrong
# --------------------------------------------------------------------------------------------------
API_CASES: dict[str, tuple[Callable[[], Any], str]] = {
    "generate() on an empty batch": (
        lambda: tiny_model().generate(input_ids=torch.zeros(0, 5, dtype=torch.long)),
        "empty batch",
    ),
    "generate() on empty encoder outputs": (
        lambda: tiny_model().generate(
            encoder_outputs=BaseModelOutput(last_hidden_state=torch.zeros(0, 5, 32))
        ),
        "empty batch",
    ),
    "labels above the vocabulary": (
        lambda: tiny_model()(input_ids=torch.full((1, 4), 5), labels=torch.tensor([[5, 6, 100]])),
        "`labels` contain token id 100, outside the vocabulary",
    ),
    "negative labels other than -100": (
        lambda: tiny_model().train()(input_ids=torch.full((1, 4), 5), labels=torch.tensor([[5, -100, -3]])),
        "`labels` contain token id -3",
    ),
    "translate() with a smaller tokenizer": (
        lambda: translate(tiny_model(), _word_tokenizer(50), ["w1 w2"], device="cpu"),
        "has 54 tokens but the model's has 100",
    ),
    "translate() with a larger tokenizer": (
        lambda: translate(tiny_model(), _word_tokenizer(200), ["w1 w2"], device="cpu"),
        "has 204 tokens but the model's has 100",
    ),
    "translate() with another eos id": (
        lambda: translate(tiny_model(eos_token_id=3), _word_tokenizer(), ["w1 w2"], device="cpu"),
        "eos_token_id is 2 in the tokenizer but 3 in the model",
    ),
}


@pytest.mark.parametrize("name", list(API_CASES))
def test_bad_api_input_raises_a_value_error_that_says_so(name: str) -> None:
    call, message = API_CASES[name]
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("[", r"\[")):
        call()


def test_labels_at_the_vocabulary_edge_and_ignored_ones_are_accepted() -> None:
    loss = tiny_model()(input_ids=torch.full((1, 4), 5), labels=torch.tensor([[99, -100, 2]])).loss
    assert torch.isfinite(loss)


# --------------------------------------------------------------------------------------------------
# Translation: blank lines, chunk boundaries, complete or absent
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("chunk_lines", [1, 2, 3, 100])
def test_blank_lines_anywhere_and_any_chunk_boundary_keep_the_lines(tmp_path: Path, chunk_lines: int) -> None:
    model, tokenizer = tiny_model(), _word_tokenizer()
    lines = ["", "w1 w2", "", "", "w3", "  ", "w4 w5 w6", ""]  # blank first, last, and a whole chunk of them
    source = tmp_path / "in.txt"
    source.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    generate_kwargs = {"max_new_tokens": 3}
    count = translate_stream(
        model, tokenizer, source, tmp_path / "out.txt", batch_size=2, device="cpu", chunk_lines=chunk_lines,
        generate_kwargs=generate_kwargs,
    )  # fmt: skip
    out = (tmp_path / "out.txt").read_text(encoding="utf-8").split("\n")
    assert count == len(lines) and out[-1] == "" and len(out) == len(lines) + 1
    expected = translate(model, tokenizer, lines, batch_size=2, device="cpu", generate_kwargs=generate_kwargs)
    assert out[:-1] == expected
    assert [o == "" for o in out[:-1]] == [not line.strip() for line in lines]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt", "out.txt"]


def test_a_failure_during_translation_leaves_no_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, tokenizer = tiny_model(), _word_tokenizer()
    source = tmp_path / "in.txt"
    source.write_text("w1\nw2\nw3\n", encoding="utf-8")
    calls = {"n": 0}
    original = model.generate

    def fail_on_the_second_chunk(*args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("out of memory")
        return original(*args, **kwargs)

    monkeypatch.setattr(model, "generate", fail_on_the_second_chunk)
    for existing in (False, True):
        if existing:
            (tmp_path / "out.txt").write_text(MARKER)
        calls["n"] = 0
        with pytest.raises(RuntimeError, match="out of memory"):
            translate_stream(model, tokenizer, source, tmp_path / "out.txt", device="cpu", chunk_lines=2,
                             generate_kwargs={"max_new_tokens": 2}, overwrite=True)  # fmt: skip
        # the first chunk was translated, but the output is absent (or the old one), never partial
        assert sorted(p.name for p in tmp_path.iterdir()) == (
            ["in.txt", "out.txt"] if existing else ["in.txt"]
        )
        if existing:
            assert (tmp_path / "out.txt").read_text() == MARKER


def test_a_failed_folder_write_keeps_the_old_folder(tmp_path: Path) -> None:
    old = _folder(tmp_path)
    with pytest.raises(OSError, match="disk full"), atomic_directory(old) as staged:
        (staged / "model.safetensors").write_bytes(b"partial")
        raise OSError("disk full")
    assert _snapshot(old) == {"README.md": MARKER.encode()}


# --------------------------------------------------------------------------------------------------
# Flags applied where meaningful, warnings before training
# --------------------------------------------------------------------------------------------------
def test_fine_tuning_applies_and_logs_a_new_dropout(world: World, caplog: pytest.LogCaptureFixture) -> None:
    args = ModelArguments(model_name_or_path=str(world.model), dropout=0.3)
    with caplog.at_level(logging.WARNING, logger="hf_vanilla"):
        model = build_model(args, _word_tokenizer())
    assert model.config.dropout == 0.3
    assert {m.dropout for m in model.modules() if hasattr(m, "dropout") and isinstance(m.dropout, float)} >= {
        0.3
    }
    assert "with --dropout 0.3 instead of its dropout 0.1" in caplog.text
    same = build_model(
        ModelArguments(model_name_or_path=str(world.model), d_model=32, layers=2), _word_tokenizer()
    )
    assert same.config.dropout == 0.1  # sizes equal to the model's are accepted


def test_a_zero_learning_rate_is_warned_about_before_training(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    args = PaperTrainingArguments(
        output_dir=str(tmp_path),
        learning_rate=0.0,
        max_steps=1,
        eval_strategy="no",
        report_to="none",
        use_cpu=True,
    )
    with caplog.at_level(logging.WARNING, logger="hf_vanilla"):
        PaperSeq2SeqTrainer(model=tiny_model(), args=args, processing_class=_word_tokenizer())
    assert "--learning_rate is 0: training will not change the weights" in caplog.text


# --------------------------------------------------------------------------------------------------
# Real processes: no traceback for a user error; --debug shows it
# --------------------------------------------------------------------------------------------------
def test_a_user_error_in_a_process_is_one_line_and_debug_shows_the_traceback(
    world: World, tmp_path: Path
) -> None:
    (tmp_path / "in.txt").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    command = [sys.executable, str(ROOT / "scripts" / "translate.py"), "--model_name_or_path", str(world.model),
               "--input_file", str(tmp_path / "in.txt"), "--output_file", str(tmp_path / "out.txt"), "--device", "cpu"]  # fmt: skip
    plain = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert plain.returncode == 1
    assert "Traceback" not in plain.stderr
    assert (
        plain.stderr.strip().splitlines()[-1].startswith(f"error: {tmp_path / 'in.txt'}, line 1: not UTF-8")
    )
    debug = subprocess.run([*command, "--debug"], env=env, capture_output=True, text=True, timeout=300)
    assert debug.returncode == 1 and "Traceback" in debug.stderr
    assert not (tmp_path / "out.txt").exists()


@pytest.mark.parametrize(
    "argv, traceback",
    [
        ([], False),  # python -m hf_vanilla.demo: the README's main command takes no argument
        (["--quick"], False),
        (["--debug"], True),
        (["--log_level", "debug"], True),
        (["--log_level=debug"], True),
        (["--log_level", "info"], False),
    ],
)
def test_run_cli_takes_any_argument_list(argv: list[str], traceback: bool) -> None:
    """Every command goes through ``run_cli``; with no arguments at all it must run the command."""
    seen: list[list[str]] = []

    def fails(args: list[str]) -> None:
        seen.append(args)
        raise ValueError("bad input")

    if traceback:
        with pytest.raises(ValueError, match="bad input"):
            run_cli(fails, argv, debug_flag=False)
    else:
        assert run_cli(fails, argv, debug_flag=False) == 1
    assert seen == [argv]


PUSH = ("--push_to_hub", "--hub_model_id", "someone/x")
VALIDATION = ("--validation_files", "DATA")


@pytest.mark.parametrize(
    "extra, message",
    [
        (("--push_to_hub", "--dataset", "multi30k", *VALIDATION), "--push_to_hub needs --hub_model_id"),
        ((*PUSH, *VALIDATION), "--dataset is required"),
        ((*PUSH, "--dataset", "wmt14", *VALIDATION), "Unknown --dataset 'wmt14'"),
        ((*PUSH, *CARD_ARGS[:4], *VALIDATION), "--dataset custom needs --data_terms, --weights_license"),
        ((*PUSH, *CARD_ARGS), "this run has no validation split"),
        ((*PUSH, *CARD_ARGS, "--demo", "--demo_validation_size", "0"), "this run has no validation split"),
        ((*PUSH, *CARD_ARGS, *VALIDATION, "--do_train", "false"), "--do_train is false"),
        ((*PUSH, *CARD_ARGS, *VALIDATION, "--hub_strategy", "checkpoint"), "pushes once, when training ends"),
        ((*PUSH, *CARD_ARGS, *VALIDATION, "--resume_from_checkpoint", "last"), "The Hub folder"),
    ],
    ids=["no repo", "no dataset", "unknown dataset", "custom without terms", "no validation", "demo without "
         "validation", "no training", "checkpoint pushes", "resume over a Hub folder"],
)  # fmt: skip
def test_train_push_to_hub_is_checked_in_one_line_before_any_work(
    extra: tuple[str, ...],
    message: str,
    world: World,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The card's data, the repo, a validation split to score and a free ``<output_dir>/hub`` are checked
    before the data is even loaded; nothing is written."""
    run = tmp_path / "run"
    if "--resume_from_checkpoint" in extra:  # a run whose earlier push failed: its Hub folder is kept
        shutil.copytree(world.run, run)
        _folder(run, "hub")
    before = _snapshot(run) if run.exists() else None

    def load_from_args(*args: Any) -> None:
        raise AssertionError("the data was loaded before the push arguments were checked")

    monkeypatch.setattr("hf_vanilla.training.load_from_args", load_from_args)
    argv = _train_argv(world.data, world.model, run, *(str(world.data) if a == "DATA" else a for a in extra))
    if "--demo" in extra:
        argv = [a for a in argv if a not in ("--train_files", str(world.data))]
    status = script_main("train")(argv)
    err = capsys.readouterr().err.strip().splitlines()
    errors = [line for line in err if line.startswith("error: ")]
    assert status == 1 and errors == [err[-1]] and message in err[-1], err[-5:]
    assert (_snapshot(run) if run.exists() else None) == before  # nothing written: no checkpoint, no folder


# --------------------------------------------------------------------------------------------------
# Round two: outputs, --overwrite and interrupted commands (issue 26)
# --------------------------------------------------------------------------------------------------
def test_publish_directory_never_replaces_a_file_or_a_link(tmp_path: Path) -> None:
    """The shared publishing step refuses to put a folder where a file or a link is, and keeps it."""
    notes = _file(tmp_path, "notes.txt")
    target = _folder(tmp_path, "target")
    (tmp_path / "link").symlink_to(target)
    for final in (notes, tmp_path / "link"):
        with pytest.raises(FileExistsError, match="not a folder"), atomic_directory(final) as staged:
            (staged / "config.json").write_text("{}", encoding="utf-8")
    assert notes.read_text(encoding="utf-8") == MARKER and (tmp_path / "link").resolve() == target
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "notes.txt", "target"]


def test_a_pipe_is_read_as_the_input_file(
    world: World, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--input_file <(...)`` hands the command a pipe: it is read once, like stdin, and translated."""
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)

    def feed() -> None:
        with open(pipe, "w", encoding="utf-8") as writer:
            writer.write("w1 w2 w3\n\nw4\n")

    writer = threading.Thread(target=feed, daemon=True)
    writer.start()
    out = tmp_path / "out.txt"
    argv = ["--model_name_or_path", str(world.model), "--input_file", str(pipe), "--output_file", str(out)]
    status = script_main("translate")([*argv, "--device", "cpu"])
    writer.join(timeout=10)
    assert status == 0, capsys.readouterr().err[-2000:]
    assert len(out.read_text(encoding="utf-8").splitlines()) == 3


def test_pipes_are_read_as_data_files(tmp_path: Path) -> None:
    """``--train_files <(...) <(...)``: two pipes, read once each, give the sentence pairs."""
    pipes = [tmp_path / "src", tmp_path / "tgt"]
    writers = []
    for pipe, text in zip(pipes, ("w1 w2\nw3\n", "w2 w1\nw3\n"), strict=True):
        os.mkfifo(pipe)
        writers.append(threading.Thread(target=pipe.write_text, args=(text,), daemon=True))
        writers[-1].start()
    assert read_split_files([str(p) for p in pipes], "en", "de") == (["w1 w2", "w3"], ["w2 w1", "w3"])
    for writer in writers:
        writer.join(timeout=10)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        read_split_files([str(tmp_path / "missing.en"), str(tmp_path / "missing.de")], "en", "de")


_FOLDER_WRITE_KILLED = """
import os, signal, sys
from pathlib import Path
from hf_vanilla.cli import run_cli
from hf_vanilla.durability import atomic_directory, atomic_file

def body(argv):
    with atomic_directory(Path(argv[0])) as staged:
        (staged / "model.safetensors").write_bytes(b"half")
        os.kill(os.getpid(), signal.SIGTERM)
        raise AssertionError("SIGTERM did not stop the command")

sys.exit(run_cli(body, [sys.argv[1]]))
"""


def test_sigterm_during_a_folder_write_leaves_no_staged_folder(tmp_path: Path) -> None:
    """A command stopped by SIGTERM while its output folder is staged removes it, as Ctrl-C does."""
    old = _folder(tmp_path, "out")
    before = _snapshot(tmp_path)
    done = subprocess.run(
        [sys.executable, "-c", _FOLDER_WRITE_KILLED, str(old)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 143 and done.stderr.strip().splitlines()[-1] == "terminated", done.stderr[
        -2000:
    ]
    assert _snapshot(tmp_path) == before  # the old folder as it was, no .out.tmp-... beside it


def test_sigterm_during_translation_leaves_the_folder_as_it_was(world: World, tmp_path: Path) -> None:
    """SIGTERM while ``--output_file`` is being written (stdin kept open, so the command is mid-way):
    the old output stays, the temporary file goes, and the command ends in one line, status 143."""
    _file(tmp_path)
    before = _snapshot(tmp_path)
    command = [sys.executable, str(ROOT / "scripts" / "translate.py"), "--model_name_or_path", str(world.model),
               "--output_file", str(tmp_path / "out.txt"), "--overwrite", "--device", "cpu"]  # fmt: skip
    process = subprocess.Popen(
        command, stdin=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path.parent
    )
    try:
        process.stdin.write("w1 w2 w3\n")
        process.stdin.flush()
        staged: list[Path] = []
        while not staged or staged[0].stat().st_size == 0:  # the first line is translated and written
            assert process.poll() is None, process.stderr.read()[-2000:]
            staged = list(tmp_path.glob(".out.txt.tmp-*"))
            time.sleep(0.05)  # polling for the condition, not waiting for it to happen
        process.send_signal(signal.SIGTERM)
        err = process.communicate(timeout=120)[1]
    finally:
        process.kill()
    assert process.returncode == 143 and err.strip().splitlines()[-1] == "terminated", err[-2000:]
    assert _snapshot(tmp_path) == before


def test_a_failed_write_removes_the_folders_it_made(tmp_path: Path) -> None:
    """A file or folder that was to go into new folders leaves none behind when writing fails."""
    with (
        pytest.raises(RuntimeError, match="boom"),
        atomic_file(tmp_path / "new" / "deep" / "out.txt") as handle,
    ):
        handle.write("half")
        raise RuntimeError("boom")
    with pytest.raises(RuntimeError, match="boom"), atomic_directory(tmp_path / "new" / "out") as staged:
        (staged / "config.json").write_text("{}", encoding="utf-8")
        raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []


def test_overwrite_never_replaces_the_current_folder(
    world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--output_dir .. --overwrite`` would replace the folder the user works in, and all in it."""
    work = _folder(tmp_path, "work")
    monkeypatch.chdir(work)
    before = _snapshot(tmp_path)
    for output in (".", ".."):
        argv = ["--run_dir", str(world.run), "--last_n", "2", "--output_dir", output, "--overwrite"]
        assert script_main("average_checkpoints")(argv) == 1
        assert "the current folder" in capsys.readouterr().err.strip().splitlines()[-1]
    assert _snapshot(tmp_path) == before
