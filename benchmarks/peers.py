"""CPU inference peers in one interleaved run: hf_vanilla fp32 and its quantized routes against
CTranslate2 fp32 and int8 (issue 16).

One transformer-base model (``--size``, random weights, the same as ``bench.py`` builds) is saved with
a word-level tokenizer, exported with the project's own CTranslate2 exporter (float32 and int8), and
loaded through each route of :mod:`hf_vanilla.inference.quantization`. Every engine decodes the same random
sources (``--source_length`` tokens + ``</s>``) for exactly ``--new_tokens`` tokens (``</s>`` has a
zero embedding row, so random weights never end a hypothesis and every engine does the same work), with ``--threads`` threads for torch and CTranslate2.
Cases: greedy and beam 4 at batch 1 and ``--batch_size``. Engines run round-robin (A B C … A B C …)
after a warm-up; a cell is the median ms per decoding step with the min–max, and each ratio is the
median of per-round ratios against CTranslate2 int8 (> 1: faster than CTranslate2 int8).

The memory-bandwidth floor of greedy batch 1 is measured in the same run: the bytes of weights one
cached decoding step reads (decoder without the cross-attention K/V projections, plus the output
projection), divided by the best read bandwidth of a 512 MB ``sum`` (read only; sampled before the first
case and after each, as the machine may be shared) — fp32 bytes for
fp32 engines; for int8 engines a quarter of the projection bytes is shown beside it.

    python benchmarks/peers.py                        # base size, 2 threads, 3 timed rounds
    python benchmarks/peers.py --size tiny --repeats 1 --new_tokens 4   # plumbing check, seconds
    python benchmarks/bench.py --cases generate,peers  # the same, after bench.py's Marian cases
"""

from __future__ import annotations

import copy
import json
import statistics
import sys
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import ctranslate2
import torch
from bench_timing import interleave, machine_description, read_bandwidth
from bench_workloads import (
    EOS,
    build_configs,
    build_ours,
    decode_step_weight_bytes,
    generation_config,
    make_generate,
)
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import AutoModelForSeq2SeqLM, HfArgumentParser, PreTrainedTokenizerFast

from hf_vanilla.inference.quantization import from_pretrained_kwargs, quantize_loaded
from hf_vanilla.interop.export_ctranslate2 import export_ctranslate2

#: The engines, in the order they run in each round.
HF_ROUTES = ("none", "dynamic-int8", "torchao-int8-weight", "torchao-int8-dynamic", "bf16")
CT2_TYPES = ("float32", "int8")
REFERENCE = "ct2 int8"


@dataclass
class PeerArguments:
    size: str = field(default="base", metadata={"help": "Model size of bench.py: tiny, small or base."})
    threads: int = field(default=2, metadata={"help": "Threads for torch and CTranslate2 (intra-op)."})
    batch_size: int = field(default=32, metadata={"help": "Sentences of the large-batch cases."})
    source_length: int = field(default=32, metadata={"help": "Source tokens per sentence (+ </s>)."})
    new_tokens: int = field(default=32, metadata={"help": "Tokens decoded per sentence (forced)."})
    repeats: int = field(default=3, metadata={"help": "Timed rounds per case."})
    warmup: int = field(default=1, metadata={"help": "Untimed rounds per case."})
    routes: str = field(
        default=",".join(HF_ROUTES),
        metadata={"help": "hf_vanilla routes (hf_vanilla.inference.quantization)."},
    )
    seed: int = field(default=0, metadata={"help": "Seed of the weights and the sources."})
    json_out: str | None = field(default=None, metadata={"help": "Also write the results here as JSON."})


def word_tokenizer(vocab_size: int) -> PreTrainedTokenizerFast:
    """A word-level tokenizer whose token i is ``w{i}`` (specials 0–3), appending ``</s>``."""
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3} | {f"w{i}": i for i in range(4, vocab_size)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 2)])
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )


