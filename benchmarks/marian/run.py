"""hf_vanilla against Hugging Face's own ``MarianMTModel``, the same function, side by side.

Both models get the same dimensions and the *same weights*: hf_vanilla is built with
``attention_bias=True`` (Marian's attention projections always carry biases), its state dict is
copied into Marian key for key (the attribute names are the same), and Marian's sinusoidal position
table — sin in the first half of the dimensions, cos in the second — is overwritten with the paper's
interleaved layout (sin on even, cos on odd dimensions) that hf_vanilla computes. Marian's config is
set to the paper's function: ReLU, √d_model embedding scaling, shared and tied embeddings, no forced
``</s>``. The script checks that the two produce the same logits and the same beam-search output
before it times anything, so every ratio compares one function implemented twice.

Timings are interleaved in one process (A B A B …) after warm-ups; each table cell is the median
over the repeats with the min–max in brackets, and the ratio column is the median (min–max) of the
per-pair ratios, each pair measured back to back, which cancels most of the drift of a shared
machine. The 1-minute load average is recorded with every measurement.

Run ``python -m benchmarks.marian.run --help`` for the options; ``--quick`` takes about two minutes on
two cores at ``--size base``.

The code is split by concern: ``options.py`` (the options), ``benchmarks.common.workloads`` (the
models and the cases), ``benchmarks.common.timing`` (interleaving, ratios, the machine's peak and bandwidth)
and ``report.py`` (the tables); this file is the entry point and holds the order of the run.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence

import torch
from transformers import HfArgumentParser

from benchmarks.common.results import metadata
from benchmarks.common.timing import (
    MARIAN,
    OURS,
    Row,
    load_average,
    machine_description,
    measure_bandwidth,
    measure_gemm_peak,
    pair_ratios,
)
from benchmarks.common.workloads import (
    build_configs,
    build_marian,
    build_ours,
    check_same_function,
    decode_step_weight_bytes,
    memory_child,
    run_compiled,
    run_generate,
    run_memory,
    run_multi30k,
    run_train,
)
from benchmarks.marian.options import BenchArguments
from benchmarks.marian.report import print_report, table


def main(argv: Sequence[str] | None = None) -> None:
    (args,) = HfArgumentParser(BenchArguments).parse_args_into_dataclasses(args=argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if args.memory_child is not None:
        memory_child(args)
        return
    cases = {c.strip() for c in args.cases.split(",") if c.strip()}
    unknown = cases - {"train", "generate", "linear", "memory", "multi30k", "compiled", "peers"}
    if unknown:
        raise ValueError(
            f"Unknown --cases {sorted(unknown)}: choose from train, generate, linear, memory, multi30k, compiled, "
            "peers."
        )
    if args.multi30k is not None:
        cases.add("multi30k")
    elif "multi30k" in cases:
        raise ValueError(
            "The multi30k case needs --multi30k DIR (the folder with train.de.gz and train.en.gz)."
        )
    if args.clock not in ("wall", "cpu"):
        raise ValueError(f"--clock must be wall or cpu, got {args.clock!r}.")
    repeats = args.repeats or (3 if args.quick else 5)
    new_tokens = args.new_tokens or (16 if args.quick else 64)
    lengths = [int(x) for x in (args.linear_lengths or ("16,64" if args.quick else "16,64,256")).split(",")]

    machine = machine_description()
    print(f"# {machine['uptime']}", flush=True)
    peak = measure_gemm_peak()
    bandwidth = measure_bandwidth()
    ours_config, marian_config = build_configs(args.size)
    ours = build_ours(ours_config, args.seed, args.folder_code)
    marian = build_marian(marian_config, ours)
    check = check_same_function(ours, marian, args.seed)
    rows: list[Row] = []

    def progress(row: Row) -> None:
        r = pair_ratios(row.timings)
        print(
            f"# {row.case}: {OURS} {row.timings[OURS].median * 1e3 / row.steps:.1f}, {MARIAN} "
            f"{row.timings[MARIAN].median * 1e3 / row.steps:.1f} {row.unit}, ratio {statistics.median(r):.2f} "
            f"(load {load_average():.2f})",
            flush=True,
        )

    if "generate" in cases:
        for batch, beams in ((1, 1), (1, 4), (args.batch_size, 1), (args.batch_size, 4)):
            rows.append(run_generate(ours, marian, ours_config, args, batch, beams, new_tokens, repeats))
            progress(rows[-1])
    if "linear" in cases:
        for n in lengths:
            if "generate" in cases and n == new_tokens:
                continue
            rows.append(run_generate(ours, marian, ours_config, args, 1, 1, n, repeats))
            progress(rows[-1])
    if "train" in cases:
        rows.insert(0, run_train(ours, marian, ours_config, args, repeats))
        progress(rows[0])
    compiled = []
    if "compiled" in cases:
        for batch, beams in ((1, 1), (args.batch_size, 4)):
            compiled.append(run_compiled(ours, ours_config, args, batch, beams, new_tokens, repeats))
            c = compiled[-1]
            print(
                f"# compiled {c['case']}: eager {c['eager_ms_per_token']:.1f}, compiled "
                f"{c['compiled_ms_per_token']:.1f} ms/new token, speed-up {c['speedup']:.2f} "
                f"[{c['speedup_range'][0]:.2f}–{c['speedup_range'][1]:.2f}], compiled in {c['compile_seconds']:.0f} s",
                flush=True,
            )
    peers = None
    if "peers" in cases:  # CTranslate2 (an optional dependency) and the quantized routes: benchmarks.ct2
        from benchmarks.ct2.run import PeerArguments, run

        options = {"size": args.size, "batch_size": args.batch_size, "source_length": args.source_length}
        options |= {"new_tokens": new_tokens, "repeats": repeats, "warmup": args.warmup, "seed": args.seed}
        peers = run(PeerArguments(threads=torch.get_num_threads(), **options))
    multi30k = run_multi30k(ours, marian, ours_config, args) if "multi30k" in cases else None
    memory = run_memory(args) if "memory" in cases else None
    # The machine may be shared: measure the peak and the bandwidth again at the end, keep the best.
    peak_end, bandwidth_end = measure_gemm_peak(), measure_bandwidth()
    peak = {
        **peak,
        "peak_gflops": max(peak["peak_gflops"], peak_end["peak_gflops"]),
        "end_median_gflops": peak_end["median_gflops"],
    }
    bandwidth = {
        **bandwidth,
        "best_gbs": max(bandwidth["best_gbs"], bandwidth_end["best_gbs"]),
        "end_median_gbs": bandwidth_end["median_gbs"],
    }
    floor_bytes = decode_step_weight_bytes(ours)
    floor_ms = floor_bytes / (bandwidth["best_gbs"] * 1e9) * 1e3
    print_report(args, machine, peak, bandwidth, rows, memory, floor_ms, floor_bytes, multi30k, check)
    if args.json_out:
        with open(args.json_out, "w", encoding="utf-8") as handle:
            report = {
                "meta": metadata(),
                "args": vars(args),
                "machine": machine,
                "gemm": peak,
                "bandwidth": bandwidth,
                "check": check,
                "rows": [row.as_dict(peak["peak_gflops"]) for row in rows],
                "memory": memory,
                "floor_ms": floor_ms,
                "floor_bytes": floor_bytes,
                "multi30k": multi30k,
                "compiled": compiled,
                "peers": peers,
            }
            json.dump({**report, "table": table(report)}, handle, indent=1)


if __name__ == "__main__":
    main()
