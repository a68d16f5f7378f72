"""Scores stay bound to the weights they were computed from, every checkpoint a command is given is
verified alike, and commands that read a run folder survive a training run rotating its checkpoints."""

from __future__ import annotations

import json
import logging
import math
import shutil
import struct
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import CARD_ARGS, tiny_model, word_tokenizer
from safetensors.torch import load_file
from transformers import AutoModelForSeq2SeqLM

import hf_vanilla.analysis.evaluation as evaluation
import hf_vanilla.analysis.plotting as plotting
import hf_vanilla.inference.loading as loading
import hf_vanilla.training.averaging as averaging
from hf_vanilla.cli.average_checkpoints import main as average_main
from hf_vanilla.cli.evaluate_bleu import main as evaluate_main
from hf_vanilla.cli.publish import main as publish_main
from hf_vanilla.io.checked_loading import load_pretrained_checked
from hf_vanilla.io.checkpoints import checkpoint_folders
from hf_vanilla.io.checksums import weights_fingerprint, write_checksums


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


def test_results_that_do_not_name_the_weights_they_scored_are_not_published(
    model_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A model evaluated without being loaded from a folder records a null fingerprint: its scores are not
    put on the card of a folder's weights, even when the results name that folder."""
    model = AutoModelForSeq2SeqLM.from_pretrained(model_folder)  # the Python API: no fingerprint
    tokenizer = word_tokenizer()
    results, path = evaluation.evaluate_split_into(
        tmp_path / "eval", model, tokenizer, ["w1 w2"], ["w2 w1"], split="validation", source_lang="en",
        target_lang="de", model_name=str(model_folder), dataset_name="pairs", device="cpu",
    )  # fmt: skip
    assert results["model_sha256"] is None
    argv = ["--model_name_or_path", str(model_folder), "--results_files", str(path), *CARD_ARGS,
            "--output_dir", str(tmp_path / "hub")]  # fmt: skip
    assert publish_main(argv) == 1
    assert "does not record which weights it scored" in _error_line(capsys)
    assert not (tmp_path / "hub").exists()


def test_scores_of_sampled_translations_are_not_published(
    model_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A card's scores and the generation config published with them are one decoding: sampled
    translations (hf-vanilla-evaluate --do_sample) would publish as beam search, so they are refused."""
    model = load_pretrained_checked(model_folder)
    results, path = evaluation.evaluate_split_into(
        tmp_path / "eval", model, word_tokenizer(), ["w1 w2"], ["w2 w1"], split="validation", source_lang="en",
        target_lang="de", model_name=str(model_folder), dataset_name="pairs", device="cpu",
    )  # fmt: skip
    results["decoding"]["do_sample"] = True  # as --do_sample records it
    path.write_text(json.dumps(results), encoding="utf-8")
    argv = ["--model_name_or_path", str(model_folder), "--results_files", str(path), *CARD_ARGS,
                    "--output_dir", str(tmp_path / "hub")]  # fmt: skip
    assert publish_main(argv) == 1
    assert "scored sampled translations (--do_sample)" in _error_line(capsys)
    assert not (tmp_path / "hub").exists()


def _run_folder(tmp: Path, steps: tuple[int, ...] = (1, 2, 3)) -> Path:
    """Trainer checkpoints as a run writes them: weights, tokenizer, training_args.json, trainer_state.json
    with a log, and checksums.sha256 over all of it."""
    run = tmp / "run"
    for seed, step in enumerate(steps):
        path = run / f"checkpoint-{step}"
        tiny_model(seed=seed).save_pretrained(path)
        word_tokenizer().save_pretrained(path)
        (path / "training_args.json").write_text(json.dumps({"dataset": "custom"}), encoding="utf-8")
        state = {
            "global_step": step,
            "log_history": [{"step": s, "loss": 1.0 / s} for s in range(1, step + 1)],
        }
        (path / "trainer_state.json").write_text(json.dumps(state), encoding="utf-8")
        write_checksums(path)
    return run


def _flip_a_bit_to_a_huge_finite_weight(weights: Path) -> None:
    """Flip the top exponent bit of a float32 weight in (0, 1): a finite ~1e37, which no NaN check sees."""
    data = bytearray(weights.read_bytes())
    (header_length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + header_length])
    start = 8 + header_length
    name = next(k for k, v in sorted(header.items()) if k != "__metadata__" and v["dtype"] == "F32")
    begin, end = header[name]["data_offsets"]
    for offset in range(start + begin, start + end, 4):
        (value,) = struct.unpack("<f", data[offset : offset + 4])
        if 0 < abs(value) < 1:
            data[offset + 3] ^= 0x40
            (flipped,) = struct.unpack("<f", data[offset : offset + 4])
            assert math.isfinite(flipped) and abs(flipped) > 1e30
            weights.write_bytes(bytes(data))
            return
    raise AssertionError("no weight in (0, 1)")


def test_every_checkpoint_given_to_average_is_verified(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One flipped bit in the older of two --checkpoints (its checksums.sha256 still there) is refused in one
    line naming it, as --run_dir and resuming refuse it."""
    run = _run_folder(tmp_path, (1, 2))
    _flip_a_bit_to_a_huge_finite_weight(run / "checkpoint-1" / "model.safetensors")
    argv = [
        "--checkpoints",
        str(run / "checkpoint-1"),
        str(run / "checkpoint-2"),
        "--output_dir",
        str(tmp_path / "avg"),
    ]
    assert average_main(argv) == 1
    line = _error_line(capsys)
    assert line.startswith("error: ") and str(run / "checkpoint-1" / "model.safetensors") in line
    assert "sha256" in line and ".pinned-" not in line
    assert not (tmp_path / "avg").exists()
    assert sorted(p.name for p in run.iterdir()) == ["checkpoint-1", "checkpoint-2"]  # no snapshot left


def test_a_checkpoint_rotated_away_between_listing_and_reading_is_refused_as_deleted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _run_folder(tmp_path)
    real_find = averaging.find_complete_checkpoints

    def find_then_rotate(run_dir: Path) -> list[Path]:
        found = real_find(run_dir)
        shutil.rmtree(found[-2])  # what --save_total_limit does when the run saves its next checkpoint
        return found

    monkeypatch.setattr(averaging, "find_complete_checkpoints", find_then_rotate)
    argv = ["--run_dir", str(run), "--last_n", "2", "--output_dir", str(tmp_path / "avg")]
    assert average_main(argv) == 1
    line = _error_line(capsys)
    assert f"{str(run / 'checkpoint-2')!r} was deleted while it was being read" in line
    assert "damaged" not in line
    assert not (tmp_path / "avg").exists()


def test_a_checkpoint_rotated_away_while_it_is_averaged_leaves_a_whole_average(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The checkpoints are pinned before they are read: deleting them mid-read takes nothing away, and the
    average holds the tokenizer and training_args.json of the newest."""
    run = _run_folder(tmp_path)
    chosen = [run / "checkpoint-2", run / "checkpoint-3"]
    expected = {key: (a + b) / 2 for (key, a), b in zip(load_file(chosen[0] / "model.safetensors").items(),
                                                       load_file(chosen[1] / "model.safetensors").values(), strict=True)}  # fmt: skip
    real_load = averaging.load_safetensors_state_dict

    def rotate_then_load(checkpoint: Path) -> dict[str, torch.Tensor]:
        for path in chosen:
            shutil.rmtree(path, ignore_errors=True)
        return real_load(checkpoint)

    monkeypatch.setattr(averaging, "load_safetensors_state_dict", rotate_then_load)
    argv = ["--run_dir", str(run), "--last_n", "2", "--output_dir", str(tmp_path / "avg")]
    assert average_main(argv) == 0
    average = tmp_path / "avg"
    assert {"tokenizer.json", "tokenizer_config.json", "training_args.json", "model.safetensors"} <= {
        p.name for p in average.iterdir()
    }
    averaged = load_file(average / "model.safetensors")
    for key, value in expected.items():
        torch.testing.assert_close(averaged[key], value)
    assert sorted(p.name for p in run.iterdir()) == ["checkpoint-1"]  # no snapshot left


def test_plot_reads_the_log_of_the_checkpoint_that_replaced_a_rotated_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = _run_folder(tmp_path, (1, 2))
    listings = []

    def list_then_rotate(run_dir: Path) -> list[Path]:
        found = checkpoint_folders(run_dir)
        if not listings:  # the run saves checkpoint-3 and rotates checkpoint-2 away after this listing
            shutil.copytree(found[-1], run / "checkpoint-3")
            state = json.loads((run / "checkpoint-3" / "trainer_state.json").read_text(encoding="utf-8"))
            state["log_history"].append({"step": 3, "loss": 0.25})
            (run / "checkpoint-3" / "trainer_state.json").write_text(json.dumps(state), encoding="utf-8")
            shutil.rmtree(found[-1])
        listings.append(found)
        return found

    monkeypatch.setattr(plotting, "checkpoint_folders", list_then_rotate)
    assert [row["step"] for row in plotting.load_log_history(run)] == [1, 2, 3]


def test_evaluating_a_checkpoint_rotated_away_mid_read_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _run_folder(tmp_path, (1,))
    checkpoint = run / "checkpoint-1"
    real_load_tokenizer = loading.load_tokenizer

    def rotate_then_load(*args: Any, **kwargs: Any) -> Any:
        shutil.rmtree(checkpoint)
        return real_load_tokenizer(*args, **kwargs)

    monkeypatch.setattr(loading, "load_tokenizer", rotate_then_load)
    argv = ["--model_name_or_path", str(checkpoint), "--validation_files", str(_pairs(tmp_path)),
            "--source_lang", "en", "--target_lang", "de", "--device", "cpu"]  # fmt: skip
    assert evaluate_main(argv) == 1
    line = _error_line(capsys)
    assert f"{str(checkpoint)!r} was deleted while it was being read" in line and "damaged" not in line
    assert not (run / "eval-checkpoint-1").exists()


def test_a_checkpoint_loaded_as_a_model_is_checked_as_resuming_checks_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A checkpoint whose trainer_state.json names another step (files of two saves) is skipped by --run_dir
    and refused by resuming; evaluating it is refused too, in one line naming the file."""
    checkpoint = _run_folder(tmp_path, (1,)) / "checkpoint-1"
    (checkpoint / "trainer_state.json").write_text(json.dumps({"global_step": 7}), encoding="utf-8")
    write_checksums(checkpoint)  # the manifest agrees: only the step gives it away
    argv = ["--model_name_or_path", str(checkpoint), "--validation_files", str(_pairs(tmp_path)),
            "--source_lang", "en", "--target_lang", "de", "--device", "cpu"]  # fmt: skip
    assert evaluate_main(argv) == 1
    line = _error_line(capsys)
    assert str(checkpoint / "trainer_state.json") in line and "mixes files of two saves" in line
    assert not (checkpoint.parent / "eval-checkpoint-1").exists()
