"""What commands write: never over an output that appeared while they ran, never a traceback on a full
disk, and numbers they cannot honour refused in one line naming the flag."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import tiny_model, word_tokenizer

from hf_vanilla.hub.folder import save_model_folder

THEIRS = "written by another command\n"

REMOVED = "and the partial temporary copy was removed"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("outputs") / "model"
    save_model_folder(tiny_model(), word_tokenizer(), path)
    return path


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _appearing(create: Callable[[], None], function: Callable[..., Any]) -> Callable[..., Any]:
    """``function``, after ``create()`` on its first call: another command writes the output meanwhile."""
    calls = []

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        if not calls:
            create()
        calls.append(1)
        return function(*args, **kwargs)

    return wrapped


# --------------------------------------------------------------------------------------------------
# An output that appears while the command runs
# --------------------------------------------------------------------------------------------------
def test_a_file_that_appears_during_translation_is_not_replaced(
    model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two translations to one ``--output_file``: the one that finishes second exits 1 in one line, the
    other's file stays, and its own result is kept beside it under the name the line gives."""
    import hf_vanilla.inference.streaming as streaming
    from hf_vanilla.cli.translate import main

    (tmp_path / "in.txt").write_text("w1 w2\nw3\n", encoding="utf-8")
    out = tmp_path / "out.txt"
    monkeypatch.setattr(
        streaming, "translate_nbest", _appearing(lambda: out.write_text(THEIRS), streaming.translate_nbest)
    )
    argv = ["--model_name_or_path", str(model_dir), "--device", "cpu", "--num_beams", "1", "--max_length", "3",
            "--input_file", str(tmp_path / "in.txt"), "--output_file", str(out)]  # fmt: skip
    assert main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert out.read_text() == THEIRS
    (kept,) = tmp_path.glob("out.txt.new-*")
    assert err[-1] == (
        f"error: --output_file {str(out)!r} appeared while this command ran (another command wrote it?) and was "
        f"left as it is; this command's result was kept as {str(kept)!r}. Move one of them away, or run again "
        "with --overwrite to replace it."
    )
    assert len(kept.read_text().splitlines()) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["in.txt", kept.name, "out.txt"])
    out.unlink()
    out_with_overwrite = [*argv, "--overwrite"]  # asked for: replaced, as before
    monkeypatch.setattr(
        streaming, "translate_nbest", _appearing(lambda: out.write_text(THEIRS), streaming.translate_nbest)
    )
    assert main(out_with_overwrite) == 0
    assert out.read_text() == kept.read_text()


def test_a_folder_that_appears_during_an_export_is_not_replaced(
    model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A folder with files that appears at ``--output_dir`` while the export runs stays as it is; an
    empty folder that appears counts as nothing (it is replaced), as an empty folder does at the start."""
    pytest.importorskip("ctranslate2")
    import hf_vanilla.interop.export_ctranslate2 as export
    from hf_vanilla.cli.export_ctranslate2 import main

    out = tmp_path / "ct2"

    def theirs() -> None:
        out.mkdir()
        (out / "model.bin").write_text(THEIRS)

    original = export.limit_tokenizer_length
    monkeypatch.setattr(export, "limit_tokenizer_length", _appearing(theirs, original))
    assert main(["--model_dir", str(model_dir), "--output_dir", str(out)]) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(f"error: --output_dir {str(out)!r} appeared while this command ran"), err
    assert _files(out) == {"model.bin": THEIRS.encode()}
    (kept,) = tmp_path.glob("ct2.new-*")
    assert (kept / "model.bin").stat().st_size > 1000 and (kept / "tokenizer.json").is_file()

    empty = tmp_path / "empty"
    monkeypatch.setattr(export, "limit_tokenizer_length", _appearing(empty.mkdir, original))
    assert main(["--model_dir", str(model_dir), "--output_dir", str(empty)]) == 0
    assert (empty / "model.bin").stat().st_size > 1000


# --------------------------------------------------------------------------------------------------
# A full disk
# --------------------------------------------------------------------------------------------------
@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 1200 KiB file system (tmpfs), so that writing fills it for real; mounting needs root."""
    folder = tmp_path / "disk"
    folder.mkdir()
    try:
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=1200k", "tmpfs", str(folder)], capture_output=True, text=True
        )
    except FileNotFoundError:
        pytest.skip("no mount command here: a full disk is tested on a small tmpfs")
    if done.returncode != 0:
        pytest.skip(
            f"cannot mount a small tmpfs here ({done.stderr.strip()}): a full disk needs root to test"
        )
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def _fill(disk: Path) -> None:
    """Take all the free space of ``disk``."""
    descriptor = os.open(disk / "filler", os.O_WRONLY | os.O_CREAT)
    try:
        with contextlib.suppress(OSError):
            while True:
                os.write(descriptor, b"\0" * 4096)
    finally:
        os.close(descriptor)


