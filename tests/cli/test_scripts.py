"""Every script of recipes/ and scripts/ run end to end as a user runs it, at tiny size.

Already run elsewhere, so not here: ``scripts/train.py`` (tests/cli/test_bad_input.py's ``world``, and
tests/train_driver.py for the multi-process and fault tests), ``scripts/plot.py``
(tests/analysis/test_plotting.py), ``scripts/publish.py`` (tests/hub/test_hub.py) and ``scripts/convert.py``
(tests/interop/test_convert.py, slow). The others run here: in process through ``runpy`` where that is quick,
as real subprocesses (slow) for the recipe and the GPU check's CPU dry run.
"""

from __future__ import annotations

import gzip
import json
import os
import random
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import tiny_model
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, PreTrainedTokenizerFast

from hf_vanilla.io.checkpoints import find_complete_checkpoints
from hf_vanilla.training.precision import cpu_bf16_instructions, describe_precision
from hf_vanilla.training.schedule import PaperLRLambda

REPO = Path(__file__).resolve().parents[2]


def run_script(name: str, argv: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """``python scripts/<name>.py ARGV`` in this process; it must exit with status 0."""
    monkeypatch.setattr(sys, "argv", [f"{name}.py", *argv])
    with pytest.raises(SystemExit) as exit_info:
        runpy.run_path(str(REPO / "scripts" / f"{name}.py"), run_name="__main__")
    assert exit_info.value.code == 0


def write_pairs(folder: Path, split: str, pairs: list[tuple[str, str]]) -> None:
    """``<split>.de.gz`` and ``<split>.en.gz``, one sentence a line, like /work/shared/data/multi30k."""
    folder.mkdir(parents=True, exist_ok=True)
    for lang, side in (("de", 0), ("en", 1)):
        with gzip.open(folder / f"{split}.{lang}.gz", "wt", encoding="utf-8") as f:
            f.write("".join(pair[side] + "\n" for pair in pairs))


def sentence_pairs(rows: int, seed: int = 0) -> list[tuple[str, str]]:
    """German-looking sources and their word-for-word English targets (3 to 7 words)."""
    de = [
        "ein",
        "der",
        "die",
        "das",
        "mann",
        "frau",
        "hund",
        "katze",
        "spielt",
        "läuft",
        "sitzt",
        "auf",
        "dem",
        "im",
        "park",
        "haus",
        "ball",
        "rot",
    ]
    en = [
        "a",
        "the",
        "the",
        "the",
        "man",
        "woman",
        "dog",
        "cat",
        "plays",
        "runs",
        "sits",
        "on",
        "the",
        "in",
        "park",
        "house",
        "ball",
        "red",
    ]
    rng = random.Random(seed)
    pairs = []
    for _ in range(rows):
        words = [rng.randrange(len(de)) for _ in range(rng.randint(3, 7))]
        pairs.append((" ".join(de[i] for i in words), " ".join(en[i] for i in words)))
    return pairs


def word_pairs(rows: int) -> list[tuple[str, str]]:
    """Sentences of the conftest word tokenizer's words: the target reverses the source."""
    return [(f"w{i} w{i + 1} w{i + 2}", f"w{i + 2} w{i + 1} w{i}") for i in range(1, rows + 1)]


def fake_run(run_dir: Path, steps: list[int]) -> None:
    """A training run's ``checkpoint-<step>`` folders: a tiny model each (seeded by its step) and the
    ``trainer_state.json`` the Trainer writes last."""
    for step in steps:
        folder = run_dir / f"checkpoint-{step}"
        tiny_model(seed=step).save_pretrained(folder)
        (folder / "trainer_state.json").write_text(json.dumps({"global_step": step}), encoding="utf-8")


# --------------------------------------------------------------------------------------------------
# recipes/multi30k.sh
# --------------------------------------------------------------------------------------------------
def run_tiny_recipe(tmp_path: Path, out: Path, **knobs: str) -> subprocess.CompletedProcess[str]:
    """``bash recipes/multi30k.sh`` on 48 tiny pairs (3 validation pairs) with a tiny model, one thread and
    ``knobs`` (its environment variables) on top; it must exit with status 0."""
    data = tmp_path / "data"
    write_pairs(data, "train", sentence_pairs(48))
    write_pairs(data, "val", sentence_pairs(3, seed=1))
    tiny = {"VOCAB_SIZE": "300", "D_MODEL": "16", "LAYERS": "1", "HEADS": "2", "FFN_DIM": "32"}
    tiny |= {"MAX_TOKENS": "300", "WARMUP": "4", "OMP_NUM_THREADS": "1"}
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"  # `python` is this one
    env = {**os.environ, **tiny, **knobs, "PATH": path, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    command = ["bash", str(REPO / "recipes" / "multi30k.sh"), str(data), str(out)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


@pytest.mark.slow
def test_recipe_averages_and_evaluates_the_last_checkpoints_by_step(tmp_path: Path) -> None:
    """The recipe as a user runs it (bash, its scripts as subprocesses), minutes shrunk through its
    knobs, into a folder whose path has hyphens and digits: it averages the last 5 complete
    checkpoints by step and evaluates the last one by step (the shell's `sort -t- -k2 -n` it used
    before sorted these paths as text: checkpoint-2, -20, -4, -6, -8, and "last" was checkpoint-8)."""
    out = tmp_path / "runs" / "multi30k-base-2"
    done = run_tiny_recipe(tmp_path, out, MAX_STEPS="20", SAVE_STEPS="2")

    train = out / "train"
    assert [p.name for p in find_complete_checkpoints(train)] == [f"checkpoint-{s}" for s in range(2, 21, 2)]
    last_five = [str(train / f"checkpoint-{step}") for step in (12, 14, 16, 18, 20)]
    recorded = json.loads((out / "averaged" / "averaged_checkpoints.json").read_text(encoding="utf-8"))
    assert recorded["averaged_checkpoints"] == last_five
    assert f"averaged: {' '.join(last_five)}" in done.stdout.splitlines()
    assert f"last checkpoint: {train / 'checkpoint-20'}" in done.stdout.splitlines()
    # The recipe's --bf16 auto: bfloat16 autocast exactly where this CPU computes it natively, logged.
    chosen = describe_precision(cpu_bf16_instructions() is not None, False, torch.device("cpu"))
    assert [line for line in done.stdout.splitlines() if line.startswith("precision: ")] == [
        f"precision: {chosen}"
    ]

    def evaluated(name: str) -> str:
        results = json.loads((out / name / "validation.results.json").read_text(encoding="utf-8"))
        return results["model"]

    assert evaluated("eval_averaged") == str(out / "averaged")
    assert evaluated("eval_last") == str(train / "checkpoint-20")


@pytest.mark.slow
def test_recipe_stops_by_the_clock_with_a_checkpoint_and_cools_the_rate_down(tmp_path: Path) -> None:
    """TRAIN_MINUTES stops training itself (``--max_train_minutes``), long before MAX_STEPS, with a
    checkpoint at the step it stops at, which the recipe averages and evaluates as its last; with COOLDOWN
    the last logged rates fall far below Eq. (3)'s."""
    out = tmp_path / "run"
    done = run_tiny_recipe(
        tmp_path, out, TRAIN_MINUTES="0.25", COOLDOWN="0.5", SAVE_STEPS="100000", LAST_N="1"
    )

    log = (out / "train.log").read_text(encoding="utf-8")
    assert "Time budget: 0.25 minutes of training" in log and "over the last 50% of them" in log
    [stop] = find_complete_checkpoints(out / "train")  # SAVE_STEPS 100000: only the one at the stop
    step = int(stop.name.split("-")[1])
    assert 10 <= step < 100_000 and f"stopping after step {step}, with a checkpoint" in log
    assert f"last checkpoint: {stop}" in done.stdout.splitlines()
    state = json.loads((stop / "trainer_state.json").read_text(encoding="utf-8"))
    assert state["stateful_callbacks"]["TrainingTimeBudget"]["attributes"]["trained_seconds"] >= 15
    last = [entry for entry in state["log_history"] if "learning_rate" in entry][-1]
    eq_3 = 1e-3 * PaperLRLambda(4)(last["step"] - 1)  # the rate the logged update had without the cool-down
    assert last["learning_rate"] < 0.5 * eq_3


# --------------------------------------------------------------------------------------------------
# scripts/*.py not run end to end by another test file
# --------------------------------------------------------------------------------------------------
def test_train_tokenizer_script(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_pairs(tmp_path / "data", "train", sentence_pairs(32))
    argv = ["--train_files", str(tmp_path / "data" / "train"), "--source_lang", "de", "--target_lang", "en"]
    run_script(
        "train_tokenizer", [*argv, "--vocab_size", "300", "--output_dir", str(tmp_path / "tok")], monkeypatch
    )
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "tok")
    assert len(tokenizer) == 300
    text = "der hund spielt im park"
    assert tokenizer.decode(tokenizer(text).input_ids, skip_special_tokens=True) == text


def test_average_checkpoints_script_picks_the_last_by_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """--run_dir --last_n orders by step (9 before 10) in a path with hyphens and digits; --list_checkpoints
    prints the complete checkpoints in that order, skipping one the Trainer did not finish."""
    run = tmp_path / "multi30k-base-2" / "train"
    fake_run(run, [10, 2, 9])
    (run / "checkpoint-11").mkdir()  # killed while saving: no trainer_state.json
    (run / "checkpoint-11" / "config.json").write_text("{}", encoding="utf-8")
    run_script("average_checkpoints", ["--run_dir", str(run), "--list_checkpoints"], monkeypatch)
    assert capsys.readouterr().out.splitlines() == [str(run / f"checkpoint-{s}") for s in (2, 9, 10)]
    monkeypatch.setattr(
        sys, "argv", ["x", "--run_dir", str(run), "--list_checkpoints", "--output_dir", "out"]
    )
    with pytest.raises(SystemExit) as exit_info:  # a usage error: --list_checkpoints writes nothing
        runpy.run_path(str(REPO / "scripts" / "average_checkpoints.py"), run_name="__main__")
    assert exit_info.value.code == 2 and "give only --run_dir" in capsys.readouterr().err

    run = tmp_path / "multi30k-base-3" / "train"
    fake_run(run, [10, 2, 9])
    output = tmp_path / "averaged"
    run_script(
        "average_checkpoints",
        ["--run_dir", str(run), "--last_n", "2", "--output_dir", str(output)],
        monkeypatch,
    )
    recorded = json.loads((output / "averaged_checkpoints.json").read_text(encoding="utf-8"))
    assert recorded["averaged_checkpoints"] == [str(run / "checkpoint-9"), str(run / "checkpoint-10")]
    averaged = AutoModelForSeq2SeqLM.from_pretrained(output).state_dict()
    nine, ten = (AutoModelForSeq2SeqLM.from_pretrained(run / f"checkpoint-{s}").state_dict() for s in (9, 10))
    assert averaged.keys() == ten.keys()
    assert all(torch.allclose(averaged[k], (nine[k] + ten[k]) / 2, atol=1e-6) for k in averaged)


@pytest.fixture
def model_dir(tmp_path: Path, tokenizer: PreTrainedTokenizerFast) -> Path:
    folder = tmp_path / "model"
    tiny_model().save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def test_translate_script(tmp_path: Path, model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "in.txt").write_text("w1 w2 w3\nw4\nw5 w6\n", encoding="utf-8")
    argv = [
        "--model_name_or_path",
        str(model_dir),
        "--input_file",
        str(tmp_path / "in.txt"),
        "--device",
        "cpu",
    ]
    run_script(
        "translate", [*argv, "--output_file", str(tmp_path / "out.txt"), "--num_beams", "2"], monkeypatch
    )
    assert len((tmp_path / "out.txt").read_text(encoding="utf-8").splitlines()) == 3


def test_evaluate_bleu_script(tmp_path: Path, model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_pairs(tmp_path / "data", "val", word_pairs(4))
    argv = ["--model_name_or_path", str(model_dir), "--validation_files", str(tmp_path / "data" / "val")]
    argv += ["--source_lang", "de", "--target_lang", "en", "--split", "validation", "--device", "cpu"]
    run_script("evaluate_bleu", [*argv, "--output_dir", str(tmp_path / "eval")], monkeypatch)
    results = json.loads((tmp_path / "eval" / "validation.results.json").read_text(encoding="utf-8"))
    assert results["model"] == str(model_dir) and results["num_segments"] == 4
    assert 0.0 <= results["bleu"] <= 100.0
    assert len((tmp_path / "eval" / "validation.hyp.en").read_text(encoding="utf-8").splitlines()) == 4


@pytest.mark.slow  # ~50 s: torch's dynamo ONNX exporter
def test_export_onnx_script(tmp_path: Path, model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("onnx", reason="scripts/export_onnx.py needs pip install 'hf_vanilla[onnx]'")
    pytest.importorskip("onnxruntime", reason="scripts/export_onnx.py needs pip install 'hf_vanilla[onnx]'")
    run_script(
        "export_onnx", ["--model_dir", str(model_dir), "--output_dir", str(tmp_path / "onnx")], monkeypatch
    )
    assert (tmp_path / "onnx" / "encoder.onnx").is_file()
    assert (tmp_path / "onnx" / "decoder_with_past.onnx").is_file()


def test_export_ctranslate2_script(tmp_path: Path, model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ctranslate2 = pytest.importorskip("ctranslate2", reason="needs pip install 'hf_vanilla[ct2]'")
    out = tmp_path / "ct2"
    run_script("export_ctranslate2", ["--model_dir", str(model_dir), "--output_dir", str(out)], monkeypatch)
    translator = ctranslate2.Translator(str(out), device="cpu")
    [result] = translator.translate_batch([["w1", "w2", "</s>"]], beam_size=2, max_decoding_length=8)
    assert len(result.hypotheses) == 1


@pytest.mark.slow
def test_gpu_check_dry_run_on_cpu(tmp_path: Path) -> None:
    """``scripts/gpu_check.py --device cpu``, the dry run its docstring gives, shrunk: it writes its report."""
    command = [sys.executable, str(REPO / "scripts" / "gpu_check.py"), "--device", "cpu", "--sizes", "tiny"]
    command += ["--batch_size", "2", "--source_length", "8", "--target_length", "8", "--vocab_size", "300"]
    command += ["--warmup", "0", "--steps", "1", "--fp16_check", "false", "--fsdp_smoke", "false"]
    command += ["--recipe_size", "tiny", "--recipe_max_tokens", "96", "--recipe_accumulation", "2"]
    command += ["--output_dir", str(tmp_path / "out")]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((tmp_path / "out" / "gpu_check.json").read_text(encoding="utf-8"))
    [row] = report["steps"]
    assert row["size"] == "tiny" and row["loss_finite"] and row["checkpointed"]["loss_finite"]
    recipe = report["recipe_step"]  # the WMT14 recipe's step: token-budget micro-batches, padding counted
    assert recipe["tokens_per_s"] > 0 and 0 < recipe["padding_efficiency"] <= 1 and recipe["mfu"] is None
    assert "WMT14 recipe step (tiny, bf16, 2 x 96 tokens" in done.stdout
