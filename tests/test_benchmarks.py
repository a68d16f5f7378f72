"""The benchmarks still run end to end (tiny size: plumbing, not speed), and benchmarks/RESULTS.md is what
their JSON gives. The numbers are in benchmarks/RESULTS.md; these tests only keep the code from rotting
between measuring rounds."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import ending_model, randomize, sources, tiny_model, word_tokenizer

from benchmarks.common.results import render_run
from benchmarks.render import COMPARISONS, render_results

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "benchmarks"


def _run(module: str, tmp_path: Path, *args: str) -> dict:
    """``python -m benchmarks.<module> ARGS --json_out FILE`` from another folder; the JSON it wrote."""
    out = tmp_path / f"{module}.json"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TMPDIR": str(tmp_path), "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-m", f"benchmarks.{module}", *args, "--json_out", str(out)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,  # bench.py at tiny size ran past 600 s on 2 cores at load 14 (it compiles)
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.slow
def test_bench_runs_every_case_against_marian_at_tiny_size(tmp_path: Path) -> None:
    report = _run(
        "marian.run",
        tmp_path,
        "--size",
        "tiny",
        "--quick",
        "--cases",
        "train,generate,linear,memory,compiled,peers",
    )
    assert report["check"]["same_beam_output"] and report["check"]["max_abs_logit_diff"] < 1e-3
    cases = [row["case"] for row in report["rows"]]
    assert any(case.startswith("train step") for case in cases)
    assert sum(case.startswith("generate") for case in cases) >= 4
    assert all(min(row["ratio"]) > 0 for row in report["rows"])
    assert report["memory"] and report["compiled"]
    assert [row["case"] for row in report["peers"]["rows"]][-1] == "beam 4, batch 32"
    assert "ct2 int8" in report["peers"]["rows"][-1]["ms_per_step"]


@pytest.mark.slow
def test_peers_decode_exactly_the_asked_tokens_with_every_engine(tmp_path: Path) -> None:
    """peers.py raises if any engine returns other than ``--new_tokens`` tokens; every route and both
    CTranslate2 types appear in every case, and the temporary model folders are removed."""
    report = _run("ct2.run", tmp_path, "--size", "tiny", "--repeats", "1", "--new_tokens", "4")
    engines = {f"hf {route}" for route in report["args"]["routes"].split(",")} | {"ct2 float32", "ct2 int8"}
    assert [row["case"] for row in report["rows"]] == [
        "greedy, batch 1",
        "beam 4, batch 1",
        "greedy, batch 32",
        "beam 4, batch 32",
    ]
    assert all(set(row["ms_per_step"]) == engines for row in report["rows"])
    assert not list(tmp_path.glob("hf-vanilla-peers-*"))


@pytest.mark.slow
def test_onnx_generate_benchmark_times_equal_outputs_in_every_case(tmp_path: Path) -> None:
    """onnx_generate.py raises if ONNX Runtime's tokens differ from PyTorch's in any case."""
    pytest.importorskip(
        "onnxruntime", reason="the ONNX route needs the `onnx` extra: pip install -e '.[onnx]'"
    )
    report = _run(
        "experiments.onnx_generate", tmp_path, "--size", "tiny", "--repeats", "1", "--new_tokens", "4"
    )
    assert [(case["batch"], case["beams"]) for case in report["cases"]] == [(1, 1), (1, 4), (16, 1), (16, 4)]
    assert all(case["onnxruntime_speedup"] > 0 for case in report["cases"])
    assert report["machine"]["cpu"]


@pytest.mark.slow
@pytest.mark.parametrize("beams", [1, 4])
def test_compiled_step_decodes_as_generate_and_its_eager_self(tmp_path: Path, beams: int) -> None:
    """The measuring step of compiled_step.py is the model's decoder: greedy, it picks generate()'s
    tokens (eager and compiled); with beams, compiled and eager pick the same tokens; the int8 step
    (PT2E, needs torchao) runs and reports how many of its tokens are fp32's."""
    pytest.importorskip("torchao", reason="the int8 step needs the `quant` extra: pip install -e '.[quant]'")
    report = _run(
        "experiments.compiled_step",
        tmp_path,
        *("--size", "tiny", "--batch_size", "2", "--beams", str(beams)),
        *("--new_tokens", "4", "--source_length", "5", "--repeats", "1", "--warmup", "0"),
    )
    rows = report["rows"]
    assert set(rows) == {"generate", "step", "compiled", "compiled-int8"}
    compared = {mode for mode, row in rows.items() if row["tokens_equal_first_mode"] is not None}
    assert compared == ({"generate", "step", "compiled"} if beams == 1 else {"step", "compiled"})
    assert all(rows[mode]["tokens_equal_first_mode"] for mode in compared)
    assert all(row["ms_per_step"] > 0 for row in rows.values())
    assert 0 <= rows["compiled-int8"]["token_agreement"] <= 1


