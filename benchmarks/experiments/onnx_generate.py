"""``generate()`` over ONNX Runtime against PyTorch eager on the same model.

One model of ``benchmarks.marian``'s sizes (random weights, ``</s>`` never chosen, so every engine decodes
exactly ``--new_tokens`` tokens) is exported with :func:`hf_vanilla.interop.export_onnx.export_onnx`
and loaded as :class:`~hf_vanilla.interop.onnx_generation.OnnxVanillaTransformerForConditionalGeneration`;
both decode the same random sources (``--source_length`` tokens) with the same generation config,
``--threads`` threads each (torch intra-op, ONNX Runtime intra-op). The outputs are checked equal
first. Cases: greedy and beam 4 (α = 0.6) at batch 1 and ``--batch_size``; the engines run
alternately after a warm-up, and a cell is the median ms per decoding step over ``--repeats`` rounds.

    python -m benchmarks.experiments.onnx_generate --size tiny
    python -m benchmarks.experiments.onnx_generate --size base --repeats 3
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from transformers import HfArgumentParser

from benchmarks.common.timing import interleave, machine_description
from benchmarks.common.workloads import (
    build_configs,
    build_ours,
    generation_config,
    make_generate,
    random_batch,
)
from hf_vanilla.interop.export_onnx import export_onnx
from hf_vanilla.interop.onnx_generation import OnnxVanillaTransformerForConditionalGeneration


@dataclass
class OnnxBenchArguments:
    size: str = field(
        default="tiny", metadata={"help": "Model size of benchmarks.marian: tiny, small or base."}
    )
    threads: int = field(default=2, metadata={"help": "Intra-op threads of torch and ONNX Runtime."})
    batch_size: int = field(default=16, metadata={"help": "Sentences of the large-batch cases."})
    source_length: int = field(default=32, metadata={"help": "Source tokens per sentence."})
    new_tokens: int = field(default=32, metadata={"help": "Tokens decoded per sentence (forced)."})
    repeats: int = field(default=5, metadata={"help": "Timed rounds per case."})
    warmup: int = field(default=1, metadata={"help": "Untimed rounds per case."})
    seed: int = field(default=0, metadata={"help": "Seed of the weights and the sources."})
    json_out: str | None = field(default=None, metadata={"help": "Also write the results here as JSON."})


def run(args: OnnxBenchArguments) -> dict[str, object]:
    """Export, check equal outputs, time each case; the results as a JSON-ready dict."""
    torch.set_num_threads(args.threads)
    config, _ = build_configs(args.size)
    model = build_ours(config, args.seed).eval()
    generator = torch.Generator().manual_seed(args.seed + 1)
    results: dict[str, object] = {"arguments": asdict(args), "machine": machine_description(), "cases": []}
    with tempfile.TemporaryDirectory() as tmp:
        export_onnx(model, None, Path(tmp) / "onnx")
        onnx_model = OnnxVanillaTransformerForConditionalGeneration.from_pretrained(
            Path(tmp) / "onnx", intra_op_threads=args.threads
        )
        for batch in (1, args.batch_size):
            source = random_batch(config.vocab_size, batch, args.source_length, generator)
            for beams in (1, 4):
                decoding = generation_config(beams, args.new_tokens)
                calls = {
                    "pytorch": make_generate(model, source, decoding, args.new_tokens),
                    "onnxruntime": make_generate(onnx_model, source, decoding, args.new_tokens),
                }
                if not torch.equal(calls["pytorch"](), calls["onnxruntime"]()):
                    raise RuntimeError(f"Different tokens at batch {batch}, beam {beams}.")
                timings = interleave(calls, args.warmup, args.repeats)
                ms = {name: 1e3 * t.median / args.new_tokens for name, t in timings.items()}
                case = {"batch": batch, "beams": beams, "ms_per_step": ms, "runs": args.repeats}
                case["onnxruntime_speedup"] = ms["pytorch"] / ms["onnxruntime"]
                case["seconds"] = {name: t.seconds for name, t in timings.items()}
                results["cases"].append(case)
                sys.stdout.write(
                    f"{args.size} batch {batch:>3} beam {beams}: pytorch {ms['pytorch']:.2f} ms/step, "
                    f"onnxruntime {ms['onnxruntime']:.2f} ms/step "
                    f"(× {case['onnxruntime_speedup']:.2f}; medians of {args.repeats})\n"
                )
    results["median_speedup"] = statistics.median(case["onnxruntime_speedup"] for case in results["cases"])
    return results


def main() -> None:
    (args,) = HfArgumentParser(OnnxBenchArguments).parse_args_into_dataclasses()
    results = run(args)
    sys.stdout.write(json.dumps(results["machine"]) + "\n")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
