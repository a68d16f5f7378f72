"""Bad input and misuse, as a new user meets them: one table of cases and what must happen.

Each row of :data:`CLI_CASES` runs a command in-process through its ``main(argv)`` and states the outcome:
the exit status, a fragment of the one ``error:`` line on stderr, and the file or folder that must come
through unchanged (a marker written before the run: nothing the user had is lost). Add a row when a user
finds a new way in. :data:`API_CASES` does the same for library calls that must raise ``ValueError``.
A few cases run as real processes, to see that stderr holds no traceback.
"""

from __future__ import annotations

import argparse
import fcntl
import functools
import io
import json
import logging
import os
import runpy
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import CARD_ARGS, Outputs, fed_pipes, tiny_model, word_tokenizer
from safetensors.torch import load_file, save_file
from transformers import DataCollatorForSeq2Seq, MarianConfig, MarianMTModel
from transformers.modeling_outputs import BaseModelOutput

from hf_vanilla.cli import run_cli
from hf_vanilla.cli.demo import main as demo_main
from hf_vanilla.data.loading import load_local_files, read_split_files
from hf_vanilla.data.tokenization import tokenize_translations
from hf_vanilla.inference.decoding import generate_ids
from hf_vanilla.inference.options import DecodingOptions
from hf_vanilla.inference.streaming import translate_stream
from hf_vanilla.inference.translation import translate, translate_nbest
from hf_vanilla.io.atomic import atomic_directory, atomic_file
from hf_vanilla.io.checkpoints import find_complete_checkpoints
from hf_vanilla.io.checksums import weights_fingerprint
from hf_vanilla.training.arguments import PaperTrainingArguments
from hf_vanilla.training.options import TrainingModelArguments
from hf_vanilla.training.resilience import SaveOnSignalCallback
from hf_vanilla.training.run import build_model
from hf_vanilla.training.trainer import PaperSeq2SeqTrainer

ROOT = Path(__file__).resolve().parents[2]

MARKER = "the user's own file\n"


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
    tokenizer = word_tokenizer()
    tiny_model().save_pretrained(root / "model")
    tokenizer.save_pretrained(root / "model")
    word_tokenizer(50).save_pretrained(root / "small_tokenizer")
    (root / "source.txt").write_text("w1 w2 w3\nw4\n", encoding="utf-8")
    (root / "data.tsv").write_text(
        "".join(f"w{i} w{i + 1} w{i + 2}\tw{i + 2} w{i + 1} w{i}\n" for i in range(16)), encoding="utf-8"
    )
    assert script_main("train")(_train_argv(root / "data.tsv", root / "model", root / "run")) == 0
    return World(
        root / "model", root / "small_tokenizer", root / "source.txt", root / "data.tsv", root / "run"
    )


# Scenes for what a model folder records and the JSON files a command reads
def _flip_a_bit(weights: Path) -> None:
    """One bit of the first tensor flipped in place: same size, same header, a huge but finite value."""
    data = bytearray(weights.read_bytes())
    header = int.from_bytes(data[:8], "little")
    data[8 + header + 3] ^= 0x40
    weights.write_bytes(bytes(data))


