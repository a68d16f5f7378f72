"""Which kernel multiplies decoding's few rows by a weight faster on this CPU: ``F.linear`` (MKL in x86
torch builds) or oneDNN's ``_linear_pointwise``, the linear fast path's kernel
(``hf_vanilla.speed.fast_paths.linear``, taken on AMD CPUs only).

Part 1 times both kernels on the decoder's weight shapes (the Multi30k recipe's d_model 256 / d_ff 1024
and transformer-base's 512 / 2048, the 8k-vocabulary output projection) at 1, 4, 32 and 128 rows,
interleaved, medians of ``--repeats`` rounds of ``--calls`` calls. Part 2 (with ``--model_dir``: a
trained model folder and the Multi30k data) translates real sentences with the fast path forced on and
off, interleaved, and checks that the translations are equal:

    python -m benchmarks.experiments.linear_kernels --model_dir runs/multi30k/averaged --batch_sizes 1,32
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from benchmarks.common.timing import interleave, load_average, machine_description
from benchmarks.real_text.run import read_lines
from hf_vanilla.speed import fast_paths

#: (input, output) features of the weights a decoding step multiplies by.
SHAPES = [
    (256, 256),
    (256, 1024),
    (1024, 256),
    (256, 8000),
    (512, 512),
    (512, 2048),
    (2048, 512),
    (512, 8000),
]
ROWS = (1, 4, 32, 128)


def kernels(rows: int, features: tuple[int, int], calls: int) -> dict[str, Callable[[], None]]:
    inputs, outputs = features
    weight, bias, x = torch.randn(outputs, inputs), torch.randn(outputs), torch.randn(rows, 1, inputs)

    def f_linear() -> None:
        for _ in range(calls):
            F.linear(x, weight, bias)

    def onednn() -> None:
        for _ in range(calls):
            torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")

    return {"F.linear": f_linear, "oneDNN": onednn}


def time_kernels(args: argparse.Namespace) -> list[dict[str, object]]:
    rows_out = []
    with torch.no_grad():
        for features in SHAPES:
            for rows in ROWS:
                timings = interleave(kernels(rows, features, args.calls), 2, args.repeats)
                us = {name: timing.median / args.calls * 1e6 for name, timing in timings.items()}
                rows_out.append({"shape": features, "rows": rows, "us": us})
                print(
                    f"{features[0]:5d}x{features[1]:<5d} rows {rows:3d}: F.linear {us['F.linear']:8.1f} µs, "
                    f"oneDNN {us['oneDNN']:8.1f} µs, oneDNN speed-up {us['F.linear'] / us['oneDNN']:.2f}",
                    flush=True,
                )
    return rows_out


def translation_call(
    model: Any,
    tokenizer: Any,
    sentences: list[str],
    options: Any,
    batch_size: int,
    outputs: dict[str, list[str]],
    kernel: str,
) -> Callable[[], None]:
    """A call that translates ``sentences`` with the linear fast path forced through ``kernel``
    ("oneDNN" or "F.linear") and keeps the translations in ``outputs[kernel]``."""
    from hf_vanilla.inference.translation import translate

    def call() -> None:
        previous, fast_paths.ONEDNN_LINEAR_CPU = fast_paths.ONEDNN_LINEAR_CPU, kernel == "oneDNN"
        try:
            outputs[kernel] = translate(
                model, tokenizer, sentences, options, batch_size=batch_size, device="cpu"
            )
        finally:
            fast_paths.ONEDNN_LINEAR_CPU = previous

    return call


def time_translation(args: argparse.Namespace) -> list[dict[str, object]]:
    from hf_vanilla.inference.loading import load_model_and_tokenizer
    from hf_vanilla.inference.options import DecodingOptions, InferenceModelArguments

    model, tokenizer = load_model_and_tokenizer(InferenceModelArguments(args.model_dir, device="cpu"))
    sentences = read_lines(Path(args.data_dir) / "val.de.gz")
    options = DecodingOptions(num_beams=args.num_beams, early_stopping=args.early_stopping)
    results = []
    for batch_size in (int(b) for b in args.batch_sizes.split(",")):
        chosen = sentences[: args.batch1_sentences] if batch_size == 1 else sentences
        outputs: dict[str, list[str]] = {}
        calls = {
            kernel: translation_call(model, tokenizer, chosen, options, batch_size, outputs, kernel)
            for kernel in ("oneDNN", "F.linear")
        }
        seconds = {name: timing.seconds for name, timing in interleave(calls, 1, args.rounds).items()}
        same = outputs["oneDNN"] == outputs["F.linear"]
        ratio = statistics.median(seconds["oneDNN"]) / statistics.median(seconds["F.linear"])
        print(
            f"translate, batch {batch_size}, {len(chosen)} sentences, beam {args.num_beams}: "
            + ", ".join(
                f"{name} {statistics.median(s):.2f} s ({min(s):.2f}–{max(s):.2f})"
                for name, s in seconds.items()
            )
            + f"; oneDNN / F.linear time {ratio:.2f}; translations equal: {same}",
            flush=True,
        )
        results.append(
            {"batch_size": batch_size, "sentences": len(chosen), "seconds": seconds, "equal": same}
        )
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--calls", type=int, default=200, help="Calls per timed round (part 1).")
    parser.add_argument("--repeats", type=int, default=5, help="Timed rounds per kernel (part 1).")
    parser.add_argument("--model_dir", help="A trained model folder: also time translation (part 2).")
    parser.add_argument("--data_dir", default="/work/shared/data/multi30k", help="Holds val.de.gz.")
    parser.add_argument("--batch_sizes", default="1,32")
    parser.add_argument("--batch1_sentences", type=int, default=100, help="Batch 1: the first N sentences.")
    parser.add_argument("--num_beams", type=int, default=4)
    parser.add_argument("--early_stopping", default="true", choices=["never", "true", "false"])
    parser.add_argument("--rounds", type=int, default=3, help="Timed rounds per route (part 2).")
    parser.add_argument("--json_out")
    args = parser.parse_args()
    if not fast_paths._ONEDNN_LINEAR:
        raise SystemExit(
            "This torch build has no oneDNN linear kernel (torch.ops.mkldnn._linear_pointwise): nothing to compare."
        )
    torch.set_num_threads(args.threads)
    vendor = fast_paths.cpu_vendor()
    print(
        f"CPU vendor {vendor!r}: the fast path takes {'oneDNN' if fast_paths.ONEDNN_LINEAR_CPU else 'F.linear'}"
    )
    result = {
        "machine": machine_description(),
        "vendor": vendor,
        "onednn_linear_cpu": fast_paths.ONEDNN_LINEAR_CPU,
        "load": load_average(),
        "kernels": time_kernels(args),
        "translation": time_translation(args) if args.model_dir else None,
    }
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(result, indent=2), encoding="utf-8")


if __name__ == "__main__":
    main()
