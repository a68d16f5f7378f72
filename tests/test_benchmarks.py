"""The benchmark scripts still run end to end (tiny size: plumbing, not speed). Their numbers are in
benchmarks/RESULTS.md; these tests only keep the scripts from rotting between measuring rounds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def _run(script: str, tmp_path: Path, *args: str) -> dict:
    out = tmp_path / f"{script}.json"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TMPDIR": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), *args, "--json_out", str(out)],
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
        "bench.py",
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
    report = _run("peers.py", tmp_path, "--size", "tiny", "--repeats", "1", "--new_tokens", "4")
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
    report = _run("onnx_generate.py", tmp_path, "--size", "tiny", "--repeats", "1", "--new_tokens", "4")
    assert [(case["batch"], case["beams"]) for case in report["cases"]] == [(1, 1), (1, 4), (16, 1), (16, 4)]
    assert all(case["onnxruntime_speedup"] > 0 for case in report["cases"])
    assert report["machine"]["cpu"]
