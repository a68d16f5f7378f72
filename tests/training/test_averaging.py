"""Checkpoint averaging (§6.1): the mean of the parameters, a loadable folder, clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers import tiny_model
from safetensors.torch import load_file, save_file
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

from hf_vanilla.io.checkpoints import find_complete_checkpoints
from hf_vanilla.training.averaging import (
    average_checkpoints,
    average_last_checkpoints,
    load_safetensors_state_dict,
)


def _write_checkpoints(run_dir: Path, steps: list[int], tokenizer=None) -> list[Path]:
    """One differently seeded tiny model per step, saved as run_dir/checkpoint-<step> with the
    ``trainer_state.json`` that makes it a whole Trainer checkpoint."""
    paths = []
    for seed, step in enumerate(steps):
        path = run_dir / f"checkpoint-{step}"
        tiny_model(seed=seed).save_pretrained(path)
        (path / "trainer_state.json").write_text(json.dumps({"global_step": step}), encoding="utf-8")
        if tokenizer is not None:
            tokenizer.save_pretrained(path)
        paths.append(path)
    return paths


def test_find_complete_checkpoints_sorts_by_step_not_lexically(tmp_path: Path) -> None:
    _write_checkpoints(tmp_path, [1000, 900, 50])
    (tmp_path / "checkpoint-final").mkdir()
    (tmp_path / "runs").mkdir()
    assert [p.name for p in find_complete_checkpoints(tmp_path)] == [
        "checkpoint-50",
        "checkpoint-900",
        "checkpoint-1000",
    ]


def test_average_is_the_elementwise_mean_and_loads(tmp_path: Path, tokenizer) -> None:
    paths = _write_checkpoints(tmp_path / "run", [10, 20, 30], tokenizer)
    out = average_checkpoints(paths, tmp_path / "avg")

    states = [load_file(p / "model.safetensors") for p in paths]
    averaged = load_file(out / "model.safetensors")
    assert averaged.keys() == states[0].keys()
    for key in averaged:
        expected = torch.stack([s[key] for s in states]).mean(dim=0)
        torch.testing.assert_close(averaged[key], expected, rtol=0, atol=1e-6)
    assert not torch.equal(averaged["model.shared.weight"], states[0]["model.shared.weight"])

    model = AutoModelForSeq2SeqLM.from_pretrained(out)
    torch.testing.assert_close(model.model.shared.weight.detach(), averaged["model.shared.weight"])
    # The shared embedding / pre-softmax matrix stays tied (§3.4).
    assert model.lm_head.weight.data_ptr() == model.model.shared.weight.data_ptr()
    assert model.generation_config.num_beams == 4
    assert AutoTokenizer.from_pretrained(out).convert_tokens_to_ids("w5") == tokenizer.convert_tokens_to_ids(
        "w5"
    )


def test_average_last_n_takes_the_newest_by_step(tmp_path: Path) -> None:
    run = tmp_path / "run"
    paths = _write_checkpoints(run, [900, 1000, 80])
    out = average_last_checkpoints(run, 2, tmp_path / "avg")
    newest = [paths[0], paths[1]]  # steps 900 and 1000; 80 is the oldest although "80" > "1000" lexically
    expected = average_checkpoints(newest, tmp_path / "expected")
    torch.testing.assert_close(
        load_file(out / "model.safetensors"), load_file(expected / "model.safetensors")
    )


def test_clear_errors(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="No whole checkpoint-<step> folders"):
        average_last_checkpoints(tmp_path / "empty", 5, tmp_path / "out")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        average_last_checkpoints(tmp_path / "nowhere", 5, tmp_path / "out")
    with pytest.raises(FileNotFoundError, match="not found"):
        average_checkpoints([tmp_path / "nowhere"], tmp_path / "out")

    run = tmp_path / "run"
    _write_checkpoints(run, [1, 2])
    with pytest.raises(ValueError, match="only 2"):
        average_last_checkpoints(run, 3, tmp_path / "out")

    wide = run / "checkpoint-3"
    tiny_model(d_model=48).save_pretrained(wide)
    (wide / "trainer_state.json").write_text(json.dumps({"global_step": 3}), encoding="utf-8")
    with pytest.raises(ValueError, match="shape"):
        average_checkpoints([run / "checkpoint-1", wide], tmp_path / "out")
    assert not (tmp_path / "out").exists()  # nothing written on error


def test_refuses_pickled_weights(tmp_path: Path) -> None:
    folder = tmp_path / "checkpoint-1"
    folder.mkdir()
    torch.save({"w": torch.zeros(1)}, folder / "pytorch_model.bin")
    with pytest.raises(FileNotFoundError, match="pickled"):
        load_safetensors_state_dict(folder)


def test_reads_sharded_safetensors(tmp_path: Path) -> None:
    folder = tmp_path / "checkpoint-1"
    folder.mkdir()
    save_file({"a": torch.ones(2)}, folder / "model-00001-of-00002.safetensors")
    save_file({"b": torch.zeros(3)}, folder / "model-00002-of-00002.safetensors")
    index = '{"metadata": {}, "weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}'
    (folder / "model.safetensors.index.json").write_text(index)
    state = load_safetensors_state_dict(folder)
    assert set(state) == {"a", "b"} and state["b"].shape == (3,)
