"""The main job, `python -m hf_vanilla.demo`: a quick run checks the plumbing, a full one the promise
(both real processes: the slow tier)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import assert_self_contained, run_card
from huggingface_hub import ModelCard
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

from hf_vanilla.cli.publish import main as publish_main
from hf_vanilla.demo.options import DemoArguments

REPO = Path(__file__).resolve().parents[2]
FILES = (
    "model.safetensors",
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "README.md",
    "demo_results.json",
    "test_translations.tsv",
    "training_curves.png",
    "positional_encoding.png",
    "cross_attention_grid.png",
    "cross_attention_mean.png",
    "encoder_self_attention_grid.png",
    "decoder_self_attention_grid.png",
    "attention_masks.png",
    "head_distances.png",
)


def _run_demo(*args: str, timeout: int) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.run(
        [sys.executable, "-m", "hf_vanilla.demo", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _check_folder(output_dir: Path) -> dict:
    missing = [name for name in FILES if not (output_dir / name).is_file()]
    assert not missing, f"the demo did not write {missing}"
    model = AutoModelForSeq2SeqLM.from_pretrained(output_dir)
    tokenizer = AutoTokenizer.from_pretrained(output_dir)
    assert model.generation_config.num_beams == 4 and model.generation_config.length_penalty == 0.6
    assert model.generation_config.max_length is None  # the §6.1 bound (input + 50), not HF's 20
    assert model.config.vocab_size == len(tokenizer)
    return json.loads((output_dir / "demo_results.json").read_text())


@pytest.mark.slow  # the demo as a process, then clean-interpreter loads and card runs
def test_quick_demo_writes_everything_and_reports(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    result = _run_demo("--quick", "--max_steps", "6", "--output_dir", str(out), timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    for text in ("exact match", "BLEU", "chrF", "Sample translations", str(out)):
        assert text in result.stdout, f"{text!r} not printed:\n{result.stdout[-2000:]}"
    results = _check_folder(out)
    assert results["steps"] == 6
    assert 0.0 <= results["exact_match"] <= 1.0 and results["num_test"] == 40
    assert results["decoding"]["num_beams"] == 4
    heads = results["head_distances"]  # how different the heads are, before and after training
    assert set(heads["initialisation"]) == set(heads["trained"]) == {"encoder", "decoder", "cross"}
    assert "How different the attention heads are" in result.stdout
    lines = (out / "test_translations.tsv").read_text().splitlines()
    assert len(lines) == 1 + results["num_test"]
    # The folder loads where hf_vanilla is not installed, and its card's examples run as written.
    assert_self_contained(out, tmp_path)
    run_card(out, tmp_path)
    _check_publish(out, tmp_path)


def _check_publish(out: Path, tmp_path: Path) -> None:
    """hf-vanilla-publish takes the demo's own results and states what the demo recorded."""
    record = json.loads((out / "training_record.json").read_text())
    tested = {line.split("\t")[0] for line in (out / "test_translations.tsv").read_text().splitlines()[1:]}
    assert (
        record["example_sources"] and not set(record["example_sources"]) & tested
    )  # trained on, not held out
    hub = tmp_path / "hub"
    argv = ["--model_name_or_path", str(out), "--output_dir", str(hub)]
    assert publish_main([*argv, "--results_files", str(out / "demo_results.json")]) == 0
    card = ModelCard.load(hub / "README.md")
    assert card.data.model_name == record["title"] and card.data.license == "apache-2.0"
    assert f'tokenizer(["{record["example_sources"][0]}"]' in card.text
    assert "python -m hf_vanilla.demo" in card.text and "A man rides a bike." not in card.text
    leaked = [p.name for p in hub.rglob("*") if p.is_file() and str(tmp_path).encode() in p.read_bytes()]
    assert not leaked, f"local paths in {leaked}"


def test_quick_overrides_the_size() -> None:
    args = DemoArguments(quick=True)
    assert args.max_steps <= 20 and args.train_size < 1000 and args.d_model <= 64


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="max_steps"):
        DemoArguments(max_steps=0)


@pytest.mark.slow
def test_readme_demo_reaches_99_percent_exact_match(tmp_path: Path) -> None:
    """Exactly the README's first command."""
    out = tmp_path / "demo_output"
    result = _run_demo("--output_dir", str(out), timeout=3600)
    assert result.returncode == 0, result.stderr[-3000:]
    results = _check_folder(out)
    assert results["num_test"] >= 500
    assert results["exact_match"] >= 0.99, results
    assert results["bleu"] > 95 and results["chrf"] > 95  # BLEU over characters (see demo.py)


def test_the_head_measure_needs_two_heads(tokenizer) -> None:
    from helpers import tiny_model

    from hf_vanilla.demo.run import _head_distances

    pairs = [("w1 w2", "w3")]
    assert (
        _head_distances(tiny_model(encoder_attention_heads=1, decoder_attention_heads=1), tokenizer, pairs)
        is None
    )
    distances = _head_distances(tiny_model(), tokenizer, pairs)
    assert set(distances) == {"encoder", "decoder", "cross"} and all(len(v) == 2 for v in distances.values())
