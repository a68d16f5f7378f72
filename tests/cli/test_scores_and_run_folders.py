"""Scores stay bound to the weights they were computed from."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any

import pytest
from helpers import CARD_ARGS, tiny_model, word_tokenizer

import hf_vanilla.analysis.evaluation as evaluation
from hf_vanilla.cli.evaluate_bleu import main as evaluate_main
from hf_vanilla.cli.publish import main as publish_main
from hf_vanilla.io.checksums import weights_fingerprint


@pytest.fixture
def model_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "model"
    tiny_model().save_pretrained(folder)
    word_tokenizer().save_pretrained(folder)
    return folder


def _pairs(tmp: Path) -> Path:
    path = tmp / "pairs.tsv"
    path.write_text("".join(f"w{i} w{i + 1}\tw{i + 1} w{i}\n" for i in range(4)), encoding="utf-8")
    return path


def _error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err.strip().splitlines()[-1]


def test_scores_are_bound_to_the_weights_that_were_translated_with(
    model_folder: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Weights replaced during decoding (as a resumed run's final save replaces them): the results record
    the fingerprint of the weights that translated, and publishing the folder's new weights with those
    results is refused in one line."""
    used = weights_fingerprint(model_folder)
    other = tmp_path / "other"
    tiny_model(seed=1).save_pretrained(other)
    real_translate = evaluation.translate

    def translate_while_replaced(*args: Any, **kwargs: Any) -> Any:
        shutil.copyfile(other / "model.safetensors", model_folder / "model.safetensors")
        return real_translate(*args, **kwargs)

    monkeypatch.setattr(evaluation, "translate", translate_while_replaced)
    argv = ["--model_name_or_path", str(model_folder), "--validation_files", str(_pairs(tmp_path)),
            "--source_lang", "en", "--target_lang", "de", "--device", "cpu"]  # fmt: skip
    assert evaluate_main(argv) == 0
    results = model_folder / "eval" / "validation.results.json"
    recorded = json.loads(results.read_text(encoding="utf-8"))["model_sha256"]
    assert recorded == used != weights_fingerprint(model_folder)

    capsys.readouterr()
    publish = ["--model_name_or_path", str(model_folder), "--results_files", str(results), *CARD_ARGS]
    assert publish_main([*publish, "--output_dir", str(tmp_path / "hub")]) == 1
    assert "scored other weights" in _error_line(capsys)
    assert not (tmp_path / "hub").exists()

    # The weights that were scored publish, and nothing logged names a folder that is gone.
    tiny_model().save_pretrained(model_folder)
    with caplog.at_level(logging.INFO):
        assert publish_main([*publish, "--output_dir", str(tmp_path / "hub")]) == 0
    metadata = json.loads((tmp_path / "hub" / "hub_metadata.json").read_text(encoding="utf-8"))
    assert metadata["source_model_sha256"] == used
    logged = [record.getMessage() for record in caplog.records]
    assert any(str(tmp_path / "hub") in message for message in logged)
    assert not [message for message in logged if ".tmp-" in message or "hf-vanilla-weights-" in message]