@pytest.mark.parametrize("beams", [1, 4])
def test_replay_decodes_as_the_model_without_computing_it(beams: int) -> None:
    """real_text.py's ``replay`` route: replaying the recorded outputs gives the model's translations
    (beam search drops sentences as they finish, so the batch shrinks as in the real run), and the
    replay computes nothing: with the weights zeroed after recording it still gives them."""
    import torch

    from benchmarks.real_text.worker import Replay
    from hf_vanilla.inference.options import DecodingOptions
    from hf_vanilla.inference.translation import translate

    model, tokenizer = randomize(tiny_model(), 0), word_tokenizer()
    sentences = [" ".join(f"w{(5 * i + j) % 90}" for j in range(1 + i % 6)) for i in range(9)]
    options = DecodingOptions(num_beams=beams, early_stopping="never")

    def run() -> list[str]:
        return translate(model, tokenizer, sentences, options, batch_size=4, device="cpu")

    replay = Replay(model)
    recorded = replay.record(run)
    assert recorded == run()  # recording changes nothing, and leaves the model as it was
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.zero_()
    assert run() != recorded  # the zeroed model translates otherwise ...
    assert replay.replaying(run) == recorded  # ... the replay does not run it


@pytest.mark.parametrize("drop", [True, False])
def test_profile_counts_rows_of_finished_sentences_only_where_the_loop_keeps_them(drop: bool) -> None:
    """real_text_profile.py's share of the forward spent on sentences whose search is over: beam search
    that drops them computes none (the next forward has only the open sentences' rows); transformers'
    own loop computes some, when sentences of a batch end at different steps."""
    import torch

    from benchmarks.real_text.profile import StepTimer

    model = ending_model(0)
    model.drop_finished_sentences = drop
    timer = StepTimer(model)
    with torch.no_grad():
        model.generate(**sources(0), num_beams=4, early_stopping=True)
    finished = [share for _, share in timer.steps]
    assert len(finished) > 3 and all(0 <= share < 1 for share in finished)
    assert (max(finished) == 0) == drop


def _real_text_inputs(tmp_path: Path) -> tuple[Path, Path]:
    """A tiny model folder with its tokenizer, and a data folder with ``val.{de,en}.gz`` of 12 lines."""
    model_dir, data_dir = tmp_path / "model", tmp_path / "data"
    randomize(tiny_model(), 0).save_pretrained(model_dir)
    word_tokenizer().save_pretrained(model_dir)
    data_dir.mkdir()
    lines = [" ".join(f"w{(3 * i + j) % 90}" for j in range(2 + i % 7)) for i in range(12)]
    for lang in ("de", "en"):
        with gzip.open(data_dir / f"val.{lang}.gz", "wt", encoding="utf-8") as handle:
            handle.write("".join(f"{line}\n" for line in lines))
    return model_dir, data_dir


