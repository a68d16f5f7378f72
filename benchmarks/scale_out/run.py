"""Translating a corpus on 2 processes against 1: ``hf-vanilla-translate`` alone, and under
``torchrun --nproc_per_node 2`` (each process 1 thread), on the same random model and corpus; output
tokens per second of wall time, from launching the command to the output file (model loading and the
merge included), and whether both outputs are the same bytes. The CPU time (user + sys) of each run's
processes bounds what 2 idle cores could give: the one-process CPU time over half the two processes'.

    python benchmarks/scale_out.py --json_out scale_out.json

The model is random (``--d_model``, ``--layers``; word-level vocabulary of ``--vocabulary`` words) and
decodes greedily up to ``--max_length`` tokens, so each sentence costs about the same; the corpus has
``--sentences`` lines of 5 to 25 words. Each figure is the median over ``--rounds`` interleaved rounds.
Name the CPU (``lscpu``) and the load (``uptime``) with the figures: on a shared machine, 2 processes
get 2 cores only when nothing else runs.
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

ROOT = Path(__file__).resolve().parents[1]


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


def _run(command: list[str], cwd: Path) -> tuple[float, float]:
    """The wall time of ``command`` and the CPU time (user + sys) of all its processes."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    start, cpu = time.perf_counter(), _cpu_seconds()
    result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{result.stdout[-2000:]}{result.stderr[-3000:]}")
    return elapsed, _cpu_seconds() - cpu


def main() -> None:
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
    parser.add_argument("--json_out", type=Path, default=None)
    args = parser.parse_args()

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
        for _ in range(args.rounds):
            for name, command in runs.items():
                wall, used = _run(command, root)
                seconds[name].append(wall)
                cpu[name].append(used)
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
                "cpu_s": statistics.median(cpu[name]),
            }
        )  # fmt: skip
    report = {
        "args": vars(args) | {"json_out": str(args.json_out)},
        "cpu_count": os.cpu_count(),
        "load_average": os.getloadavg(),
        "output_tokens": tokens,
        "same_output": one == two,
        "rows": rows,
        "speedup": rows[0]["median_s"] / rows[1]["median_s"],
        # What 2 idle cores would give at most: the one-process CPU time over half the two processes' total.
        "cpu_bound_speedup": rows[0]["cpu_s"] / (rows[1]["cpu_s"] / 2),
    }
    for row in rows:
        print(
            f"{row['case']:36s} {row['median_s']:8.1f} s  {row['tokens_per_s']:9.1f} output tokens/s  "
            f"{row['cpu_s']:8.1f} CPU s"
        )
    print(
        f"speed-up {report['speedup']:.2f}x (CPU-time bound on 2 idle cores: {report['cpu_bound_speedup']:.2f}x); "
        f"same output: {report['same_output']}; load {report['load_average']}"
    )
    if args.json_out is not None:
        args.json_out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
