"""A training step of the Multi30k recipe's model in float32 and in bfloat16 autocast, on the CPU.

One step is what ``hf-vanilla-train`` runs per batch: the forward pass with the label-smoothed loss,
the backward pass and an Adam step (β = (0.9, 0.98), ε = 1e-9) on float32 weights. ``bf16`` wraps the
forward pass in ``torch.autocast("cpu", dtype=torch.bfloat16)``, as accelerate does for ``--bf16``; the
backward pass and the optimizer stay outside it, as in the Trainer. Both models start from the same
weights and see the same random batch (``--batch_size`` sentences of ``--source_length`` source and
``--target_length`` target tokens). Steps run A B A B … after ``--warmup`` untimed rounds, so a shared
machine's load falls on both alike; ratios are taken per back-to-back pair (float32 time ÷ bf16 time;
> 1: bf16 is faster). Each step is timed on the wall clock and in this process's CPU time: on a machine
that other processes load, the wall clock counts their turns too, while the CPU time counts only this
process's work (with one thread exactly; with more, threads that wait may spin and add to it).

``--model folder`` (the default) times the model folder's class, stock operators only. ``--model package``
times the class ``hf-vanilla-train`` builds, with the installed package's fast paths: in float32 they
include the fused output layer and loss; under autocast they turn themselves off, so bf16 is the same
in both.

    OMP_NUM_THREADS=2 python -m benchmarks.experiments.training_precision                  # the recipe's size
    OMP_NUM_THREADS=2 python -m benchmarks.experiments.training_precision --model package  # as trained
    OMP_NUM_THREADS=2 python -m benchmarks.experiments.training_precision --steps 5 --d_model 32 --layers 1
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from benchmarks.common.timing import machine_description
from hf_vanilla.models.vanilla_transformer import modeling_vanilla_transformer
from hf_vanilla.models.vanilla_transformer.configuration_vanilla_transformer import VanillaTransformerConfig
from hf_vanilla.speed import modeling as speed_modeling
from hf_vanilla.training.precision import cpu_bf16_instructions

MODES = ("fp32", "bf16")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--d_model", type=int, default=256)
    parser.add_argument("--layers", type=int, default=3, help="encoder and decoder layers each")
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--ffn_dim", type=int, default=1024)
    parser.add_argument("--vocab_size", type=int, default=8000)
    parser.add_argument("--batch_size", type=int, default=128, help="sentences per batch")
    parser.add_argument("--source_length", type=int, default=16)
    parser.add_argument("--target_length", type=int, default=16)
    parser.add_argument("--steps", type=int, default=20, help="timed steps of each mode")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps of each mode first")
    parser.add_argument(
        "--model",
        choices=("folder", "package"),
        default="folder",
        help="the folder's class (stock operators) or the installed package's (its fast paths)",
    )
    parser.add_argument("--json_out", type=Path, default=None)
    return parser


def _step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: dict, bf16: bool) -> None:
    autocast = torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
    with autocast:
        loss = model(**batch).loss
    loss.float().backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    config = VanillaTransformerConfig(
        vocab_size=args.vocab_size,
        d_model=args.d_model,
        encoder_layers=args.layers,
        decoder_layers=args.layers,
        encoder_attention_heads=args.heads,
        decoder_attention_heads=args.heads,
        encoder_ffn_dim=args.ffn_dim,
        decoder_ffn_dim=args.ffn_dim,
        dropout=0.1,
        label_smoothing=0.1,
    )
    generator = torch.Generator().manual_seed(0)
    low = 4  # above the special tokens
    batch = {
        "input_ids": torch.randint(
            low, args.vocab_size, (args.batch_size, args.source_length), generator=generator
        ),
        "labels": torch.randint(
            low, args.vocab_size, (args.batch_size, args.target_length), generator=generator
        ),
    }
    model_class = (
        speed_modeling if args.model == "package" else modeling_vanilla_transformer
    ).VanillaTransformerForConditionalGeneration
    torch.manual_seed(0)
    first = model_class(config).train()
    models = {"fp32": first, "bf16": model_class(config).train()}
    models["bf16"].load_state_dict(first.state_dict())
    optimizers = {
        mode: torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9, weight_decay=0.0)
        for mode, model in models.items()
    }
    calls = {
        mode: (lambda mode=mode: _step(models[mode], optimizers[mode], batch, mode == "bf16"))
        for mode in MODES
    }
    for _ in range(args.warmup):
        for call in calls.values():
            call()
    times: dict[str, dict[str, list[float]]] = {mode: {"wall": [], "cpu": [], "load": []} for mode in MODES}
    for _ in range(args.steps):
        for mode, call in calls.items():
            gc.collect()
            times[mode]["load"].append(os.getloadavg()[0])
            wall, cpu = time.perf_counter(), time.process_time()
            call()
            times[mode]["cpu"].append((time.process_time() - cpu) * 1e3)
            times[mode]["wall"].append((time.perf_counter() - wall) * 1e3)
    ratios = {
        clock: [f / b for f, b in zip(times["fp32"][clock], times["bf16"][clock], strict=True)]
        for clock in ("wall", "cpu")
    }
    machine = machine_description()
    report = {
        "machine": machine,
        "cpu_bf16_instructions": cpu_bf16_instructions(),
        "settings": vars(args) | {"json_out": None},
        "parameters": sum(p.numel() for p in first.parameters()),
        "ms_per_step": times,
        "ratio_fp32_over_bf16": ratios,
    }
    loads = times["fp32"]["load"] + times["bf16"]["load"]
    print(
        f"{machine['cpu']} ({cpu_bf16_instructions() or 'no native bf16'}), {machine['torch_threads']} "
        f"threads, load {min(loads):.1f}-{max(loads):.1f}; the {args.model}'s class, "
        f"{report['parameters'] / 1e6:.1f} M parameters, "
        f"{args.batch_size} x ({args.source_length} + {args.target_length}) tokens, {args.steps} steps each"
    )
    for clock in ("wall", "cpu"):
        for mode in MODES:
            ms = times[mode][clock]
            print(
                f"{clock} {mode}: median {statistics.median(ms):.0f} ms/step (range {min(ms):.0f}-{max(ms):.0f})"
            )
        pairs = ratios[clock]
        print(
            f"{clock} fp32 / bf16: median {statistics.median(pairs):.2f}x (pairs {min(pairs):.2f}-{max(pairs):.2f})"
        )
    if args.json_out is not None:
        args.json_out.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