def _halve_vocabulary(tokenizer_json: Path) -> None:
    tokenizer = json.loads(tokenizer_json.read_text(encoding="utf-8"))
    vocab = tokenizer["model"]["vocab"]
    tokenizer["model"]["vocab"] = dict(list(vocab.items())[: len(vocab) // 2])
    tokenizer_json.write_text(json.dumps(tokenizer), encoding="utf-8")


def _edit_json(path: Path, **changes: Any) -> None:
    path.write_text(json.dumps({**json.loads(path.read_text(encoding="utf-8")), **changes}), encoding="utf-8")


def _run_model(world: World, tmp: Path, damage: Callable[[Path], None]) -> Path:
    """The final model of the world's training run, copied to ``tmp/model`` and damaged by ``damage``."""
    model = Path(shutil.copytree(world.run, tmp / "model", ignore=shutil.ignore_patterns("checkpoint-*")))
    damage(model)
    return _file(tmp)


def _list_state(world: World, tmp: Path) -> None:
    """A copy of the world's run whose trainer_state.json holds a list."""
    run = Path(shutil.copytree(world.run, tmp / "run", ignore=shutil.ignore_patterns("checkpoint-*")))
    (run / "trainer_state.json").write_text("[]", encoding="utf-8")


def _damaged_export(world: World, tmp: Path, name: str) -> Path:
    """A CTranslate2 export of the world's model whose JSON file ``name`` holds a list."""
    (_ct2_export(world, tmp) / name).write_text("[]", encoding="utf-8")
    return _file(tmp)


def _damaged_copy(
    world: World, tmp: Path, name: str, change: Callable[[Any], Any], text: str | None = None
) -> Path:
    """A copy of the world's model (no manifest) whose JSON file ``name`` holds ``change(its value)``, or
    ``text``."""
    path = _copy_model(world, tmp) / name
    path.write_text(
        text if text is not None else json.dumps(change(json.loads(path.read_text()))), encoding="utf-8"
    )
    return _file(tmp)


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


def _damaged_run(world: World, tmp: Path) -> Path:
    """A copy of the world's run with every checkpoint's weights truncated."""
    run = Path(shutil.copytree(world.run, tmp / "damaged"))
    for weights in run.glob("checkpoint-*/model.safetensors"):
        weights.write_bytes(weights.read_bytes()[:-64])
    return run


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


def _publish() -> Callable[[World, Path], list[str]]:
    def argv(world: World, tmp: Path) -> list[str]:
        return ["--model_name_or_path", str(world.model), "--output_dir", str(tmp / "out"),
                "--results_files", str(tmp / "validation.results.json"), *CARD_ARGS]  # fmt: skip

    return argv


# Scenes for the number, weight and config cases
def _nan_weights(world: World, tmp: Path, source: Path | None = None, name: str = "model") -> Path:
    """A copy of the model (or of ``source``) with a NaN and (2 layers) an inf weight, as a diverged run saves."""
    folder = Path(shutil.copytree(source or world.model, tmp / name))
    state = load_file(str(folder / "model.safetensors"))
    state["model.encoder.layers.0.fc1.weight"][0, 0] = float("nan")
    if "model.decoder.layers.1.fc2.bias" in state:
        state["model.decoder.layers.1.fc2.bias"][1] = float("inf")
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "checksums.sha256").unlink(missing_ok=True)  # the NaN was saved, not damaged afterwards
    return folder


def _edited_config(
    world: World, tmp: Path, source: Path | None = None, name: str = "model", **changes: Any
) -> Path:
    """A copy of the model (or of ``source``) whose config.json disagrees with its weights."""
    folder = Path(shutil.copytree(source or world.model, tmp / name))
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    (folder / "config.json").write_text(json.dumps({**config, **changes}), encoding="utf-8")
    (folder / "checksums.sha256").unlink(missing_ok=True)
    return folder


def _ct2_export(world: World, tmp: Path) -> Path:
    """A CTranslate2 export of the world's model (its 100-token tokenizer inside)."""
    pytest.importorskip("ctranslate2")
    from hf_vanilla.interop.export_ctranslate2 import export_ctranslate2

    return Path(export_ctranslate2(world.model, tmp / "model"))


def _other_tokenizer(tmp: Path, words: int, pad: str = "<pad>") -> Path:
    tokenizer = word_tokenizer(words)
    tokenizer.pad_token = pad
    tokenizer.save_pretrained(tmp / "tokenizer")
    return tmp / "tokenizer"


def _ct2_with_tokenizer(words: int, pad: str = "<pad>") -> Callable[[World, Path], Path]:
    def setup(world: World, tmp: Path) -> Path:
        _other_tokenizer(tmp, words, pad)
        return _ct2_export(world, tmp)

    return setup


def _with_tokenizer(argv: Callable[[World, Path], list[str]]) -> Callable[[World, Path], list[str]]:
    return lambda w, t: [*argv(w, t), "--tokenizer_name_or_path", str(t / "tokenizer")]


def _evaluate_copy(*extra: str) -> Callable[[World, Path], list[str]]:
    def argv(world: World, tmp: Path) -> list[str]:
        return [*_evaluate(*extra)(world, tmp), "--model_name_or_path", str(tmp / "model")]

    return argv


def _results(tmp: Path, model: Path | None, fingerprint: bool = True, shape: str = "object") -> Path:
    """A results file as hf-vanilla-evaluate writes it, for ``model`` (its weights fingerprint, or none
    as before that check existed), or damaged: a JSON list, or an empty ``decoding``."""
    result: dict[str, Any] = {
        "bleu": 1.0, "chrf": 2.0, "bleu_signature": "x", "chrf_signature": "y", "num_segments": 2,
        "split": "validation", "source_lang": "en", "target_lang": "de", "dataset_name": "pairs",
        "decoding": DecodingOptions().to_dict() if shape != "no decoding" else {},
    }  # fmt: skip
    if model is not None:
        result["model"] = str(model)
        if fingerprint:
            result["model_sha256"] = weights_fingerprint(model)
    path = tmp / "validation.results.json"
    path.write_text(json.dumps([result] if shape == "list" else result), encoding="utf-8")
    return path


def _pickled_marian(world: World, tmp: Path) -> Path:
    """A Marian folder whose pytorch_model.bin pickles an ``argparse.Namespace`` next to the tensors."""
    config = MarianConfig(vocab_size=60, d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                          decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32,
                          max_position_embeddings=32, pad_token_id=59, decoder_start_token_id=59)  # fmt: skip
    config.save_pretrained(tmp / "marian")
    state = {**MarianMTModel(config).state_dict(), "args": argparse.Namespace(lr=1)}
    torch.save(state, tmp / "marian" / "pytorch_model.bin")
    return tmp / "marian"


def _bad_data(world: World, tmp: Path) -> Path:
    (tmp / "bad.tsv").write_bytes(b"w1 w2\tw2 w1\nw3\tw3\nw4 \xe9\tw4\n")
    return tmp / "bad.tsv"


def _long_validation(tmp: Path) -> Path:
    (tmp / "long.tsv").write_text("w1\tw1\n" + " ".join(["w2"] * 69) + "\tw2\n", encoding="utf-8")
    return _folder(tmp, "eval", "validation.results.json")


def _average_copies(world: World, tmp: Path, damage: Callable[..., Path]) -> Path:
    """checkpoint-1 as it is, checkpoint-2 damaged by ``damage`` (into ``tmp/ckpt``)."""
    return damage(world, tmp, source=world.run / "checkpoint-2", name="ckpt")


def _average_argv(world: World, tmp: Path) -> list[str]:
    return [
        "--checkpoints",
        str(world.run / "checkpoint-1"),
        str(tmp / "ckpt"),
        "--output_dir",
        str(tmp / "out"),
    ]


def _fine_tune_copy(world: World, tmp: Path) -> list[str]:
    return _train("--model_name_or_path", str(tmp / "model"))(world, tmp)


CLI_CASES: dict[str, Case] = {
    # No command deletes or overwrites what it did not create.
    "average into an existing folder": Case(
        "average_checkpoints", _average(), "already exists", lambda w, t: _folder(t)
    ),
    "average into the run folder itself": Case(
        "average_checkpoints",
        _average("--overwrite", output="run"),
        "holds the checkpoint",
        lambda w, t: w.run,
    ),
    "list the checkpoints of a folder that has none": Case(
        "average_checkpoints",
        lambda w, t: ["--run_dir", str(t / "out"), "--list_checkpoints"],
        "No complete checkpoint-<step> folders",
        lambda w, t: _folder(t),
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
        "train",
        _train("--learning_rate", "-1"),
        "--learning_rate -1.0: must be at least 0",
        lambda w, t: _file(t),
    ),
    "float16 mixed precision on the CPU": Case(
        "train", _train("--fp16"), "--fp16: this run trains on the CPU", lambda w, t: _file(t)
    ),
    "a mixed precision that is not auto, true or false": Case(
        "train",
        _train("--bf16", "maybe"),
        "--bf16 maybe: expected auto, true or false",
        lambda w, t: _file(t),
    ),
    "no micro-batch per step": Case(
        "train",
        _train("--gradient_accumulation_steps", "0"),
        "--gradient_accumulation_steps 0: must be at least 1",
        lambda w, t: _file(t),
    ),
    "label smoothing of more than everything": Case(
        "train",
        _train("--label_smoothing", "1.5"),
        "--label_smoothing 1.5: must be in [0, 1)",
        lambda w, t: _file(t),
    ),
    "a batch size beyond 64 bits": Case(
        "train",
        _train("--max_tokens", "99999999999999999999"),
        "--max_tokens 99999999999999999999: too large",
        lambda w, t: _file(t),
    ),
    # Checkpoints and runs
    "--max_steps 0": Case(
        "train", _train("--max_steps", "0"), "--max_steps 0 trains nothing", lambda w, t: _file(t)
    ),
    "resume when every checkpoint is damaged": Case(
        "train",
        _train("--resume_from_checkpoint", "last", output="damaged"),
        "holds checkpoints (checkpoint-1, checkpoint-2) but none is complete",
        lambda w, t: _damaged_run(w, t),
    ),
    "a learning rate so high that the loss overflows": Case(
        "train",
        _train("--learning_rate", "1e30"),
        "Training step 2 gave a non-finite loss",
        lambda w, t: _file(t),
    ),
    "a learning rate so high that the weights overflow": Case(
        "train",
        _train("--learning_rate", "1e39"),
        "After training step 1 the weights hold",
        lambda w, t: _file(t),
    ),
    # Wording and inputs
    "publish with another model's results": Case(
        "publish", _publish(), "scored other weights (model", lambda w, t: _results(t, w.run)
    ),
    "publish with old results that name another model": Case(
        "publish", _publish(), "scored model", lambda w, t: _results(t, w.run, fingerprint=False)
    ),
    "publish with results that name no model": Case(
        "publish", _publish(), "names no model", lambda w, t: _results(t, None, fingerprint=False)
    ),
    "publish with a results file that is a JSON list": Case(
        "publish", _publish(), "results.json: a JSON list", lambda w, t: _results(t, w.model, shape="list")
    ),
    "publish with results whose decoding is empty": Case(
        "publish", _publish(), "its 'decoding' ({})", lambda w, t: _results(t, w.model, shape="no decoding")
    ),
    "the quick demo with a size flag": Case(
        "demo",
        lambda w, t: ["--quick", "--d_model", "128", "--train_size", "50", "--output_dir", str(t / "out")],
        "would ignore --train_size 50, --d_model 128",
        lambda w, t: _folder(t),
    ),
    "the demo with no training pairs": Case(
        "demo",
        lambda w, t: ["--train_size", "0", "--output_dir", str(t / "out")],
        "--train_size must be at least 1",
        lambda w, t: _folder(t),
    ),
    "the demo with no test pairs": Case(
        "demo",
        lambda w, t: ["--test_size", "0", "--output_dir", str(t / "out")],
        "--test_size must be at least 1",
        lambda w, t: _folder(t),
    ),
    "plot a sentence longer than the model takes": Case(
        "plot",
        lambda w, t: [
            "--model_name_or_path",
            str(w.model),
            "--sentence",
            " ".join(["w1"] * 80),
            "--output_dir",
            str(t),
            "--overwrite",
        ],
        "--sentence: 81 tokens, more than the model's longest input of 64",
        lambda w, t: _file(t, "cross_attention_grid.png"),
    ),
    "convert pickled Marian weights that are not plain tensors": Case(
        "convert",
        lambda w, t: ["--source", str(t / "marian"), "--output_dir", str(t / "out")],
        "use a copy with model.safetensors weights",
        _pickled_marian,
    ),
    "translate with --nbest 0": Case(
        "translate",
        _translate("--overwrite", "--nbest", "0"),
        "--nbest 0: give at least 1",
        lambda w, t: _file(t),
    ),
    "train on data that is not UTF-8": Case(
        "train",
        lambda w, t: _train_argv(t / "bad.tsv", w.model, t / "out"),
        "bad.tsv, line 3: not UTF-8 text",
        lambda w, t: _bad_data(w, t),
    ),
    "evaluate a sentence longer than the model takes": Case(
        "evaluate_bleu",
        lambda w, t: [str(t / "long.tsv") if a == str(w.data) else a for a in _evaluate("--overwrite")(w, t)],
        "long.tsv, line 2: 70 tokens",
        lambda w, t: _long_validation(t),
    ),
    # Numbers, weights and configs
    "ct2: translate with a 300-token tokenizer": Case(
        "translate",
        _with_tokenizer(_translate("--overwrite", model="copy")),
        "the tokenizer's vocabulary has 300 tokens but the model's has 100",
        _ct2_with_tokenizer(296),
    ),
    "ct2: translate with a 500-token tokenizer": Case(
        "translate",
        _with_tokenizer(_translate("--overwrite", model="copy")),
        "the tokenizer's vocabulary has 500 tokens but the model's has 100",
        _ct2_with_tokenizer(496),
    ),
    "ct2: translate with another pad id": Case(
        "translate",
        _with_tokenizer(_translate("--overwrite", model="copy")),
        "pad_token_id is 3 in the tokenizer but 0 in the model",
        _ct2_with_tokenizer(96, pad="<unk>"),
    ),
    "translate with --length_penalty nan": Case(
        "translate",
        _translate("--length_penalty", "nan"),
        "--length_penalty nan: not a finite number",
        lambda w, t: _file(t, "other.txt"),
    ),
    "translate with --length_penalty inf": Case(
        "translate",
        _translate("--overwrite", "--length_penalty", "inf"),
        "--length_penalty inf: not a finite",
        lambda w, t: _file(t),
    ),
    "evaluate with --length_penalty -inf": Case(
        "evaluate_bleu",
        _evaluate("--length_penalty=-inf"),
        "--length_penalty -inf: not a finite number",
        lambda w, t: _file(t, "other.txt"),
    ),
    "train with --learning_rate inf": Case(
        "train",
        _train("--learning_rate", "inf"),
        "--learning_rate inf: not a finite number",
        lambda w, t: _file(t),
    ),
    "train with --label_smoothing nan": Case(
        "train",
        _train("--label_smoothing", "nan"),
        "--label_smoothing nan: not a finite number",
        lambda w, t: _file(t),
    ),
    "the demo with --learning_rate inf": Case(
        "demo",
        lambda w, t: ["--quick", "--output_dir", str(t / "out"), "--learning_rate", "inf"],
        "--learning_rate inf: not a finite number",
        lambda w, t: _file(t),
    ),
    "translate a model with NaN weights": Case(
        "translate",
        _translate("--overwrite", model="copy"),
        "holds weights that are not finite numbers (NaN or inf) in 2 tensor(s): model.decoder.layers.1.fc2.bias, "
        "model.encoder.layers.0.fc1.weight",
        _nan_weights,
    ),
    "evaluate a model with NaN weights": Case(
        "evaluate_bleu", _evaluate_copy(), "holds weights that are not finite", _nan_weights
    ),
    "publish a model with NaN weights": Case(
        "publish",
        lambda w, t: [
            "--model_name_or_path",
            str(t / "model"),
            "--output_dir",
            str(t / "out"),
            "--overwrite",
            "--results_files",
            str(t / "validation.results.json"),
            *CARD_ARGS,
        ],
        "holds weights that are not finite",
        lambda w, t: (_nan_weights(w, t), _results(t, t / "model"))[
            0
        ],  # scores of that model: its weights fail
    ),
    "plot the attention of a model with NaN weights": Case(
        "plot",
        lambda w, t: [
            "--model_name_or_path",
            str(t / "model"),
            "--sentence",
            "w1 w2",
            "--output_dir",
            str(t / "out"),
        ],
        "holds weights that are not finite",
        _nan_weights,
    ),
    "export to CTranslate2 from a missing folder": Case(
        "export_ctranslate2",
        lambda w, t: ["--model_dir", "runs/no/such/model", "--output_dir", str(t / "out")],
        "--model_dir 'runs/no/such/model': no such folder",
        lambda w, t: _file(t, "other.txt"),
    ),
    "export to ONNX from a missing folder": Case(
        "export_onnx",
        lambda w, t: ["--model_dir", "runs/no/such/model", "--output_dir", str(t / "out")],
        "--model_dir 'runs/no/such/model': no such folder",
        lambda w, t: _file(t, "other.txt"),
    ),
    "export to ONNX from a CTranslate2 export": Case(
        "export_onnx",
        lambda w, t: ["--model_dir", str(t / "model"), "--output_dir", str(t / "out")],
        "is a CTranslate2 export (model.bin), not a transformers model folder",
        _ct2_export,
    ),
    "export a model with NaN weights to CTranslate2": Case(
        "export_ctranslate2",
        lambda w, t: ["--model_dir", str(t / "model"), "--output_dir", str(t / "out")],
        "holds weights that are not finite",
        lambda w, t: (pytest.importorskip("ctranslate2"), _nan_weights(w, t))[1],
    ),
    "export a model with NaN weights to ONNX": Case(
        "export_onnx",
        lambda w, t: ["--model_dir", str(t / "model"), "--output_dir", str(t / "out")],
        "holds weights that are not finite",
        _nan_weights,
    ),
    "average a checkpoint with NaN weights": Case(
        "average_checkpoints",
        _average_argv,
        "ckpt' holds weights that are not finite",
        lambda w, t: _average_copies(w, t, _nan_weights),
    ),
    "fine-tune a model with NaN weights": Case(
        "train", _fine_tune_copy, "holds weights that are not finite", _nan_weights
    ),
    "translate with tie_word_embeddings false": Case(
        "translate",
        _translate("--overwrite", model="copy"),
        "its config.json disagrees with its weights (1 key(s) missing from the weights: lm_head.weight)",
        lambda w, t: _edited_config(w, t, tie_word_embeddings=False),
    ),
    "translate a 2-layer checkpoint with decoder_layers 1": Case(
        "translate",
        _translate("--overwrite", model="copy"),
        "18 key(s) in the weights but not in the model: model.decoder.layers.1.",
        lambda w, t: _edited_config(w, t, decoder_layers=1),
    ),
    "translate with decoder_layers 3": Case(
        "translate",
        _translate("--overwrite", model="copy"),
        "18 key(s) missing from the weights",
        lambda w, t: _edited_config(w, t, decoder_layers=3),
    ),
    "translate with another encoder_ffn_dim": Case(
        "translate",
        _translate("--overwrite", model="copy"),
        "6 key(s) of another shape in the weights than in the model: model.encoder.layers.0.fc1.bias ((64,) vs (128,))",
        lambda w, t: _edited_config(w, t, encoder_ffn_dim=128),
    ),
    "evaluate with tie_word_embeddings false": Case(
        "evaluate_bleu",
        _evaluate_copy(),
        "missing from the weights: lm_head.weight",
        lambda w, t: _edited_config(w, t, tie_word_embeddings=False),
    ),
    "export to CTranslate2 with decoder_layers 1": Case(
        "export_ctranslate2",
        lambda w, t: ["--model_dir", str(t / "model"), "--output_dir", str(t / "out")],
        "in the weights but not in the model",
        lambda w, t: (pytest.importorskip("ctranslate2"), _edited_config(w, t, decoder_layers=1))[1],
    ),
    "average a checkpoint whose config disagrees": Case(
        "average_checkpoints",
        _average_argv,
        "config.json' contradicts the weights it was saved with (tie_word_embeddings is false, recorded true in "
        "architecture.json)",
        lambda w, t: _average_copies(w, t, functools.partial(_edited_config, tie_word_embeddings=False)),
    ),
    "fine-tune a model whose config disagrees": Case(
        "train",
        _fine_tune_copy,
        "missing from the weights: lm_head.weight",
        lambda w, t: _edited_config(w, t, tie_word_embeddings=False),
    ),
    # Outputs and --overwrite
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
    # What a model folder records, and the JSON files a command reads
    "translate with a flipped bit in a training run's final model": Case(
        "translate",
        _translate("--overwrite", model="copy"),
        "model.safetensors' is damaged: its sha256 differs from the one recorded in checksums.sha256",
        lambda w, t: _run_model(w, t, lambda m: _flip_a_bit(m / "model.safetensors")),
    ),
    "translate with a run's tokenizer.json that lost tokens but is still JSON": Case(
        "translate",
        _translate("--overwrite", model="copy"),
        "tokenizer.json' is damaged: its sha256 differs from the one recorded in checksums.sha256",
        lambda w, t: _run_model(w, t, lambda m: _halve_vocabulary(m / "tokenizer.json")),
    ),
    "translate with scale_embedding edited in a run's config.json": Case(
        "translate",
        _translate("--overwrite", model="copy"),
        "config.json' contradicts the weights it was saved with (scale_embedding is false, recorded true",
        lambda w, t: _run_model(w, t, lambda m: _edit_json(m / "config.json", scale_embedding=False)),
    ),
    "translate with a config.json without model_type": Case(
        "translate",
        _translate("--overwrite", model="copy"),
        "config.json' has no model_type",
        lambda w, t: _damaged_copy(
            w, t, "config.json", lambda c: {k: v for k, v in c.items() if k != "model_type"}
        ),
    ),
    "translate with a tokenizer.json that is JSON but not a tokenizer": Case(
        "translate",
        _translate("--overwrite", model="copy"),
        "tokenizer.json' is damaged: it is JSON but not a tokenizer",
        lambda w, t: _damaged_copy(w, t, "tokenizer.json", lambda c: {"model": {"type": "BPE", "vocab": 7}}),
    ),
    "translate with a tokenizer.json that is a JSON list": Case(
        "translate",
        _translate("--overwrite", model="copy"),
        "tokenizer.json' is damaged: it holds a JSON list",
        lambda w, t: _damaged_copy(w, t, "tokenizer.json", lambda c: [c]),
    ),
    "translate with a tokenizer_config.json that is a JSON list": Case(
        "translate",
        _translate("--overwrite", model="copy"),
        "tokenizer_config.json' is damaged: it holds a JSON list",
        lambda w, t: _damaged_copy(w, t, "tokenizer_config.json", lambda c: [c]),
    ),
    "translate with a generation_config.json that is a JSON number": Case(
        "translate",
        _translate("--overwrite", model="copy"),
        "generation_config.json' is damaged: it holds a JSON int",
        lambda w, t: _damaged_copy(w, t, "generation_config.json", lambda c: 4),
    ),
    "plot a run whose trainer_state.json is a JSON list": Case(
        "plot",
        lambda w, t: ["--training_run", str(t / "run"), "--output_dir", str(t), "--overwrite"],
        "trainer_state.json' is damaged: it holds a JSON list",
        lambda w, t: (_list_state(w, t), _file(t, "training_curves.png"))[1],
    ),
    "translate with a CTranslate2 export whose generation_config.json is a JSON list": Case(
        "translate",
        _translate("--overwrite", model="copy"),
        "generation_config.json' is damaged: it holds a JSON list",
        lambda w, t: _damaged_export(w, t, "generation_config.json"),
    ),
    "convert a source whose config.json is a JSON list": Case(
        "convert",
        lambda w, t: ["--source", str(t / "model"), "--output_dir", str(t / "out")],
        "config.json' is damaged: it holds a JSON list",
        lambda w, t: _damaged_copy(w, t, "config.json", lambda c: [c]),
    ),
    "convert a source whose config.json has no model_type": Case(
        "convert",
        lambda w, t: ["--source", str(t / "model"), "--output_dir", str(t / "out")],
        "config.json' has no model_type",
        lambda w, t: _damaged_copy(
            w, t, "config.json", lambda c: {k: v for k, v in c.items() if k != "model_type"}
        ),
    ),
    "translate with a config.json that is not JSON": Case(
        "translate",
        _translate("--overwrite", model="copy"),
        "config.json' is damaged: it is not JSON",
        lambda w, t: _damaged_copy(w, t, "config.json", lambda c: None, text='{"d_model": 3'),
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


#: Every number option of hf-vanilla-train with values it cannot honour (zero, negative, out of range,
#: beyond 64 bits).
UNHONOURED_NUMBERS = {
    "per_device_train_batch_size": ["0", "-1", "99999999999999999999"],
    "per_device_eval_batch_size": ["0"],
    "gradient_accumulation_steps": ["0", "-1"],
    "eval_accumulation_steps": ["0"],
    "max_steps": ["-5"],
    "num_train_epochs": ["0"],
    "warmup_steps": ["-1"],
    "save_steps": ["0", "-1"],
    "eval_steps": ["0"],
    "logging_steps": ["0", "-1"],
    "save_total_limit": ["0", "-1"],
    "dataloader_num_workers": ["-1"],
    "generation_max_length": ["0"],
    "generation_num_beams": ["0"],
    "max_grad_norm": ["-1"],
    "adam_beta1": ["1", "-0.1"],
    "adam_beta2": ["1.5"],
    "adam_epsilon": ["0"],
    "weight_decay": ["-1"],
    "max_tokens": ["-1", "99999999999999999999"],
    "seed": ["-1"],
    "label_smoothing": ["1", "-0.1"],
    "dropout": ["1"],
    "init_std": ["0"],
    "d_model": ["0"],
    "layers": ["0"],
    "attention_heads": ["-1"],
    "ffn_dim": ["0"],
    "tokenizer_vocab_size": ["0"],
    "max_source_length": ["0"],
    "max_target_length": ["-1"],
    "average_last_n_checkpoints": ["-1"],
    "demo_train_size": ["-1"],
    "max_train_samples": ["-1"],
    "max_eval_samples": ["-1"],
}


@pytest.mark.parametrize(
    ("flag", "value"), [(flag, value) for flag, values in UNHONOURED_NUMBERS.items() for value in values]
)
def test_a_number_a_training_run_cannot_honour_is_one_line_naming_the_flag(
    flag: str, value: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    tiny = ["--demo", "--demo_train_size", "8", "--demo_validation_size", "2", "--demo_test_size", "0",
            "--tokenizer_vocab_size", "60", "--d_model", "16", "--layers", "1", "--attention_heads", "2",
            "--ffn_dim", "16", "--max_steps", "1", "--eval_strategy", "no", "--do_eval", "false",
            "--save_strategy", "no", "--report_to", "none", "--use_cpu"]  # fmt: skip
    status = script_main("train")([*tiny, "--output_dir", str(out), f"--{flag}", value])
    err = capsys.readouterr().err
    assert status == 1, err[-2000:]
    assert err.strip().splitlines()[-1].startswith(f"error: --{flag} "), err[-2000:]
    assert "Traceback" not in err
    assert not out.exists()  # refused before any work


# --------------------------------------------------------------------------------------------------
# Library calls that must raise ValueError saying what is wrong
# --------------------------------------------------------------------------------------------------
def _app() -> Any:
    """:mod:`hf_vanilla.demo.app`, imported when a case needs it (it imports gradio)."""
    import hf_vanilla.demo.app

    return hf_vanilla.demo.app


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
        lambda: translate(tiny_model(), word_tokenizer(50), ["w1 w2"], device="cpu"),
        "has 54 tokens but the model's has 100",
    ),
    "translate() with a larger tokenizer": (
        lambda: translate(tiny_model(), word_tokenizer(200), ["w1 w2"], device="cpu"),
        "has 204 tokens but the model's has 100",
    ),
    "translate() with another eos id": (
        lambda: translate(tiny_model(eos_token_id=3), word_tokenizer(), ["w1 w2"], device="cpu"),
        "eos_token_id is 2 in the tokenizer but 3 in the model",
    ),
    # Wording and inputs
    "translate() with num_return_sequences=2": (
        lambda: translate(
            tiny_model(),
            word_tokenizer(),
            ["w1 w2", "w3"],
            device="cpu",
            generate_kwargs={"num_return_sequences": 2},
        ),
        "num_return_sequences=2: translation keeps one hypothesis per sentence; for the 2 best, pass nbest=2",
    ),
    "the web demo with a sentence longer than the model takes": (
        lambda: _app().translate_with_attention(tiny_model(), word_tokenizer(), " ".join(["w1"] * 80)),
        "The typed sentence: 81 tokens, more than the model's longest input of 64",
    ),
    "translate_nbest() with nbest=0": (
        lambda: translate_nbest(tiny_model(), word_tokenizer(), ["w1"], device="cpu", nbest=0),
        "--nbest 0: give at least 1",
    ),
    # Numbers, weights and configs
    "translate() with a NaN length penalty": (
        lambda: translate(
            tiny_model(), word_tokenizer(), ["w1"], DecodingOptions(length_penalty=float("nan"))
        ),
        "`length_penalty` is nan, not a finite number",
    ),
    "translate() with an infinite generate() option": (
        lambda: translate(
            tiny_model(), word_tokenizer(), ["w1"], generate_kwargs={"repetition_penalty": float("inf")}
        ),
        "`repetition_penalty` is inf, not a finite number",
    ),
    "translate() with a length penalty set to inf after checking": (
        lambda: translate(
            tiny_model(), word_tokenizer(), ["w1"], _set(DecodingOptions(), length_penalty=float("-inf"))
        ),
        "`length_penalty` is -inf",
    ),
    "generate_ids() with a NaN generate() option": (
        lambda: generate_ids(
            tiny_model(), torch.tensor([[5, 2]]), torch.ones(1, 2, dtype=torch.long), temperature=float("nan")
        ),
        "`temperature` is nan",
    ),
}


def _set(options: DecodingOptions, **values: Any) -> DecodingOptions:
    for name, value in values.items():
        setattr(options, name, value)
    return options


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
    model, tokenizer = tiny_model(), word_tokenizer()
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
    model, tokenizer = tiny_model(), word_tokenizer()
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
        with pytest.raises(ValueError, match="Out of memory translating a batch"):  # one line, in a command
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
    args = TrainingModelArguments(model_name_or_path=str(world.model), dropout=0.3)
    with caplog.at_level(logging.WARNING, logger="hf_vanilla"):
        model = build_model(args, word_tokenizer())
    assert model.config.dropout == 0.3
    assert {m.p for m in model.modules() if isinstance(m, torch.nn.Dropout)} == {
        0.3,
        0.0,
    }  # 0: activation_dropout
    assert "with --dropout 0.3 instead of its dropout 0.1" in caplog.text
    same = build_model(
        TrainingModelArguments(model_name_or_path=str(world.model), d_model=32, layers=2), word_tokenizer()
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
        PaperSeq2SeqTrainer(model=tiny_model(), args=args, processing_class=word_tokenizer())
    assert "--learning_rate is 0: training will not change the weights" in caplog.text


# --------------------------------------------------------------------------------------------------
# Real processes: no traceback for a user error; --debug shows it
# --------------------------------------------------------------------------------------------------
@pytest.mark.slow  # two real processes importing the whole stack
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


class _Writes(io.RawIOBase):
    """A raw stream that records each ``write`` call, as the operating system would see it."""

    def __init__(self) -> None:
        self.calls: list[bytes] = []

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        self.calls.append(bytes(data))
        return len(data)


def test_error_line_is_one_write(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every process of a distributed run prints the same ``error:`` line to one log: each must be a single
    write, or the lines interleave (``error:error: ...``) and the one-line contract breaks."""
    raw = _Writes()
    # As Python sets up a redirected stderr: a text layer writing straight through to the file.
    stderr = io.TextIOWrapper(raw, encoding="utf-8", write_through=True)
    monkeypatch.setattr(sys, "stderr", stderr)

    def fails(args: list[str]) -> None:
        raise ValueError("FSDP was asked for,\n  but this run would train plain DDP")

    assert run_cli(fails, [], debug_flag=False) == 1
    assert raw.calls == [b"error: FSDP was asked for, but this run would train plain DDP\n"]


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

    monkeypatch.setattr("hf_vanilla.training.run.load_from_args", load_from_args)
    argv = _train_argv(world.data, world.model, run, *(str(world.data) if a == "DATA" else a for a in extra))
    if "--demo" in extra:
        argv = [a for a in argv if a not in ("--train_files", str(world.data))]
    status = script_main("train")(argv)
    err = capsys.readouterr().err.strip().splitlines()
    errors = [line for line in err if line.startswith("error: ")]
    assert status == 1 and errors == [err[-1]] and message in err[-1], err[-5:]
    assert (_snapshot(run) if run.exists() else None) == before  # nothing written: no checkpoint, no folder


# --------------------------------------------------------------------------------------------------
# Checkpoints and runs
# --------------------------------------------------------------------------------------------------
def test_checkpoints_are_kept_resumed_and_averaged_by_step_not_file_time(
    world: World, tmp_path: Path
) -> None:
    """A checkpoint touched after training (an evaluation an hour later) is still the oldest by step:
    rotation deletes it, and averaging takes the newest by step."""
    run = Path(shutil.copytree(world.run, tmp_path / "run"))
    hour_ago = run.stat().st_mtime - 3600
    os.utime(run / "checkpoint-2", (hour_ago, hour_ago))  # written first ...
    (run / "checkpoint-1" / "notes.txt").write_text("read later\n", encoding="utf-8")  # ... touched last
    argv = _train_argv(world.data, world.model, run, "--resume_from_checkpoint", "last", "--max_steps", "4",
                       "--save_total_limit", "3", "--average_last_n_checkpoints", "3")  # fmt: skip
    assert script_main("train")(argv) == 0
    assert sorted(p.name for p in run.glob("checkpoint-*")) == [
        "checkpoint-2",
        "checkpoint-3",
        "checkpoint-4",
    ]
    averaged = json.loads((run / "averaged" / "averaged_checkpoints.json").read_text(encoding="utf-8"))
    assert [Path(p).name for p in averaged["averaged_checkpoints"]] == [
        "checkpoint-2",
        "checkpoint-3",
        "checkpoint-4",
    ]


def test_rotation_orders_by_step_whatever_the_file_times(tmp_path: Path) -> None:
    from hf_vanilla.training.checkpoints import rotate_checkpoints_by_step

    for step, age in ((10, 0), (15, 3000), (20, 2000), (25, 1000), (30, 500)):  # checkpoint-10 touched last
        folder = tmp_path / f"checkpoint-{step}"
        tiny_model().save_pretrained(folder)
        (folder / "trainer_state.json").write_text(json.dumps({"global_step": step}), encoding="utf-8")
        os.utime(folder, (folder.stat().st_mtime - age,) * 2)
    deleted = rotate_checkpoints_by_step(tmp_path, 3)
    assert [p.name for p in deleted] == ["checkpoint-10", "checkpoint-15"]
    assert [p.name for p in find_complete_checkpoints(tmp_path)] == [
        "checkpoint-20",
        "checkpoint-25",
        "checkpoint-30",
    ]


def test_evaluating_a_checkpoint_writes_beside_it_not_into_it(
    world: World, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = Path(shutil.copytree(world.run, tmp_path / "run"))
    before = _snapshot(run / "checkpoint-1")
    argv = ["--model_name_or_path", str(run / "checkpoint-1"), "--validation_files", str(world.data),
            "--source_lang", "en", "--target_lang", "de", "--device", "cpu", "--max_eval_samples", "2"]  # fmt: skip
    assert script_main("evaluate_bleu")(argv) == 0, capsys.readouterr().err[-2000:]
    assert _snapshot(run / "checkpoint-1") == before
    assert (run / "eval-checkpoint-1" / "validation.results.json").is_file()
    with pytest.raises(SystemExit):
        script_main("evaluate_bleu")(["--help"])
    assert "RUN/eval-checkpoint-<step>" in capsys.readouterr().out  # the default is stated in --help


def test_a_second_run_into_a_folder_in_use_is_refused_in_one_line(
    world: World, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The test holds the lock a live run holds (flock on the folder), then starts a second run."""
    out = tmp_path / "out"
    out.mkdir()
    fd = os.open(out, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        status = script_main("train")(_train_argv(world.data, world.model, out, "--seed", "2"))
    finally:
        os.close(fd)
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 1 and err[-1].startswith("error: ") and "in use by another training run" in err[-1], err[
        -5:
    ]
    assert list(out.iterdir()) == []  # the second run wrote nothing


@pytest.mark.slow  # a real process importing the whole stack
def test_a_killed_run_does_not_leave_its_folder_locked(world: World, tmp_path: Path) -> None:
    from hf_vanilla.training.checkpoints import RunInUseError, hold_run_dir

    out = tmp_path / "out"
    holder = subprocess.Popen(  # holds the folder as a training run does, says so, then waits to be killed
        [sys.executable, "-c", "import sys; from hf_vanilla.training.checkpoints import hold_run_dir\n"
         f"with hold_run_dir({str(out)!r}):\n    print('held', flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        with pytest.raises(RunInUseError, match="in use by another training run"), hold_run_dir(out):
            pass
    finally:
        holder.kill()  # SIGKILL: no handler, no cleanup
        holder.wait(timeout=60)
    assert script_main("train")(_train_argv(world.data, world.model, out)) == 0


def test_a_non_finite_step_stops_before_the_save_on_sigterm(world: World, tmp_path: Path) -> None:
    """A NaN loss at step 2 and SIGTERM at the same step: the run stops naming step 2, and neither the
    signal's checkpoint nor any later one is written; checkpoint-1 is kept."""
    from hf_vanilla.training.resilience import NonFiniteTrainingError

    tokenizer = word_tokenizer()
    data = load_local_files({"train": [str(world.data)]}, "en", "de")
    train_set = tokenize_translations(data, tokenizer, "en", "de")["train"]
    args = PaperTrainingArguments(output_dir=str(tmp_path / "out"), max_steps=4, warmup_steps=1, learning_rate=1e-3,
                                  max_tokens=None, per_device_train_batch_size=4, save_steps=1, eval_strategy="no",
                                  do_eval=False, logging_steps=100, report_to="none", disable_tqdm=True, use_cpu=True)  # fmt: skip
    model = tiny_model()
    signal_callback = SaveOnSignalCallback(exit_fn=lambda status: None)
    trainer = PaperSeq2SeqTrainer(model=model, args=args, train_dataset=train_set, processing_class=tokenizer,
                                  data_collator=DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=-100),
                                  callbacks=[signal_callback])  # fmt: skip

    def poison(module: torch.nn.Module, inputs: Any, output: Any) -> Any:
        if trainer.state.global_step == 1:  # computing step 2
            output.loss = output.loss * float("nan")
            signal_callback.received = signal.SIGTERM
        return output

    model.register_forward_hook(poison)
    with pytest.raises(NonFiniteTrainingError, match=r"Training step 2 gave a non-finite loss.*checkpoint-1"):
        trainer.train()
    assert sorted(p.name for p in (tmp_path / "out").glob("checkpoint-*")) == ["checkpoint-1"]


def test_a_diverging_run_keeps_the_last_good_checkpoint_and_saves_nothing_non_finite(
    world: World, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    status = script_main("train")(
        _train_argv(world.data, world.model, out, "--learning_rate", "1e30", "--max_steps", "3")
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 1 and "Training step 2 gave a non-finite loss" in err[-1], err[-5:]
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-1"]
    assert not (out / "model.safetensors").exists()  # no final model
    for weights in out.rglob("*.safetensors"):
        assert all(torch.isfinite(t).all() for t in load_file(weights).values()), weights


# Wording and inputs
# --------------------------------------------------------------------------------------------------
BOM = "\ufeff".encode()


def test_publish_takes_results_of_the_same_weights_wherever_the_folder_is(
    world: World, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The weights fingerprint identifies the model: results of a copy of the folder are its own;
    an older results file without a fingerprint is accepted for the same folder path."""
    copy = _copy_model(world, tmp_path)
    _results(tmp_path, copy)
    assert script_main("publish")(_publish()(world, tmp_path)) == 0
    card = (tmp_path / "out" / "README.md").read_text(encoding="utf-8")
    assert "BLEU **1.00**" in card
    _results(tmp_path, world.model, fingerprint=False)
    with caplog.at_level(logging.WARNING, logger="hf_vanilla"):
        assert script_main("publish")([*_publish()(world, tmp_path), "--overwrite"]) == 0
    assert "checked by path only" in caplog.text


def test_a_byte_order_mark_is_dropped_from_every_text_input(
    world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, tokenizer = tiny_model(), word_tokenizer()
    text = "w5 w6\nw7\n"
    (tmp_path / "plain.txt").write_text(text, encoding="utf-8")
    (tmp_path / "bom.txt").write_bytes(BOM + text.encode())
    for name in ("plain", "bom"):
        translate_stream(model, tokenizer, tmp_path / f"{name}.txt", tmp_path / f"{name}.out", device="cpu",
                         generate_kwargs={"max_new_tokens": 3})  # fmt: skip
    expected = (tmp_path / "plain.out").read_text(encoding="utf-8")
    assert (tmp_path / "bom.out").read_text(encoding="utf-8") == expected
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(BOM + text.encode()), encoding="utf-8"))
    translate_stream(
        model, tokenizer, "-", tmp_path / "stdin.out", device="cpu", generate_kwargs={"max_new_tokens": 3}
    )
    assert (tmp_path / "stdin.out").read_text(encoding="utf-8") == expected
    # training, evaluation and tokenizer data: every local form
    (tmp_path / "d.tsv").write_bytes(BOM + b"w1 w2\tw2 w1\n")
    (tmp_path / "d.en").write_bytes(BOM + b"w1 w2\n")
    (tmp_path / "d.de").write_bytes(BOM + b"w2 w1\n")
    (tmp_path / "d.jsonl").write_bytes(BOM + b'{"translation": {"en": "w1 w2", "de": "w2 w1"}}\n')
    for files in (["d.tsv"], ["d.en", "d.de"], ["d"], ["d.jsonl"]):
        assert read_split_files([str(tmp_path / f) for f in files], "en", "de") == (["w1 w2"], ["w2 w1"])


def test_a_bare_string_is_one_sentence() -> None:
    """``translate(model, tokenizer, "w1 w2")`` translates one sentence and returns one string;
    ``translate_nbest`` returns that sentence's hypotheses."""
    model, tokenizer = tiny_model(), word_tokenizer()
    kwargs = {"device": "cpu", "generate_kwargs": {"max_new_tokens": 3}}
    assert (
        translate(model, tokenizer, "w1 w2", **kwargs) == translate(model, tokenizer, ["w1 w2"], **kwargs)[0]
    )
    nbest = translate_nbest(model, tokenizer, "w1 w2", nbest=2, **kwargs)
    assert nbest == translate_nbest(model, tokenizer, ["w1 w2"], nbest=2, **kwargs)[0] and len(nbest) == 2


def test_a_damaged_ctranslate2_model_is_one_line_naming_the_file(
    world: World, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("ctranslate2")
    from hf_vanilla.interop.export_ctranslate2 import export_ctranslate2

    export_ctranslate2(world.model, tmp_path / "ct2")
    weights = tmp_path / "ct2" / "model.bin"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    (tmp_path / "ct2" / "checksums.sha256").unlink()  # an export without a manifest: CTranslate2 finds it
    argv = [
        "--model_name_or_path",
        str(tmp_path / "ct2"),
        "--input_file",
        str(world.source),
        "--device",
        "cpu",
    ]
    assert script_main("translate")(argv) == 1
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert (
        last.startswith(f"error: {weights}: CTranslate2 cannot load it") and "hf-vanilla-export-ct2" in last
    )


# --------------------------------------------------------------------------------------------------
# Numbers, weights and configs
# --------------------------------------------------------------------------------------------------
def test_a_ctranslate2_model_is_checked_against_its_tokenizer_like_a_transformers_one(
    world: World, tmp_path: Path
) -> None:
    pytest.importorskip("ctranslate2")
    from hf_vanilla.inference.ctranslate2 import CTranslate2Model

    ct2 = CTranslate2Model(_ct2_export(world, tmp_path), torch.device("cpu"))
    hf = tiny_model()
    for tokenizer, message in (
        (word_tokenizer(296), "has 300 tokens but the model's has 100"),
        (word_tokenizer(96), None),
    ):
        if message is None:
            assert translate(ct2, tokenizer, ["w1 w2"], generate_kwargs={"max_new_tokens": 2}) != [""]
            continue
        errors = []
        for model in (hf, ct2):
            with pytest.raises(ValueError, match=message) as error:
                translate(model, tokenizer, ["w1 w2"], device="cpu")
            errors.append(str(error.value))
        assert errors[0] == errors[1]  # one check, one message, whatever the backend


def test_the_app_and_convert_refuse_nan_weights(world: World, tmp_path: Path) -> None:
    from transformers import MarianConfig, MarianMTModel

    from hf_vanilla.interop.convert import load_source_model

    sizes = {"d_model": 16, "encoder_layers": 1, "decoder_layers": 1, "encoder_attention_heads": 2,
             "decoder_attention_heads": 2, "encoder_ffn_dim": 32, "decoder_ffn_dim": 32, "vocab_size": 40,
             "pad_token_id": 39, "decoder_start_token_id": 39, "eos_token_id": 0}  # fmt: skip
    MarianMTModel(MarianConfig(**sizes)).save_pretrained(tmp_path / "marian")
    model, _ = load_source_model(tmp_path / "marian")  # a whole Marian folder loads: what is not saved passes
    saved = load_file(str(tmp_path / "marian" / "model.safetensors"))
    assert {"lm_head.weight", "model.encoder.embed_positions.weight"} <= set(model.state_dict()) - set(saved)
    with pytest.raises(ValueError, match="marian-nan' holds weights that are not finite"):
        load_source_model(_nan_weights(world, tmp_path, source=tmp_path / "marian", name="marian-nan"))
    pytest.importorskip("gradio")
    from hf_vanilla.demo.app import load_for_demo

    with pytest.raises(ValueError, match="holds weights that are not finite"):
        load_for_demo(_nan_weights(world, tmp_path))
    with pytest.raises(ValueError, match=r"missing from the weights: lm_head\.weight"):
        load_for_demo(_edited_config(world, tmp_path, name="untied", tie_word_embeddings=False))


def test_a_tied_head_passes_and_the_python_api_keeps_transformers_behaviour(
    world: World, tmp_path: Path
) -> None:
    from transformers import AutoModelForSeq2SeqLM

    from hf_vanilla.io.checked_loading import load_pretrained_checked

    model = load_pretrained_checked(world.model)  # lm_head is tied to the shared embedding, not saved
    saved = load_file(str(world.model / "model.safetensors"))
    assert "lm_head.weight" not in saved and model.lm_head.weight is model.model.shared.weight
    untied = _edited_config(world, tmp_path, tie_word_embeddings=False)
    _, info = AutoModelForSeq2SeqLM.from_pretrained(untied, output_loading_info=True)
    assert info["missing_keys"] == {"lm_head.weight"}  # transformers reports it and loads: unchanged
    assert not torch.isfinite(
        AutoModelForSeq2SeqLM.from_pretrained(_nan_weights(world, tmp_path, name="nan"))
        .model.encoder.layers[0]
        .fc1.weight
    ).all()


# --------------------------------------------------------------------------------------------------
# Outputs, --overwrite and interrupted commands
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
    with fed_pipes(tmp_path, ("w1 w2\nw3\n", "w2 w1\nw3\n")) as pipes:
        assert read_split_files([str(p) for p in pipes], "en", "de") == (["w1 w2", "w3"], ["w2 w1", "w3"])
    with pytest.raises(FileNotFoundError, match="does not exist"):
        read_split_files([str(tmp_path / "missing.en"), str(tmp_path / "missing.de")], "en", "de")


_FOLDER_WRITE_KILLED = """
import os, signal, sys
from pathlib import Path
from hf_vanilla.cli import run_cli
from hf_vanilla.io.atomic import atomic_directory, atomic_file

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


@pytest.mark.slow  # a real process importing the whole stack
def test_sigterm_during_translation_leaves_the_folder_as_it_was(world: World, tmp_path: Path) -> None:
    """SIGTERM while ``--output_file`` is being written (stdin kept open, so the command is mid-way):
    the old output stays, the temporary file goes, and the command ends in one line, status 143."""
    _file(tmp_path)
    before = _snapshot(tmp_path)
    command = [sys.executable, str(ROOT / "scripts" / "translate.py"), "--model_name_or_path", str(world.model),
               "--output_file", str(tmp_path / "out.txt"), "--overwrite", "--device", "cpu"]  # fmt: skip
    process = subprocess.Popen(
        command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        cwd=tmp_path.parent,
    )  # fmt: skip
    output = Outputs(process)
    try:
        process.stdin.write("w1 w2 w3\n")
        process.stdin.flush()
        # The first line is translated into the staged file:
        output.wait_for(r" INFO hf_vanilla\S+: Lines translated so far: 1 ", timeout=300)
        assert len(list(tmp_path.glob(".out.txt.tmp-*"))) == 1
        process.send_signal(signal.SIGTERM)
        err = output.closed(process, timeout=120)
        process.wait(timeout=120)
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