def folder_megabytes(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2**20


def build_engines(
    folder: Path, model: torch.nn.Module, args: PeerArguments
) -> tuple[dict[str, Any], dict[str, float]]:
    """The loaded engines by name, and their weights' size on disk in MB."""
    engines: dict[str, Any] = {}
    sizes: dict[str, float] = {}
    for route in [r.strip() for r in args.routes.split(",") if r.strip()]:
        name = f"hf {route}"
        if route == "none":
            engines[name] = model
            sizes[name] = folder_megabytes(folder / "hf")
        elif route == "dynamic-int8":
            engines[name] = quantize_loaded(copy.deepcopy(model), route)
            saved = folder / "dynamic-int8.pt"
            torch.save(engines[name].state_dict(), saved)
            sizes[name] = saved.stat().st_size / 2**20
        else:
            engines[name] = AutoModelForSeq2SeqLM.from_pretrained(
                folder / "hf", **from_pretrained_kwargs(route)
            )
            engines[name].eval().save_pretrained(folder / route)
            sizes[name] = folder_megabytes(folder / route)
    for compute_type in CT2_TYPES:
        name = f"ct2 {compute_type}"
        target = folder / f"ct2-{compute_type}"
        export_ctranslate2(
            folder / "hf", target, quantization=None if compute_type == "float32" else compute_type
        )
        engines[name] = ctranslate2.Translator(
            str(target), device="cpu", compute_type=compute_type, intra_threads=args.threads, inter_threads=1
        )
        sizes[name] = folder_megabytes(target)
    return engines, sizes


def make_call(
    engine: Any, ids: torch.Tensor, tokens: list[list[str]], beams: int, new_tokens: int
) -> Callable[[], object]:
    """One decoding of the batch; every engine must return exactly ``new_tokens`` tokens per sentence
    (:func:`~bench_workloads.build_ours` weights never end a hypothesis)."""
    if not isinstance(engine, ctranslate2.Translator):
        return make_generate(engine, ids, generation_config(beams, new_tokens), new_tokens)

    def run() -> object:
        results = engine.translate_batch(
            tokens, beam_size=beams, max_batch_size=len(tokens), max_decoding_length=new_tokens
        )
        lengths = {len(result.hypotheses[0]) for result in results}
        if lengths != {new_tokens}:
            raise RuntimeError(
                f"Expected {new_tokens} tokens from CTranslate2, got lengths {sorted(lengths)}."
            )
        return results

    return run


def run(args: PeerArguments) -> dict[str, Any]:
    """Measure every engine on every case, print the table, and return the report (also what
    ``bench.py --cases peers`` embeds in its own)."""
    torch.set_num_threads(args.threads)
    machine = machine_description()
    print(f"# {machine['cpu']} ({machine['simd']}), {args.threads} threads; {machine['uptime']}", flush=True)
    bandwidths = [read_bandwidth()]  # sampled again after every case: the best is the machine's
    config, _ = build_configs(args.size)
    model = build_ours(config, args.seed).eval()
    with tempfile.TemporaryDirectory(
        prefix="hf-vanilla-peers-"
    ) as tmp:  # ~1 GB; the engines keep what they load
        folder = Path(tmp)
        model.save_pretrained(folder / "hf")
        word_tokenizer(config.vocab_size).save_pretrained(folder / "hf")
        engines, sizes = build_engines(folder, model, args)

    generator = torch.Generator().manual_seed(args.seed + 2)
    rows = []
    for batch, beams in ((1, 1), (1, 4), (args.batch_size, 1), (args.batch_size, 4)):
        words = torch.randint(4, config.vocab_size, (batch, args.source_length), generator=generator)
        ids = torch.cat([words, torch.full((batch, 1), EOS)], dim=1)
        tokens = [[f"w{int(i)}" for i in row] + ["</s>"] for row in words]
        calls = {name: make_call(e, ids, tokens, beams, args.new_tokens) for name, e in engines.items()}
        timings = interleave(calls, args.warmup, args.repeats)
        case = f"{'greedy' if beams == 1 else f'beam {beams}'}, batch {batch}"
        row: dict[str, Any] = {"case": case, "ms_per_step": {}, "range": {}, "vs_ct2_int8": {}}
        for name, timing in timings.items():
            per_step = [s * 1e3 / args.new_tokens for s in timing.seconds]
            row["ms_per_step"][name] = statistics.median(per_step)
            row["range"][name] = [min(per_step), max(per_step)]
            if REFERENCE in timings:
                ratios = [r / s for s, r in zip(timing.seconds, timings[REFERENCE].seconds, strict=True)]
                row["vs_ct2_int8"][name] = statistics.median(ratios)
        rows.append(row)
        bandwidths.append(read_bandwidth())
        print(f"# {case}: " + ", ".join(f"{n} {v:.1f}" for n, v in row["ms_per_step"].items()), flush=True)

    bandwidth = max(bandwidths)
    fp32_bytes = decode_step_weight_bytes(model)
    floor_ms = fp32_bytes / (bandwidth * 1e9) * 1e3
    greedy1 = rows[0]["ms_per_step"]
    report = {
        "args": asdict(args),
        "machine": machine,
        "read_bandwidth_gbs": bandwidth,
        "read_bandwidth_samples_gbs": bandwidths,
        "decode_step_weight_mb": fp32_bytes / 2**20,
        "floor_ms_fp32": floor_ms,
        "floor_ms_int8": floor_ms / 4,
        "greedy_batch1_over_floor": {
            name: ms / (floor_ms if name in ("hf none", "ct2 float32") else floor_ms / 4)
            for name, ms in greedy1.items()
            if name != "hf bf16"
        },
        "size_mb": sizes,
        "rows": rows,
    }
    names = list(engines)
    print(
        f"\nms per decoding step, median [min–max] of {args.repeats} rounds; (ratio: CTranslate2 int8 time ÷ time)"
    )
    print("| case | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    for row in rows:
        cells = [
            f"{row['ms_per_step'][n]:.1f} ({row['vs_ct2_int8'].get(n, float('nan')):.2f}×)" for n in names
        ]
        print(f"| {row['case']} | " + " | ".join(cells) + " |")
    print("| size on disk, MB | " + " | ".join(f"{sizes.get(n, float('nan')):.0f}" for n in names) + " |")
    print(
        f"\nRead bandwidth {bandwidth:.1f} GB/s; a cached step reads {fp32_bytes / 2**20:.0f} MB of fp32 weights: "
        f"floor {floor_ms:.2f} ms (int8 weights: {floor_ms / 4:.2f} ms). Greedy batch 1 over its floor: "
        + ", ".join(f"{n} {v:.2f}×" for n, v in report["greedy_batch1_over_floor"].items())
    )
    return report


def main(argv: list[str] | None = None) -> int:
    (args,) = HfArgumentParser(PeerArguments).parse_args_into_dataclasses(args=argv)
    report = run(args)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