@pytest.mark.slow
def test_real_text_benchmark_times_every_mode_and_prints_its_table(tmp_path: Path) -> None:
    """real_text.py runs a case per (mode, route, decoding, batch size) in every round, on the model's
    own folder and the exports it writes, and --summarize turns its JSON into the Markdown table;
    real_text_profile.py splits generate() for a quantized route."""
    pytest.importorskip("ctranslate2", reason="the CTranslate2 routes need the `ct2` extra")
    model_dir, data_dir = _real_text_inputs(tmp_path)
    common = ("--model_dir", str(model_dir), "--data_dir", str(data_dir), "--work_dir", str(tmp_path / "w"))
    report = _run(
        "real_text.run",
        tmp_path,
        *common,
        "--routes", "fp32,int8,ct2-int8,replay",
        "--modes", "generate,cli-start",
        "--batch_sizes", "4,1",
        "--batch1_sentences", "3",
        "--rounds", "2",
    )  # fmt: skip
    cases = {run["case"] for run in report["runs"]}
    assert {"generate/fp32/never/b4", "generate/int8/true/b1", "generate/ct2-int8/beam4/b4"} <= cases
    assert {"generate/replay/never/b4", "generate/replay/greedy/b1"} <= cases  # and no replay command
    assert not any(case.startswith("cli-start/replay") for case in cases)
    bleu = {run["case"]: run["bleu"] for run in report["runs"]}
    assert bleu["generate/replay/true/b4"] == bleu["generate/fp32/true/b4"]  # the same translations
    assert {"cli-start/fp32/greedy/b1", "cli-start/ct2-int8/greedy/b1"} <= cases
    assert all(sum(run["case"] == case for run in report["runs"]) == 2 for case in cases)
    assert {run["sentences"] for run in report["runs"] if run["case"].endswith("/b4")} == {12}
    assert {run["sentences"] for run in report["runs"] if run["case"].startswith("generate/") and
            run["case"].endswith("/b1")} == {3}  # fmt: skip
    table = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.real_text.run",
            "--summarize",
            str(tmp_path / "real_text.run.json"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert table.startswith("| case |") and "| generate/ct2-int8/beam4/b4 | 12 |" in table
    profile = _run(
        "real_text.profile",
        tmp_path,
        "--model_dir", str(model_dir),
        "--data_dir", str(data_dir),
        "--batch_size", "4",
        "--quantization", "dynamic-int8",
    )  # fmt: skip
    assert profile["batches"] == 3 and profile["steps"] > 0
    assert 0 < profile["forward"] < profile["generate"] and profile["search"] > 0


@pytest.mark.slow
def test_linear_kernels_times_both_kernels_and_translates_alike(tmp_path: Path) -> None:
    """linear_kernels.py times F.linear and oneDNN on every shape and row count, and translates with the
    fast path forced through each: the same translations."""
    model_dir, data_dir = _real_text_inputs(tmp_path)
    report = _run(
        "experiments.linear_kernels",
        tmp_path,
        "--calls", "2",
        "--repeats", "1",
        "--rounds", "1",
        "--model_dir", str(model_dir),
        "--data_dir", str(data_dir),
        "--batch_sizes", "4,1",
        "--batch1_sentences", "3",
    )  # fmt: skip
    assert len(report["kernels"]) == 8 * 4
    assert all(row["us"]["F.linear"] > 0 and row["us"]["oneDNN"] > 0 for row in report["kernels"])
    assert [case["batch_size"] for case in report["translation"]] == [4, 1]
    assert [case["sentences"] for case in report["translation"]] == [12, 3]
    assert all(case["equal"] for case in report["translation"])


def test_results_md_is_what_the_committed_json_gives() -> None:
    """benchmarks/RESULTS.md is written by ``python -m benchmarks.render`` from the JSON files, never by hand:
    every table there renders from a results file, with its command, machine, CPU flags, date and versions."""
    assert (BENCHMARKS / "RESULTS.md").read_text(encoding="utf-8") == render_results()
    for comparison in COMPARISONS:
        assert (BENCHMARKS / comparison.folder / "run.py").is_file(), comparison.folder


META = {
    "command": "python -m benchmarks.x.run --size tiny",
    "date": "2026-12-05",
    "machine": {"cpu": "Some CPU", "logical_cpus": 2, "flags": ["avx2", "avx512f"]},
    "versions": {"torch": "2.13.0"},
}


def _rendered(report: dict, table: dict) -> list[str]:
    """The table's lines as RESULTS.md shows them, after checking the run's header lines are there."""
    text = render_run({"meta": META, **report, "table": table})
    assert (
        "- command: `python -m benchmarks.x.run --size tiny`" in text and "- CPU flags: avx2, avx512f" in text
    )
    assert "- date: 2026-12-05" in text and "- versions: torch 2.13.0" in text
    return [line for line in text.splitlines() if line.startswith("| ")]


def test_each_comparison_turns_its_report_into_its_table() -> None:
    """Each comparison's ``table`` reads the JSON its run writes (here a small hand-made one) and gives rows
    that render under their columns: the renderer cannot rot while the runs change."""
    from benchmarks.ct2.run import table as ct2_table
    from benchmarks.data_path.run import table as data_path_table
    from benchmarks.gpu.run import table as gpu_table
    from benchmarks.marian.report import table as marian_table
    from benchmarks.real_text.run import table as real_text_table

    timing = {"ms_per_step": 10.0, "seconds": [0.1], "load": [1.0], "tokens_per_s": 1.0, "pct_peak": 1.0}
    marian = {
        "args": {"size": "tiny"},
        "rows": [{"case": "greedy, batch 1", "unit": "ms/token", "hf_vanilla": timing, "Marian": {**timing, "ms_per_step": 15.0}, "ratio": [1.4, 1.5, 1.6]}],
        "memory": {"hf_vanilla": {"peak": 3 << 20, "baseline": 1 << 20}, "Marian": {"peak": 5 << 20, "baseline": 1 << 20}},
    }  # fmt: skip
    assert _rendered(marian, marian_table(marian))[1:] == [
        "| greedy, batch 1 | ms/token | 10.0 | 15.0 | **1.50×** [1.40–1.60] |",
        "| peak training memory | MB | 2 | 4 | 0.50× the memory |",
    ]
    ct2 = {
        "args": {"size": "tiny", "repeats": 3, "new_tokens": 4},
        "rows": [{"case": "greedy, batch 1", "ms_per_step": {"hf none": 4.0, "ct2 int8": 2.0}, "vs_ct2_int8": {"hf none": 0.5, "ct2 int8": 1.0}}],
    }  # fmt: skip
    assert _rendered(ct2, ct2_table(ct2))[1:] == ["| greedy, batch 1 | 4.0 (0.50×) | 2.0 |"]
    runs = [
        {
            "case": "generate/int8/true/b32",
            "seconds": s,
            "sentences": 4,
            "source_words": 20,
            "bleu": 30.0,
            "load": 1.0,
        }
        for s in (2.0, 4.0)
    ]
    assert _rendered({"runs": runs}, real_text_table(runs))[1:] == [
        "| generate/int8/true/b32 | 4 | 3.00 | 2.00–4.00 | 7 | 30.00 | 2 | 1.0–1.0 |"
    ]
    stages = {
        "stages": [
            {
                "stage": "read",
                "pairs": 1000,
                "wall_s": 1.5,
                "cpu_s": 1.2,
                "peak_gb": 0.5,
                "peak_anon_gb": 0.25,
            }
        ]
    }
    assert _rendered(stages, data_path_table(stages))[1:] == ["| read | 1,000 | 1.5 | 1 | 0.50 / 0.25 |"]
    step = {"size": "base", "parameters_m": 63.0, "step_ms": 100.0, "tokens_per_s": 1000.0, "mfu": 0.5}
    gpu = {
        "environment": {"device": "NVIDIA H200"},
        "steps": [step],
        "recipe_step": None,
        "checks": [{"check": "fsdp", "ok": True}],
    }
    assert _rendered(gpu, gpu_table(gpu))[1:] == [
        "| bf16 training step, base (63.0 M parameters) | 100.0 ms, 1000 tokens/s, MFU 50.0% |",
        "| fsdp | OK |",
    ]


def test_the_serving_table_says_when_the_machine_was_under_load() -> None:
    """The serving comparison's ``table`` reads its run's JSON (here a small hand-made one): one row per
    backend and setting under their columns, and the note names a load average above the CPUs."""
    from benchmarks.serving.run import table as serving_table

    arguments = {
        "clients": 8,
        "requests": 16,
        "texts": 2,
        "new_tokens": 16,
        "d_model": 256,
        "layers": 3,
        "threads": 1,
    }
    figures = {
        "requests_per_s": 15.4,
        "sentences_per_s": 30.8,
        "p50_ms": 480.0,
        "p95_ms": 841.0,
        "p99_ms": 850.0,
    }

    def serving(load: list[float]) -> dict:
        rows = [{"backend": "transformers", "setting": "batched", **figures, "batches": 32, "load": load}]
        return {"meta": META, "arguments": arguments, "rows": rows}

    loaded = serving([5.5, 6.0])
    table = serving_table(loaded)
    assert _rendered(loaded, table) == [
        "| backend | setting | requests/s | sentences/s | p50 ms | p95 ms | p99 ms | batches | load |",
        "| transformers | batched | 15.4 | 30.8 | 480.0 | 841.0 | 850.0 | 32 | 5.5–6.0 |",
    ]
    assert "8 clients × 16 requests of 2 sentences" in table["title"]
    assert "shared machine under load" in table["note"]
    assert "shared machine" not in serving_table(serving([0.5, 1.0]))["note"]


def test_the_scale_out_table_gives_the_speed_up_and_says_when_the_machine_was_under_load() -> None:
    """The scale-out comparison's ``table`` reads its run's JSON (here a small hand-made one): one row per
    case with its speed-up and CPU-time bound, and the note names a load average above the CPUs."""
    from benchmarks.scale_out.run import table as scale_out_table

    arguments = {
        "sentences": 2000,
        "d_model": 512,
        "layers": 6,
        "max_length": 24,
        "batch_size": 32,
        "rounds": 3,
    }

    def scale_out(load: list[float], same: bool = True) -> dict:
        rows = [
            {"case": "1 process x 1 thread", "median_s": 60.0, "tokens_per_s": 800.0, "cpu_s": 56.6, "load": load},
            {"case": "2 processes x 1 thread (torchrun)", "median_s": 40.0, "tokens_per_s": 1200.0, "cpu_s": 65.4, "load": load},
        ]  # fmt: skip
        return {"meta": META, "arguments": arguments, "rows": rows, "output_tokens": 48000,
                "same_output": same, "speedup": 1.5, "cpu_bound_speedup": 1.731}  # fmt: skip

    loaded = scale_out([2.5, 3.5])
    table = scale_out_table(loaded)
    assert _rendered(loaded, table) == [
        "| case | median s | output tokens/s | CPU s | speed-up | CPU-time bound | load |",
        "| 1 process x 1 thread | 60.0 | 800 | 56.6 | 1.00× |  | 2.5–3.5 |",
        "| 2 processes x 1 thread (torchrun) | 40.0 | 1200 | 65.4 | **1.50×** | 1.73× | 2.5–3.5 |",
    ]
    assert "2,000 sentences, d_model 512, 6 + 6 layers" in table["title"]
    assert "shared machine under load" in table["note"] and "were the same bytes" in table["note"]
    idle = scale_out_table(scale_out([0.5, 1.0], same=False))["note"]
    assert "shared machine" not in idle and "were not the same bytes" in idle


@pytest.mark.slow
def test_scale_out_benchmark_translates_alike_on_two_processes(tmp_path: Path) -> None:
    """The scale-out benchmark at tiny size (plumbing, not speed): both runs give the same output, and its
    JSON has a row per case with the load around it, and a table that renders."""
    report = _run("scale_out.run", tmp_path, "--sentences", "6", "--d_model", "64", "--layers", "1",
                  "--max_length", "8", "--rounds", "1")  # fmt: skip
    assert report["same_output"] is True and report["output_tokens"] > 0
    assert [row["case"] for row in report["rows"]] == [
        "1 process x 1 thread",
        "2 processes x 1 thread (torchrun)",
    ]
    assert all(len(row["seconds"]) == 1 and len(row["load"]) == 2 for row in report["rows"])
    assert report["meta"]["command"].startswith("python -m benchmarks.scale_out.run --sentences 6")
    assert len([line for line in render_run(report).splitlines() if line.startswith("| ")]) == 3


def test_a_row_that_does_not_fit_its_columns_is_refused() -> None:
    table = {"title": "t", "columns": ["a", "b"], "rows": [["only one"]]}
    with pytest.raises(ValueError, match="a row of 1 cells under 2 columns"):
        render_run({"meta": META, "table": table})


@pytest.mark.slow
@pytest.mark.parametrize("model", ["folder", "package"])
def test_training_precision_times_both_modes_step_by_step(tmp_path: Path, model: str) -> None:
    """training_precision.py times float32 and bf16-autocast training steps in back-to-back pairs, on
    both clocks, of the folder's class or of the installed package's."""
    report = _run(
        "experiments.training_precision", tmp_path,
        "--d_model", "16", "--layers", "1", "--heads", "2", "--ffn_dim", "32", "--vocab_size", "64",
        "--batch_size", "4", "--steps", "2", "--warmup", "1", "--model", model,
    )  # fmt: skip
    assert report["settings"]["model"] == model
    for mode in ("fp32", "bf16"):
        assert [len(report["ms_per_step"][mode][clock]) for clock in ("wall", "cpu", "load")] == [2, 2, 2]
    assert all(len(report["ratio_fp32_over_bf16"][clock]) == 2 for clock in ("wall", "cpu"))
