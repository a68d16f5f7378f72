"""Report for benchmarks/marian/run.py: the markdown tables printed at the end of a run."""

from __future__ import annotations

import statistics
import subprocess
from collections.abc import Sequence
from typing import Any

from benchmarks.common.timing import MARIAN, OURS, Row, Timing, pair_ratios
from benchmarks.common.workloads import SIZES
from benchmarks.marian.options import BenchArguments


def fmt_ms(timing: Timing, per: float) -> str:
    values = [s * 1e3 / per for s in timing.seconds]
    return f"{statistics.median(values):.1f} [{min(values):.1f}–{max(values):.1f}]"


def fmt_ratio(ratios: Sequence[float]) -> str:
    return f"**{statistics.median(ratios):.2f}×** [{min(ratios):.2f}–{max(ratios):.2f}]"


def table(report: dict[str, Any]) -> dict[str, Any]:
    """The comparison's table for benchmarks/RESULTS.md (:mod:`benchmarks.common.results`) from the JSON
    report: per case, each model's median ms and hf_vanilla's speed over Marian's."""
    size = report["args"]["size"]
    rows = [
        [
            row["case"],
            row["unit"],
            f"{row[OURS]['ms_per_step']:.1f}",
            f"{row[MARIAN]['ms_per_step']:.1f}",
            fmt_ratio(row["ratio"]),
        ]
        for row in report["rows"]
    ]
    if report.get("memory"):
        ours, marian = (
            report["memory"][name]["peak"] - report["memory"][name]["baseline"] for name in (OURS, MARIAN)
        )
        rows.append(
            [
                "peak training memory",
                "MB",
                f"{ours / 2**20:.0f}",
                f"{marian / 2**20:.0f}",
                f"{ours / marian:.2f}× the memory",
            ]
        )
    return {
        "title": f"hf_vanilla against MarianMTModel, size {size}",
        "columns": [
            "case",
            "unit",
            f"{OURS} ms",
            f"{MARIAN} ms",
            f"{OURS}'s speed over {MARIAN}'s: median [min–max] of pairs",
        ],
        "rows": rows,
    }


# --------------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------------
def print_report(
    args: BenchArguments,
    machine: dict[str, Any],
    peak: dict[str, float],
    bandwidth: dict[str, float],
    rows: list[Row],
    memory: dict[str, dict[str, int]] | None,
    floor_ms: float | None,
    floor_bytes: int,
    multi30k: dict[str, Any] | None,
    check: dict[str, Any],
) -> None:
    s = SIZES[args.size]
    print(f"\n## hf_vanilla vs MarianMTModel — size {args.size}")
    print(
        f"\nModel: vocab {s['vocab_size']} shared, {s['layers']}+{s['layers']} layers, d_model {s['d_model']}, "
        f"{s['heads']} heads, d_ff {s['ffn']}, fp32, SDPA, dropout 0.1 in training; both with attention "
        f"biases and the same weights (max |Δlogit| {check['max_abs_logit_diff']:.1e}, same beam output: "
        f"{check['same_beam_output']})."
    )
    print(
        f"Machine: {machine['cpu']} ({machine['simd']}), {machine['logical_cpus']} logical CPUs, torch "
        f"{machine['torch']} with {machine['torch_threads']} threads; fp32 GEMM peak {peak['peak_gflops']:.0f} "
        f"GFLOP/s (best of the start and the end of the run; medians {peak['median_gflops']:.0f} and "
        f"{peak.get('end_median_gflops', float('nan')):.0f}; {peak['n']}³ matmul); copy bandwidth "
        f"{bandwidth['best_gbs']:.1f} GB/s (medians {bandwidth['median_gbs']:.1f} and "
        f"{bandwidth.get('end_median_gbs', float('nan')):.1f}); load at start: {machine['uptime']}."
    )
    print(
        f"\nClock: {args.clock} time. Each cell: median [min–max] over the timed repeats; the ratio is hf_vanilla's speed over Marian's, "
        "the median [min–max] of back-to-back pairs; % peak = useful matmul FLOP/s ÷ the GEMM peak above.\n"
    )
    print(
        f"| case | unit | {OURS} | {MARIAN} | {OURS} tokens/s | {MARIAN} tokens/s | % peak ({OURS} / {MARIAN}) "
        "| speed ratio | load (1 min) |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    peak_flops = peak["peak_gflops"] * 1e9
    for row in rows:
        o, m = row.timings[OURS], row.timings[MARIAN]
        loads = o.load + m.load
        print(
            f"| {row.case} | {row.unit} | {fmt_ms(o, row.steps)} | {fmt_ms(m, row.steps)} "
            f"| {row.tokens / o.median:.0f} | {row.tokens / m.median:.0f} "
            f"| {100 * row.flops / o.median / peak_flops:.0f} % / {100 * row.flops / m.median / peak_flops:.0f} % "
            f"| {fmt_ratio(pair_ratios(row.timings))} | {min(loads):.2f}–{max(loads):.2f} |"
        )
    if memory is not None:
        o, m = (memory[name]["peak"] - memory[name]["baseline"] for name in (OURS, MARIAN))
        print(
            f"| peak training memory (RSS high-water mark above the imports, fresh process per model) | MB "
            f"| {o / 2**20:.0f} | {m / 2**20:.0f} | | | | **{o / m:.2f}×** (memory ratio, lower is better) | |"
        )
    if floor_ms is not None:
        greedy = next(
            (row for row in rows if row.extra.get("beams") == 1 and row.extra.get("batch") == 1), None
        )
        line = (
            f"\nMemory-bandwidth floor of greedy batch-1 decoding: {floor_bytes / 1e6:.0f} MB of weights per step "
            f"÷ {bandwidth['best_gbs']:.1f} GB/s = **{floor_ms:.2f} ms/step**"
        )
        if greedy is not None:
            line += (
                f"; measured {OURS} {greedy.timings[OURS].median * 1e3 / greedy.steps:.2f} ms/step "
                f"= {greedy.timings[OURS].median * 1e3 / greedy.steps / floor_ms:.2f}× the floor, {MARIAN} "
                f"{greedy.timings[MARIAN].median * 1e3 / greedy.steps / floor_ms:.2f}×."
            )
        print(line)
    if multi30k is not None:
        print(
            f"\nReal data: {multi30k['sentences']} shuffled Multi30k pairs ({args.multi30k_source}→"
            f"{args.multi30k_target}, BPE, one epoch each), train steps interleaved. {OURS}: token-budget batches "
            f"(≤ {multi30k['max_tokens']} padded source + target tokens); {MARIAN}: Trainer-style batches of "
            f"{multi30k['sentence_batch']} sentences in random order, padded to the longest.\n"
        )
        print(
            "| model | steps | real target tokens | target padding | source padding | seconds | real target tokens/s |"
        )
        print("|---|---|---|---|---|---|---|")
        for name in (OURS, MARIAN):
            r = multi30k[name]
            print(
                f"| {name} | {r['steps']} | {r['real_target_tokens']} "
                f"| {100 * (1 - r['real_target_tokens'] / r['padded_target_tokens']):.0f} % "
                f"| {100 * (1 - r['real_source_tokens'] / r['padded_source_tokens']):.0f} % "
                f"| {r['seconds']:.1f} | {r['real_target_tokens_per_s']:.0f} |"
            )
        ratio = multi30k[OURS]["real_target_tokens_per_s"] / multi30k[MARIAN]["real_target_tokens_per_s"]
        print(f"\nReal target tokens/s, {OURS} / {MARIAN}: **{ratio:.2f}×**.")
    print(f"\nLoad at the end: {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}")
