"""Translating a corpus on 2 processes against 1: ``hf-vanilla-translate`` alone, and under
``torchrun --nproc_per_node 2`` (each process 1 thread), on the same random model and corpus; output
tokens per second of wall time, from launching the command to the output file (model loading and the
merge included), and whether both outputs are the same bytes. The CPU time (user + sys) of each run's
processes bounds what 2 idle cores could give: the one-process CPU time over half the two processes'.

    python -m benchmarks.scale_out.run --json_out scale_out.json
    python -m benchmarks.scale_out.run --sentences 8 --d_model 64 --layers 1 --rounds 1   # plumbing check

The model is random (``--d_model``, ``--layers``; word-level vocabulary of ``--vocabulary`` words) and
decodes greedily up to ``--max_length`` tokens, so each sentence costs about the same; the corpus has
``--sentences`` lines of 5 to 25 words. Each figure is the median over ``--rounds`` interleaved rounds.
Each run records the 1-minute load average before and after it: on a shared machine, 2 processes get 2
cores only when nothing else runs. The table goes to stdout; ``--json_out`` writes the report as the
suite's JSON (:mod:`benchmarks.common.results`).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common.results import metadata, render_run

ROOT = Path(__file__).resolve().parents[2]


def _model_folder(folder: Path, args: argparse.Namespace) -> None:
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    from hf_vanilla import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration
    from hf_vanilla.hub.folder import save_model_folder

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3, **{f"w{i}": i + 4 for i in range(args.vocabulary)}}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 2)])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    torch.manual_seed(0)
    config = VanillaTransformerConfig(
        vocab_size=len(vocab), d_model=args.d_model, encoder_layers=args.layers, decoder_layers=args.layers,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=4 * args.d_model,
        decoder_ffn_dim=4 * args.d_model, max_position_embeddings=128,
    )  # fmt: skip
    model = VanillaTransformerForConditionalGeneration(config).eval()
    with torch.no_grad():  # outputs that differ by input (not one token repeated)
        model.model.shared.weight.mul_(3)
    save_model_folder(model, tokenizer, folder)


def _corpus(path: Path, args: argparse.Namespace) -> None:
    rng = random.Random(0)
    lines = (
        " ".join(f"w{rng.randrange(args.vocabulary)}" for _ in range(rng.randint(5, 25)))
        for _ in range(args.sentences)
    )
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _run(command: list[str], cwd: Path) -> tuple[float, float, list[float]]:
    """The wall time of ``command``, the CPU time (user + sys) of all its processes, and the 1-minute load
    average before and after it."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    load_before = os.getloadavg()[0]
    start, cpu = time.perf_counter(), _cpu_seconds()
    result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{result.stdout[-2000:]}{result.stderr[-3000:]}")
    return elapsed, _cpu_seconds() - cpu, [round(load_before, 1), round(os.getloadavg()[0], 1)]


