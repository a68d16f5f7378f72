"""CPU inference peers in one interleaved run: hf_vanilla fp32 and its quantized routes against
CTranslate2 fp32 and int8.

One transformer-base model (``--size``, random weights, the same as ``benchmarks.marian`` builds) is saved with
a word-level tokenizer, exported with the project's own CTranslate2 exporter (float32 and int8), and
loaded through each route of :mod:`hf_vanilla.inference.quantization`. Every engine decodes the same random
sources (``--source_length`` tokens + ``</s>``) for exactly ``--new_tokens`` tokens (``</s>`` has a
zero embedding row, so random weights never end a hypothesis and every engine does the same work), with ``--threads`` threads for torch and CTranslate2.
Cases: greedy and beam 4 at batch 1 and ``--batch_size``. Each engine runs in a worker process of its own
(``benchmarks/ct2/worker.py``: a CTranslate2 worker imports no torch; engines in one process slow each other,
see :mod:`engine_process`) and times its calls itself. Engines run round-robin (A B C … A B C …) after a
warm-up, with a pause of ``--settle`` seconds before each call (the last engine's spinning threads wind
down); a cell is the median ms per decoding step with the min–max, and each ratio is the median of
per-round ratios against CTranslate2 int8 (> 1: faster than CTranslate2 int8).

The memory-bandwidth floor of greedy batch 1 is measured in the same run: the bytes of weights one
cached decoding step reads (decoder without the cross-attention K/V projections, plus the output
projection), divided by the best read bandwidth of a 512 MB ``sum`` (read only; sampled before the first
case and after each, as the machine may be shared) — fp32 bytes for
fp32 engines; for int8 engines a quarter of the projection bytes is shown beside it.

    python -m benchmarks.ct2.run                        # base size, 2 threads, 3 timed rounds
    python -m benchmarks.ct2.run --size tiny --repeats 1 --new_tokens 4   # plumbing check, seconds
    python -m benchmarks.marian.run --cases generate,peers  # the same, after benchmarks.marian's Marian cases
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import HfArgumentParser, PreTrainedTokenizerFast

from benchmarks.common.engine_process import CT2_THREADS_HELP, EngineProcess, engine_threads
from benchmarks.common.results import metadata
from benchmarks.common.timing import load_average, machine_description, read_bandwidth
from benchmarks.common.workloads import EOS, build_configs, build_ours, decode_step_weight_bytes
from hf_vanilla.interop.export_ctranslate2 import export_ctranslate2

#: The engines, in the order they run in each round.
HF_ROUTES = ("none", "dynamic-int8", "torchao-int8-weight", "torchao-int8-dynamic", "bf16")
CT2_TYPES = ("float32", "int8")
REFERENCE = "ct2 int8"


@dataclass
class PeerArguments:
    size: str = field(
        default="base", metadata={"help": "Model size of benchmarks.marian: tiny, small or base."}
    )
    threads: int = field(default=2, metadata={"help": "Threads for torch and CTranslate2 (intra-op)."})
    ct2_threads: int | None = field(
        default=None,
        metadata={"help": CT2_THREADS_HELP},
    )
    batch_size: int = field(default=32, metadata={"help": "Sentences of the large-batch cases."})
    source_length: int = field(default=32, metadata={"help": "Source tokens per sentence (+ </s>)."})
    new_tokens: int = field(default=32, metadata={"help": "Tokens decoded per sentence (forced)."})
    repeats: int = field(default=3, metadata={"help": "Timed rounds per case."})
    warmup: int = field(default=1, metadata={"help": "Untimed rounds per case."})
    settle: float = field(default=0.5, metadata={"help": "Seconds of pause before each timed call."})
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


def start_engines(folder: Path, args: PeerArguments) -> dict[str, EngineProcess]:
    """One worker per engine, in the order they run in each round; ``FOLDER/hf`` holds the model."""
    for compute_type in CT2_TYPES:
        quantization = None if compute_type == "float32" else compute_type
        export_ctranslate2(folder / "hf", folder / f"ct2-{compute_type}", quantization=quantization)
    names = [f"hf {route.strip()}" for route in args.routes.split(",") if route.strip()]
    names += [f"ct2 {compute_type}" for compute_type in CT2_TYPES]
    threads = {name: engine_threads(name, args.threads, args.ct2_threads) for name in names}
    return {
        name: EngineProcess(
            [sys.executable, "-m", "benchmarks.ct2.worker", name, str(folder), str(threads[name])],
            threads[name],
            name,
        )
        for name in names
    }


def time_rounds(engines: dict[str, EngineProcess], args: PeerArguments) -> dict[str, list[float]]:
    """Seconds of each engine's call (timed in its worker), ``args.repeats`` rounds A B C … after
    ``args.warmup`` untimed ones."""
    seconds: dict[str, list[float]] = {name: [] for name in engines}
    for round_index in range(args.warmup + args.repeats):
        for name, engine in engines.items():
            time.sleep(args.settle)
            answer = engine.request({"time": True})
            if round_index >= args.warmup:
                seconds[name].append(answer["seconds"])
    return seconds


def run(args: PeerArguments) -> dict[str, Any]:
    """Measure every engine on every case, print the table, and return the report (also what
    ``benchmarks.marian.run --cases peers`` embeds in its own)."""
    torch.set_num_threads(args.threads)
    machine = machine_description()
    ct2 = f", CTranslate2 {args.ct2_threads}" if args.ct2_threads else ""
    print(
        f"# {machine['cpu']} ({machine['simd']}), {args.threads} threads{ct2}; {machine['uptime']}",
        flush=True,
    )
    bandwidths = [read_bandwidth()]  # sampled again after every case: the best is the machine's
    config, _ = build_configs(args.size)
    model = build_ours(config, args.seed).eval()
    generator = torch.Generator().manual_seed(args.seed + 2)
    rows = []
    with tempfile.TemporaryDirectory(prefix="hf-vanilla-peers-") as tmp:  # ~1 GB at base size
        folder = Path(tmp)
        model.save_pretrained(folder / "hf")
        word_tokenizer(config.vocab_size).save_pretrained(folder / "hf")
        engines = start_engines(folder, args)
        try:
            sizes = {name: engine.ready["size_mb"] for name, engine in engines.items()}
            for batch, beams in ((1, 1), (1, 4), (args.batch_size, 1), (args.batch_size, 4)):
                words = torch.randint(4, config.vocab_size, (batch, args.source_length), generator=generator)
                ids = torch.cat([words, torch.full((batch, 1), EOS)], dim=1)
                case = {
                    "ids": ids.tolist(),
                    "tokens": [[f"w{int(i)}" for i in row] + ["</s>"] for row in words],
                    "beams": beams,
                    "new_tokens": args.new_tokens,
                }
                for engine in engines.values():
                    engine.request(case)
                load = load_average()
                seconds = time_rounds(engines, args)
                name = f"{'greedy' if beams == 1 else f'beam {beams}'}, batch {batch}"
                row: dict[str, Any] = {"case": name, "ms_per_step": {}, "range": {}, "vs_ct2_int8": {}}
                row["load"] = [load, load_average()]
                for engine_name, timing in seconds.items():
                    per_step = [s * 1e3 / args.new_tokens for s in timing]
                    row["ms_per_step"][engine_name] = statistics.median(per_step)
                    row["range"][engine_name] = [min(per_step), max(per_step)]
                    if REFERENCE in seconds:
                        ratios = [r / s for s, r in zip(timing, seconds[REFERENCE], strict=True)]
                        row["vs_ct2_int8"][engine_name] = statistics.median(ratios)
                rows.append(row)
                bandwidths.append(read_bandwidth())
                print(
                    f"# {name}: " + ", ".join(f"{n} {v:.1f}" for n, v in row["ms_per_step"].items()),
                    flush=True,
                )
        finally:
            for engine in engines.values():
                engine.close()

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
    names = list(sizes)
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


def table(report: dict[str, Any]) -> dict[str, Any]:
    """The comparison's table for benchmarks/RESULTS.md (:mod:`benchmarks.common.results`): ms per
    decoding step of each engine, and in brackets CTranslate2 int8's time over it (> 1: faster than it)."""
    names = list(report["rows"][0]["ms_per_step"])
    rows = []
    for row in report["rows"]:
        cells = [f"{row['ms_per_step'][name]:.1f}" for name in names]
        ratios = row.get("vs_ct2_int8", {})
        cells = [
            f"{text} ({ratios[name]:.2f}×)" if name != REFERENCE and name in ratios else text
            for name, text in zip(names, cells, strict=True)
        ]
        rows.append([row["case"], *cells])
    args = report["args"]
    return {
        "title": f"hf_vanilla's routes against CTranslate2, size {args['size']}, synthetic",
        "columns": ["case", *names],
        "rows": rows,
        "note": (
            f"ms per decoding step, median of {args['repeats']} rounds, {args['new_tokens']} new tokens for every "
            f"engine; in brackets {REFERENCE}'s time over the engine's (> 1: the engine is faster than {REFERENCE})."
        ),
    }


def main(argv: list[str] | None = None) -> int:
    (args,) = HfArgumentParser(PeerArguments).parse_args_into_dataclasses(args=argv)
    report = run(args)
    if args.json_out:
        report = {"meta": metadata(argv), **report, "table": table(report)}
        Path(args.json_out).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
