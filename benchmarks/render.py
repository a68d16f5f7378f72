"""Write benchmarks/RESULTS.md, the current table of every comparison, from the JSON in
``benchmarks/<comparison>/results/``; ``--check`` only says whether the file is up to date.

    python -m benchmarks.render           # after copying a run's --json_out into a results/ folder
    python -m benchmarks.render --check
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from benchmarks.common.results import render_run

BENCHMARKS = Path(__file__).resolve().parent
RESULTS = BENCHMARKS / "RESULTS.md"


@dataclass(frozen=True)
class Comparison:
    folder: str  # benchmarks/<folder>/, run as python -m benchmarks.<folder>.run
    heading: str
    what: str  # one sentence: what is compared, and where the design is explained


COMPARISONS = [
    Comparison(
        "marian",
        "Against MarianMTModel",
        "hf_vanilla and transformers' `MarianMTModel` with the same dimensions and weights, interleaved in one"
        " process ([performance.md](../docs/performance.md#against-marianmtmodel)).",
    ),
    Comparison(
        "ct2",
        "Against CTranslate2, synthetic",
        "hf_vanilla's fp32 and quantized routes against CTranslate2 fp32 and int8 on random weights, exactly N"
        " new tokens each, every engine in its own process"
        " ([performance.md](../docs/performance.md#against-ctranslate2-on-the-cpu)).",
    ),
    Comparison(
        "real_text",
        "Real text",
        "A trained model translating the 1,014 Multi30k validation sentences through every route, against"
        " CTranslate2, with BLEU"
        " ([performance.md](../docs/performance.md#real-text-a-trained-model-real-sentences-the-whole-command)).",
    ),
    Comparison(
        "data_path",
        "Data path",
        "Tokenizer training, tokenization, token-budget batching and the first base-size step on a WMT14-size"
        " synthetic corpus ([reproducing.md](../docs/reproducing.md#data-path-at-full-size)).",
    ),
    Comparison(
        "gpu",
        "GPU check",
        "The bf16 training step at base and big size with its MFU, the WMT14 recipe's step, fp16 loss scaling"
        " and an FSDP smoke run; `python scripts/gpu_check.py` runs the same"
        " ([scaling.md](../docs/scaling.md#what-was-measured-and-what-is-not-verified)).",
    ),
    Comparison(
        "serving",
        "Serving under load",
        "`hf-vanilla-serve` answering N clients × M requests on loopback, batched against one request at a"
        " time, on the transformers and the CTranslate2 backend ([serving.md](../docs/serving.md#under-load)).",
    ),
    Comparison(
        "scale_out",
        "Corpus translation on 2 processes",
        "`hf-vanilla-translate` on a corpus under `torchrun` with 2 processes × 1 thread against 1 process × 1"
        " thread, launch to output file, with the speed-up 2 idle cores would allow by CPU time"
        " ([scaling.md](../docs/scaling.md#translating-a-corpus-on-many-processes-and-machines)).",
    ),
]

HEADER = """# Benchmark results

The current table of each comparison, written by `python -m benchmarks.render` from the JSON files in
`benchmarks/<comparison>/results/`; do not edit it by hand. Each table names its command, machine, CPU
flags, date and versions. What the numbers mean and why the code is fast is in
[docs/performance.md](../docs/performance.md); earlier rounds are in [log/](log/).
"""


def render_results(benchmarks: Path = BENCHMARKS) -> str:
    parts = [HEADER]
    for comparison in COMPARISONS:
        command = f"python -m benchmarks.{comparison.folder}.run --json_out FILE"
        parts.append(f"## {comparison.heading}\n\n{comparison.what} Command: `{command}`.\n")
        files = sorted((benchmarks / comparison.folder / "results").glob("*.json"))
        if not files:
            parts.append("Not measured yet.\n")
        parts += [render_run(json.loads(file.read_text(encoding="utf-8"))) for file in files]
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--check", action="store_true", help="Exit 1 if RESULTS.md is not what the JSON gives."
    )
    args = parser.parse_args(argv)
    text = render_results()
    if args.check:
        if RESULTS.read_text(encoding="utf-8") != text:
            sys.stderr.write("error: benchmarks/RESULTS.md is out of date: run python -m benchmarks.render\n")
            return 1
        return 0
    RESULTS.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