def _full_disk_line(err: str, target: Path | str, kept: str) -> None:
    assert err == (
        f"error: No space left on the disk while writing {str(target)!r} (the disk is full): {kept}. Free some "
        "space, or write elsewhere, and run again."
    )


def test_a_full_disk_during_translation_is_one_line_and_keeps_the_old_output(
    model_dir: Path, small_disk: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from hf_vanilla.cli.translate import main

    (small_disk.parent / "in.txt").write_text("w1 w2\nw3\n", encoding="utf-8")
    out = small_disk / "out.txt"
    out.write_text(THEIRS)
    _fill(small_disk)
    argv = ["--model_name_or_path", str(model_dir), "--device", "cpu", "--num_beams", "1", "--max_length", "3",
            "--input_file", str(small_disk.parent / "in.txt"), "--output_file", str(out), "--overwrite"]  # fmt: skip
    assert main(argv) == 1
    _full_disk_line(
        capsys.readouterr().err.strip().splitlines()[-1], out, "the old file there is untouched, " + REMOVED
    )
    assert out.read_text() == THEIRS
    assert sorted(p.name for p in small_disk.iterdir()) == ["filler", "out.txt"]


def test_translations_to_a_full_stdout_end_in_one_line(
    model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``hf-vanilla-translate > /dev/full``: stdout is named as what could not be written."""
    from hf_vanilla.cli.translate import main

    (tmp_path / "in.txt").write_text("w1 w2\nw3\n", encoding="utf-8")
    full = open("/dev/full", "w", encoding="utf-8")  # noqa: SIM115 (every write: ENOSPC; closed below)
    monkeypatch.setattr(sys, "stdout", full)
    argv = ["--model_name_or_path", str(model_dir), "--device", "cpu", "--num_beams", "1", "--max_length", "3",
            "--input_file", str(tmp_path / "in.txt")]  # fmt: skip
    assert main(argv) == 1
    monkeypatch.undo()
    with contextlib.suppress(OSError):  # what is still buffered cannot be written either
        full.close()
    _full_disk_line(
        capsys.readouterr().err.strip().splitlines()[-1],
        "<stdout>",
        "what was written before the disk filled up stays",
    )


def test_torch_s_writer_on_a_full_disk_is_named_as_a_full_disk(small_disk: Path) -> None:
    """torch's zip writer says only "enforce fail at inline_container.cc" when the disk is full."""
    from hf_vanilla.io.atomic import DiskFullError, atomic_directory

    with pytest.raises(DiskFullError) as error, atomic_directory(small_disk / "average") as staged:
        torch.save({"weights": torch.zeros(1 << 20)}, staged / "optimizer.pt")
    assert "inline_container" in str(error.value.__cause__) or "file write failed" in str(
        error.value.__cause__
    )
    assert str(error.value).startswith(
        f"No space left on the disk while writing {str(small_disk / 'average')!r}"
    )
    assert list(small_disk.iterdir()) == []


def _train_argv(root: Path, output_dir: Path, *extra: str) -> list[str]:
    """A 2-layer, d_model 32 training run on 16 pairs (its tokenizer and data written into ``root``)."""
    word_tokenizer().save_pretrained(root / "tokenizer")
    (root / "data.tsv").write_text(
        "".join(f"w{i} w{i + 1} w{i + 2}\tw{i + 2} w{i + 1} w{i}\n" for i in range(16)), encoding="utf-8"
    )
    return [
        "--train_files", str(root / "data.tsv"), "--source_lang", "en", "--target_lang", "de",
        "--tokenizer_name_or_path", str(root / "tokenizer"),
        "--d_model", "32", "--layers", "2", "--attention_heads", "4", "--ffn_dim", "64",
        "--warmup_steps", "1", "--learning_rate", "1e-3",
        "--per_device_train_batch_size", "4", "--eval_strategy", "no", "--do_eval", "false",
        "--report_to", "none", "--use_cpu", "--disable_tqdm", "true", "--dataloader_num_workers", "0",
        "--output_dir", str(output_dir), *extra,
    ]  # fmt: skip


def test_the_final_model_on_a_full_disk_is_one_line(
    small_disk: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Training without checkpoints on a disk with about 150 KiB free: the final model (its weights alone
    take 184 KiB) cannot be saved, and the run ends in one line naming its folder."""
    from hf_vanilla.cli.train import main

    (small_disk / "filler").write_bytes(b"\0" * (1050 * 1024))
    run = small_disk / "run"
    assert main(_train_argv(small_disk.parent, run, "--max_steps", "1", "--save_strategy", "no")) == 1
    _full_disk_line(
        capsys.readouterr().err.strip().splitlines()[-1],
        run,
        "the files already in it are untouched, " + REMOVED,
    )
    assert not list(small_disk.glob("run/.save-*"))


def test_a_checkpoint_on_a_full_disk_is_one_line_and_keeps_the_previous_one(
    small_disk: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The disk holds one checkpoint of the tiny run (about 800 KiB) but not two: the second save fails
    in torch's writer (optimizer.pt), and the run ends in one line; checkpoint-1 stays whole."""
    from hf_vanilla.cli.train import main
    from hf_vanilla.io.checkpoints import find_complete_checkpoints

    root = small_disk.parent
    run = small_disk / "run"
    assert main(_train_argv(root, run, "--max_steps", "2", "--save_steps", "1")) == 1
    _full_disk_line(
        capsys.readouterr().err.strip().splitlines()[-1],
        run / "checkpoint-2",
        "the previous checkpoints are untouched, " + REMOVED,
    )
    assert [p.name for p in find_complete_checkpoints(run)] == ["checkpoint-1"]
    assert not list(run.glob(".incomplete-checkpoints/*"))


# --------------------------------------------------------------------------------------------------
# Numbers that cannot be honoured
# --------------------------------------------------------------------------------------------------
HUGE = str(10**30)

#: (command, its arguments beyond the common ones, the start of the one error line).
NUMBER_CASES = [
    ("translate", ["--num_beams", HUGE], f"--num_beams {HUGE}: too large a number"),
    ("translate", ["--num_beams", "0"], "--num_beams 0: give a positive beam size"),
    ("translate", ["--batch_size", "0"], "--batch_size 0: give a positive number"),
    ("translate", ["--max_tokens", "-1"], "--max_tokens -1: give 0"),
    ("translate", ["--max_length", HUGE], f"--max_length {HUGE}: too large a number"),
    ("translate", ["--nbest", HUGE], f"--nbest {HUGE}: too large a number"),
    ("translate", ["--length_penalty", "1e308"], "--length_penalty 1e+308: at most 10.0 either way"),
    ("evaluate", ["--max_tokens", "-1"], "--max_tokens -1: give 0"),
    ("evaluate", ["--max_eval_samples", "0"], "--max_eval_samples 0: evaluation scores at least 1 segment"),
    ("evaluate", ["--num_beams", HUGE], f"--num_beams {HUGE}: too large a number"),
    ("average", ["--last_n", "0"], "--last_n 0: give a positive number of checkpoints"),
    ("average", ["--last_n", HUGE], f"--last_n {HUGE}: too large a number"),
    ("plot", ["--dpi", "0"], "--dpi 0: give a positive resolution"),
    ("plot", ["--dpi", "100000"], "--dpi 100000: the picture would be 1000000 × 500000 pixels"),
    ("plot", ["--num_positions", HUGE], f"--num_positions {HUGE}: too large a number"),
    ("plot", ["--num_positions", "10000000"], "--num_positions 10000000 × d_model 512: more values than"),
    ("plot", ["--d_model", "0"], "--num_positions 100, --d_model 0: give a positive number"),
]


@pytest.mark.parametrize(("command", "extra", "message"), NUMBER_CASES)
def test_a_number_that_cannot_be_honoured_is_one_line_naming_the_flag(
    model_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    command: str,
    extra: list[str],
    message: str,
) -> None:
    from hf_vanilla.cli.average_checkpoints import main as average
    from hf_vanilla.cli.evaluate_bleu import main as evaluate
    from hf_vanilla.cli.plot import main as plot
    from hf_vanilla.cli.translate import main as translate

    (tmp_path / "val.en").write_text("w1 w2\nw3\n", encoding="utf-8")
    (tmp_path / "val.de").write_text("w1 w2\nw3\n", encoding="utf-8")
    (tmp_path / "run" / "checkpoint-1").mkdir(parents=True)
    model = ["--model_name_or_path", str(model_dir), "--device", "cpu"]
    mains = {
        "translate": (translate, [*model, "--input_file", str(tmp_path / "val.en"), "--output_file",
                                  str(tmp_path / "out.txt"), "--max_length", "3"]),
        "evaluate": (evaluate, [*model, "--validation_files", str(tmp_path / "val"), "--source_lang", "en",
                                "--target_lang", "de", "--output_dir", str(tmp_path / "eval")]),
        "average": (average, ["--run_dir", str(tmp_path / "run"), "--output_dir", str(tmp_path / "average")]),
        "plot": (plot, ["--positional_encoding", "--output_dir", str(tmp_path / "plots")]),
    }  # fmt: skip
    main, argv = mains[command]
    before = sorted(tmp_path.rglob("*"))
    assert main([*argv, *extra]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"error: {message}"), err[-1]
    assert sorted(tmp_path.rglob("*")) == before  # nothing written


def test_a_length_cap_beyond_the_model_s_bound_changes_nothing(model_dir: Path) -> None:
    """``--max_length`` above input length + 50 caps nothing: the translations are the uncapped ones, and
    generate() is not asked for room for 2^40 tokens (it would try to allocate it)."""
    from hf_vanilla.inference.loading import load_model_and_tokenizer
    from hf_vanilla.inference.options import DecodingOptions, InferenceModelArguments
    from hf_vanilla.inference.translation import translate

    model, tokenizer = load_model_and_tokenizer(InferenceModelArguments(str(model_dir), device="cpu"))
    lines = ["w1 w2 w3", "w4", "w5 w6"]
    for options in (DecodingOptions(num_beams=1), DecodingOptions(num_beams=2)):
        expected = translate(model, tokenizer, lines, options)
        assert (
            translate(model, tokenizer, lines, options, generate_kwargs={"max_new_tokens": 2**40}) == expected
        )


def test_a_batch_that_does_not_fit_in_memory_is_one_line_naming_the_flags(
    model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A beam or batch too large for the memory (CUDA's OutOfMemoryError; on the CPU torch's allocator says
    "can't allocate memory") ends in one line naming the flags that make batches smaller."""
    import hf_vanilla.inference.decoding as decoding
    from hf_vanilla.cli.translate import main

    def out_of_memory(*args: Any, **kwargs: Any) -> Any:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")

    monkeypatch.setattr(decoding, "generate_hypotheses", out_of_memory)
    (tmp_path / "in.txt").write_text("w1 w2\nw3\n", encoding="utf-8")
    argv = ["--model_name_or_path", str(model_dir), "--device", "cpu", "--num_beams", "8", "--input_file",
            str(tmp_path / "in.txt"), "--output_file", str(tmp_path / "out.txt")]  # fmt: skip
    assert main(argv) == 1
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "error: Out of memory translating a batch of 2 sentence(s) of up to 3 tokens with --num_beams 8: lower "
        "--batch_size, set a --max_tokens budget (a batch's sentences × its longest), or lower --num_beams."
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt"]


def test_a_tokenized_data_cache_on_a_full_disk_is_named_and_removed(small_disk: Path) -> None:
    import datasets

    from hf_vanilla.data.cache import build_cache
    from hf_vanilla.io.atomic import DiskFullError

    data = datasets.DatasetDict({"train": datasets.Dataset.from_dict({"x": ["w1 w2"] * 20_000})})

    def tokenize(dataset: datasets.Dataset, cache_file_name: str) -> datasets.Dataset:
        return dataset.map(lambda row: {"ids": [7] * 50}, cache_file_name=cache_file_name)

    with pytest.raises(DiskFullError) as error:
        build_cache(small_disk / "cache" / "fingerprint", data, tokenize)
    assert str(error.value).startswith(
        f"No space left on the disk while writing {str(small_disk / 'cache' / 'fingerprint')!r} (the disk is full): "
        "no cache was written"
    )
    assert list((small_disk / "cache").iterdir()) == []
