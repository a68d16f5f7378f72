"""What commands write: never over an output that appeared while they ran, never a traceback on a full
disk, and numbers they cannot honour refused in one line naming the flag."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers import tiny_model, word_tokenizer

from hf_vanilla.hub.folder import save_model_folder

THEIRS = "written by another command\n"


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