def table(report: dict[str, Any]) -> dict[str, Any]:
    """The comparison's table for benchmarks/RESULTS.md (:mod:`benchmarks.common.results`): each case's
    median wall time, output tokens/s and CPU time, the speed-up of 2 processes and its CPU-time bound, with
    the load average around the runs."""
    args, cpus = report["arguments"], report["meta"]["machine"]["logical_cpus"]
    one, two = report["rows"]
    speedups = {
        one["case"]: ["1.00×", ""],
        two["case"]: [f"**{report['speedup']:.2f}×**", f"{report['cpu_bound_speedup']:.2f}×"],
    }
    rows = [
        [
            row["case"],
            f"{row['median_s']:.1f}",
            f"{row['tokens_per_s']:.0f}",
            f"{row['cpu_s']:.1f}",
            *speedups[row["case"]],
            f"{min(row['load']):.1f}–{max(row['load']):.1f}",
        ]
        for row in report["rows"]
    ]
    loads = [load for row in report["rows"] for load in row["load"]]
    return {
        "title": (
            f"Corpus translation on 2 processes: {args['sentences']:,} sentences, d_model {args['d_model']}, "
            f"{args['layers']} + {args['layers']} layers, greedy"
        ),
        "columns": ["case", "median s", "output tokens/s", "CPU s", "speed-up", "CPU-time bound", "load"],
        "rows": rows,
        "note": (
            f"A random model decoding up to {args['max_length']} tokens per sentence, batch {args['batch_size']}; "
            f"{report['output_tokens']:,} output tokens; median of {args['rounds']} interleaved round(s). Wall "
            "time runs from launching the command to the output file (model loading and the merge included). "
            f"Both outputs {'were' if report['same_output'] else 'were not'} the same bytes. CPU-time bound: the "
            "one process's CPU time over half the two processes', what 2 idle cores would give at most. "
            f"load: the 1-minute load average before and after each run (lowest–highest, the run's own "
            f"processes included), {min(loads):.1f} to {max(loads):.1f} on {cpus} logical CPUs."
            + (" A shared machine under load: the figures are rough." if max(loads) > cpus else "")
            + (f" {args['note']}" if args.get("note") else "")
        ),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sentences", type=int, default=2000)
    parser.add_argument("--d_model", type=int, default=512)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--vocabulary", type=int, default=2000)
    parser.add_argument("--max_length", type=int, default=24)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--note", default="", help="A sentence the table's note ends with.")
    parser.add_argument("--json_out", type=Path, default=None)
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="scale_out-") as tmp:
        root = Path(tmp)
        _model_folder(root / "model", args)
        _corpus(root / "corpus.txt", args)
        common = [
            "--model_name_or_path", "model", "--input_file", "corpus.txt", "--device", "cpu", "--num_beams", "1",
            "--max_length", str(args.max_length), "--batch_size", str(args.batch_size), "--overwrite",
        ]  # fmt: skip
        translate = [sys.executable, "-m", "hf_vanilla.cli.translate"]
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
        runs = {
            "1 process x 1 thread": [*translate, *common, "--output_file", "one.txt"],
            "2 processes x 1 thread (torchrun)": [*torchrun, "-m", "hf_vanilla.cli.translate", *common, "--output_file", "two.txt"],
        }  # fmt: skip
        seconds: dict[str, list[float]] = {name: [] for name in runs}
        cpu: dict[str, list[float]] = {name: [] for name in runs}
        load: dict[str, list[float]] = {name: [] for name in runs}
        for _ in range(args.rounds):
            for name, command in runs.items():
                wall, used, around = _run(command, root)
                seconds[name].append(wall)
                cpu[name].append(used)
                load[name] += around
                print(f"{name}: {wall:.1f} s, {used:.1f} CPU s, load {around}", file=sys.stderr, flush=True)
        one, two = (
            (root / "one.txt").read_text(encoding="utf-8"),
            (root / "two.txt").read_text(encoding="utf-8"),
        )
        tokens = sum(len(line.split()) for line in one.splitlines())
    rows = []
    for name, times in seconds.items():
        median = statistics.median(times)
        rows.append(
            {
                "case": name, "seconds": times, "median_s": median, "tokens_per_s": tokens / median,
                "cpu_s": statistics.median(cpu[name]), "load": load[name],
            }
        )  # fmt: skip
    report: dict[str, Any] = {
        "meta": metadata(argv),
        "arguments": {
            key: str(value) if isinstance(value, Path) else value for key, value in vars(args).items()
        },
        "output_tokens": tokens,
        "same_output": one == two,
        "rows": rows,
        "speedup": rows[0]["median_s"] / rows[1]["median_s"],
        # What 2 idle cores would give at most: the one-process CPU time over half the two processes' total.
        "cpu_bound_speedup": rows[0]["cpu_s"] / (rows[1]["cpu_s"] / 2),
    }
    report["table"] = table(report)
    if args.json_out is not None:
        args.json_out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(render_run(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
