"""Timing for benchmarks/marian/run.py: interleaved measurement and the machine's own limits.

Calls are run A B A B … in one process after warm-ups (:func:`interleave`); a speed ratio is taken per
back-to-back pair (:func:`pair_ratios`), which cancels most of the drift of a shared machine, and the
1-minute load average is recorded with every measurement. The fp32 GEMM peak and the copy bandwidth
are measured in the same run (:func:`measure_gemm_peak`, :func:`measure_bandwidth`).
"""

from __future__ import annotations

import gc
import os
import platform
import statistics
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

#: The two timed contestants; a ratio is OURS's speed over MARIAN's.
OURS, MARIAN = "hf_vanilla", "Marian"


def load_average() -> float:
    return os.getloadavg()[0]


def measure_gemm_peak(n: int = 2048, repeats: int = 8) -> dict[str, float]:
    a, b = torch.randn(n, n), torch.randn(n, n)
    out = torch.empty(n, n)
    torch.matmul(a, b, out=out)
    rates = []
    for _ in range(repeats):
        start = time.perf_counter()
        torch.matmul(a, b, out=out)
        rates.append(2 * n**3 / (time.perf_counter() - start))
    return {"peak_gflops": max(rates) / 1e9, "median_gflops": statistics.median(rates) / 1e9, "n": n}


def measure_bandwidth(megabytes: int = 512, repeats: int = 6) -> dict[str, float]:
    """Copy bandwidth: bytes read + bytes written per second for a tensor far larger than the caches."""
    src = torch.randn(megabytes * 2**20 // 4)
    dst = torch.empty_like(src)
    dst.copy_(src)
    rates = []
    for _ in range(repeats):
        start = time.perf_counter()
        dst.copy_(src)
        rates.append(2 * src.numel() * 4 / (time.perf_counter() - start))
    return {
        "best_gbs": max(rates) / 1e9,
        "median_gbs": statistics.median(rates) / 1e9,
        "megabytes": megabytes,
    }


def read_bandwidth(megabytes: int = 512, repeats: int = 8) -> float:
    """Best bytes read per second by ``sum`` over a tensor far larger than the caches (GB/s)."""
    data = torch.ones(megabytes * 2**20 // 4)
    data.sum()
    rates = []
    for _ in range(repeats):
        start = time.perf_counter()
        data.sum()
        rates.append(data.numel() * 4 / (time.perf_counter() - start))
    return max(rates) / 1e9


def machine_description() -> dict[str, Any]:
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        model = next(
            (line.split(":", 1)[1].strip() for line in lscpu.splitlines() if "Model name" in line), ""
        )
        flags = next(
            (line.split(":", 1)[1].split() for line in lscpu.splitlines() if line.startswith("Flags")), []
        )
    except (OSError, subprocess.CalledProcessError):
        model, flags = platform.processor(), []
    simd = "AVX-512" if "avx512f" in flags else ("AVX2" if "avx2" in flags else "no AVX2")
    return {
        "cpu": model,
        "simd": simd,
        "logical_cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "uptime": subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip(),
    }


@dataclass
class Timing:
    seconds: list[float] = field(default_factory=list)
    load: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)


def interleave(
    calls: dict[str, Callable[[], object]], warmup: int, repeats: int, clock: str = "wall"
) -> dict[str, Timing]:
    """Run the calls A B A B …: ``warmup`` untimed rounds, then ``repeats`` timed rounds."""
    timer = time.process_time if clock == "cpu" else time.perf_counter
    for _ in range(warmup):
        for call in calls.values():
            call()
    timings = {name: Timing() for name in calls}
    for _ in range(repeats):
        for name, call in calls.items():
            gc.collect()
            load = load_average()
            start = timer()
            call()
            timings[name].seconds.append(timer() - start)
            timings[name].load.append(load)
    return timings


def pair_ratios(timings: dict[str, Timing]) -> list[float]:
    """Per-round speed ratios hf_vanilla / Marian (Marian time ÷ hf_vanilla time; > 1 = faster)."""
    return [m / o for o, m in zip(timings[OURS].seconds, timings[MARIAN].seconds, strict=True)]


@dataclass
class Row:
    case: str
    unit: str
    timings: dict[str, Timing]
    steps: float
    tokens: float
    flops: float
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self, peak_gflops: float) -> dict[str, Any]:
        out: dict[str, Any] = {"case": self.case, "unit": self.unit, **self.extra}
        for name, timing in self.timings.items():
            out[name] = {
                "seconds": timing.seconds,
                "load": timing.load,
                "ms_per_step": timing.median * 1e3 / self.steps,
                "tokens_per_s": self.tokens / timing.median,
                "pct_peak": 100 * self.flops / timing.median / (peak_gflops * 1e9),
            }
        out["ratio"] = pair_ratios(self.timings)
        return out
