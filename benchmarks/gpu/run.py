"""One prepared check for a GPU machine: what the CPU test suite cannot show (about 3–6 minutes on one H200).

    python -m benchmarks.gpu.run                   # base and big, all checks, compact table
    python scripts/gpu_check.py --device cpu --sizes tiny --steps 2 --fsdp_smoke false   # dry run

1. bf16 autocast + SDPA training step (Adam, the paper's β and ε) at the Table 3 base and big sizes:
   step time, tokens/s, model FLOP/s and MFU against the device's dense bf16 peak (``--peak_tflops``, or
   from its name: :data:`DENSE_BF16_PEAK_TFLOPS`, NVIDIA's datasheets: 989 TFLOP/s for H100 SXM and H200 SXM). FLOPs are counted analytically (matmuls only, causal self-attention counted as
   half, backward = 2 × forward) and cross-checked with ``torch.utils.flop_counter`` on one step.
1b. The WMT14 recipe's real step (recipes/wmt14_en_de.sh on one GPU: GRAD_ACCUM=8 × --max_tokens 6250 =
   the paper's ~25k + 25k tokens): token-budget micro-batches from the package's sampler over WMT-like
   lengths, padding as the collator makes it, bf16, fused Adam; tokens/s (real and padded) and MFU.
2. Peak memory of that step with and without gradient checkpointing, and the ratio.
3. fp16 with loss scaling through the Trainer (``tests/models/test_precision.py::test_fp16_trainer_scales_the_loss_on_gpu``).
4. FSDP smoke on the GPU(s): ``accelerate launch --config_file configs/accelerate/fsdp.yaml`` runs
   ``scripts/train.py`` (through ``tests/train_driver.py``, which only records) in bf16 for 20 steps with
   checkpoints at 10 and 20, resumes to 30 and evaluates with generation. It checks what the CPU tests
   (tests/training/test_fsdp.py, which force FSDP on for gloo with a test-only shim) cannot: that accelerate
   itself turns FSDP on for a GPU launch (the launch is not refused, every rank reports
   ``DistributedType.FSDP`` and sharded parameters), FSDP2 with bf16 mixed precision, the gathered
   checkpoint written from GPU shards (every checkpoint passes ``verify_checkpoint``, the shared
   matrix is stored once, ``from_pretrained`` reads the final model), and resuming onto GPUs: a copy of
   checkpoint-10 resumed to 20 must end within ``--fsdp_resume_atol`` of checkpoint-20 (not bit for bit:
   bf16 GPU kernels need not be deterministic). ``--fsdp_processes`` sets the number of GPUs (1 on one
   H200, where each parameter's single shard is the whole tensor: real splitting over NCCL needs 2+).

Writes ``gpu_check.json`` into ``--output_dir``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import HfArgumentParser

from benchmarks.common.results import metadata
from hf_vanilla import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration

ROOT = Path(__file__).resolve().parents[2]
TINY = {"d_model": 64, "encoder_layers": 2, "decoder_layers": 2, "encoder_attention_heads": 4,
        "decoder_attention_heads": 4, "encoder_ffn_dim": 256, "decoder_ffn_dim": 256}  # fmt: skip


@dataclass
class CheckArguments:
    sizes: str = field(default="base,big", metadata={"help": "Comma-separated: tiny, base, big (Table 3)."})
    batch_size: int = field(default=64, metadata={"help": "Sentence pairs per step."})
    source_length: int = field(default=64, metadata={"help": "Source tokens per pair (no padding)."})
    target_length: int = field(default=64, metadata={"help": "Target tokens per pair (no padding)."})
    vocab_size: int = field(default=37000, metadata={"help": "Shared vocabulary (§5.1: ~37000 BPE tokens)."})
    warmup: int = field(default=5, metadata={"help": "Untimed steps first."})
    steps: int = field(default=20, metadata={"help": "Timed steps."})
    peak_tflops: float = field(
        default=0.0,
        metadata={
            "help": "Dense bf16 peak of the device, TFLOP/s; 0: from the device name (DENSE_BF16_PEAK_TFLOPS)."
        },
    )
    device: str = field(default="cuda", metadata={"help": "cuda, or cpu for a dry run of the script."})
    recipe_check: bool = field(
        default=True,
        metadata={"help": "Measure the WMT14 recipe's real training step (recipes/wmt14_en_de.sh)."},
    )
    recipe_size: str = field(
        default="base", metadata={"help": "Model of the recipe step: base, big (or tiny)."}
    )
    recipe_max_tokens: int = field(
        default=6250, metadata={"help": "Token budget per micro-batch (the recipe's --max_tokens)."}
    )
    recipe_accumulation: int = field(
        default=8,
        metadata={
            "help": "Micro-batches per step: 8 × 6250 = the paper's 50000 tokens on one GPU "
            "(the recipe with GPUS_PER_NODE=1 GRAD_ACCUM=8)."
        },
    )
    fp16_check: bool = field(default=True, metadata={"help": "Run the fp16 loss-scaling Trainer test."})
    fsdp_smoke: bool = field(default=True, metadata={"help": "Run the FSDP train/resume/eval smoke."})
    fsdp_processes: int = field(default=1, metadata={"help": "GPUs (processes) for the FSDP smoke."})
    fsdp_resume_atol: float = field(
        default=1e-3, metadata={"help": "Resumed vs uninterrupted checkpoint-20, largest weight difference."}
    )
    output_dir: str = field(default="runs/gpu_check", metadata={"help": "Where gpu_check.json goes."})


#: Dense (no sparsity) bf16 tensor-core peaks, TFLOP/s, from NVIDIA's datasheets (they list the sparse figure,
#: twice these): H100 SXM and H200 SXM 989 (1,979 sparse), H100 NVL / H200 NVL 835 (1,671), H100 PCIe 756
#: (1,513), A100 312 (624). The first name found in the device name wins (most specific first).
DENSE_BF16_PEAK_TFLOPS = {"H200 NVL": 835.0, "H100 NVL": 835.0, "H100 PCIe": 756.0, "H200": 989.4,
                          "H100": 989.4, "A100": 312.0}  # fmt: skip


def peak_tflops(args: CheckArguments, device_name: str) -> float | None:
    """``--peak_tflops``, or the datasheet peak of ``device_name``; None where unknown (a CPU dry run)."""
    if args.peak_tflops:
        return args.peak_tflops
    return next((v for k, v in DENSE_BF16_PEAK_TFLOPS.items() if k in device_name), None)


def model_config(size: str, vocab_size: int) -> VanillaTransformerConfig:
    if size == "tiny":
        return VanillaTransformerConfig(vocab_size=vocab_size, **TINY)
    return VanillaTransformerConfig.from_preset(size, vocab_size=vocab_size)


def training_flops(config: VanillaTransformerConfig, batch: int, source: int, target: int) -> float:
    """Matmul FLOPs of one training step: 3 × forward (2 per multiply-add), no recomputation counted."""
    d, f, v = config.d_model, config.encoder_ffn_dim, config.vocab_size
    b_s, b_t = batch * source, batch * target
    encoder = config.encoder_layers * (
        2 * b_s * 4 * d * d + 4 * batch * source * source * d + 2 * b_s * 2 * d * f
    )
    decoder = config.decoder_layers * (
        2 * b_t * 4 * d * d  # self-attention Q, K, V, O
        + 2 * batch * target * target * d  # causal QK^T and AV: half of the full 4·B·T²·d
        + 2 * b_t * 2 * d * d  # cross-attention Q, O
        + 2 * b_s * 2 * d * d  # cross-attention K, V of the encoder output
        + 4 * batch * target * source * d  # cross-attention QK^T and AV
        + 2 * b_t * 2 * d * config.decoder_ffn_dim
    )
    head = 2 * b_t * d * v  # pre-softmax projection (§3.4, shared with the embeddings)
    return 3.0 * (encoder + decoder + head)


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_step(size: str, args: CheckArguments, checkpointing: bool, peak: float | None) -> dict[str, Any]:
    device = torch.device(args.device)
    config = model_config(size, args.vocab_size)
    model = VanillaTransformerForConditionalGeneration(config).to(device).train()
    if checkpointing:
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    optimizer = torch.optim.AdamW(
        model.parameters(),
        lr=1e-4,
        betas=(0.9, 0.98),
        eps=1e-9,
        weight_decay=0.0,
        fused=device.type == "cuda",
    )
    generator = torch.Generator().manual_seed(0)
    batch = {
        "input_ids": torch.randint(
            4, config.vocab_size, (args.batch_size, args.source_length), generator=generator
        ),
        "labels": torch.randint(
            4, config.vocab_size, (args.batch_size, args.target_length), generator=generator
        ),
    }
    batch = {k: v.to(device) for k, v in batch.items()}
    autocast = torch.autocast(device.type, dtype=torch.bfloat16)

    def step() -> float:
        with autocast:
            loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return float(loss.detach())

    for _ in range(args.warmup):
        step()
    _synchronize(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    losses = []
    start = time.perf_counter()
    for _ in range(args.steps):
        losses.append(step())
    _synchronize(device)
    seconds = (time.perf_counter() - start) / args.steps
    result: dict[str, Any] = {
        "size": size,
        "checkpointing": checkpointing,
        "parameters_m": sum(p.numel() for p in model.parameters()) / 1e6,
        "step_ms": seconds * 1e3,
        "tokens_per_s": args.batch_size * (args.source_length + args.target_length) / seconds,
        "loss_finite": all(torch.isfinite(torch.tensor(losses)).tolist()),
        "peak_memory_gib": torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None,
        "attn_implementation": model.config._attn_implementation,
    }
    if not checkpointing:
        from torch.utils.flop_counter import FlopCounterMode

        analytic = training_flops(config, args.batch_size, args.source_length, args.target_length)
        with FlopCounterMode(display=False) as counter:
            step()
        result.update(
            analytic_tflop_per_step=analytic / 1e12,
            counted_over_analytic=counter.get_total_flops() / analytic,
            model_tflops=analytic / seconds / 1e12,
            mfu=analytic / seconds / (peak * 1e12) if peak else None,
        )
    return result


def wmt_like_lengths(pairs: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Synthetic BPE lengths shaped like WMT14 EN-DE's (log-normal, median ~25 source tokens, a long tail to
    250; target ≈ 1.1 × source): enough for the recipe's token-budget batches, no data needed."""
    rng = np.random.default_rng(seed)
    source = np.clip(np.round(rng.lognormal(np.log(25), 0.6, pairs)), 1, 250).astype(np.int64)
    target = np.clip(np.round(source * rng.normal(1.1, 0.15, pairs)), 1, 250).astype(np.int64)
    return source, target


def recipe_step(args: CheckArguments, peak: float | None) -> dict[str, Any]:
    """The WMT14 recipe's training step on one device: token-budget micro-batches of ``--recipe_max_tokens``
    (the package's TokenBudgetBatchSampler over WMT-like lengths), ``--recipe_accumulation`` of them per
    step, bf16 autocast, the model's label-smoothed loss, fused Adam (β = (0.9, 0.98), ε = 1e-9)."""
    from hf_vanilla.data.batching import TokenBudgetBatchSampler

    device = torch.device(args.device)
    config = model_config(args.recipe_size, args.vocab_size)
    model = VanillaTransformerForConditionalGeneration(config).to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9, weight_decay=0.0,
                                  fused=device.type == "cuda")  # fmt: skip
    source, target = wmt_like_lengths(20_000)
    batches = TokenBudgetBatchSampler(source, target, args.recipe_max_tokens, seed=0).global_batches()
    generator = torch.Generator().manual_seed(0)

    def micro_batch(indices: np.ndarray) -> tuple[dict[str, torch.Tensor], int]:
        s_len, t_len = int(source[indices].max()), int(target[indices].max())
        ids = torch.randint(4, config.vocab_size, (len(indices), s_len), generator=generator)
        labels = torch.randint(4, config.vocab_size, (len(indices), t_len), generator=generator)
        mask = torch.zeros_like(ids)
        for row, i in enumerate(indices):  # padding as the collator makes it
            ids[row, source[i] :] = config.pad_token_id
            labels[row, target[i] :] = -100
            mask[row, : source[i]] = 1
        batch = {"input_ids": ids, "attention_mask": mask, "labels": labels}
        return {k: v.to(device) for k, v in batch.items()}, int(source[indices].sum() + target[indices].sum())

    autocast = torch.autocast(device.type, dtype=torch.bfloat16)
    cursor = 0

    def step() -> tuple[int, int, float]:
        nonlocal cursor
        padded = real = 0
        flops = 0.0
        for _ in range(args.recipe_accumulation):
            indices = batches[cursor % len(batches)]
            cursor += 1
            batch, tokens = micro_batch(indices)
            with autocast:
                loss = model(**batch).loss / args.recipe_accumulation
            loss.backward()
            n, s_len, t_len = len(indices), batch["input_ids"].shape[1], batch["labels"].shape[1]
            padded, real = padded + n * (s_len + t_len), real + tokens
            flops += training_flops(config, n, s_len, t_len)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return padded, real, flops

    for _ in range(args.warmup):
        step()
    _synchronize(device)
    totals, start = [0, 0, 0.0], time.perf_counter()
    for _ in range(args.steps):
        totals = [a + b for a, b in zip(totals, step(), strict=True)]
    _synchronize(device)
    seconds = time.perf_counter() - start
    return {
        "size": args.recipe_size,
        "tokens_per_step": f"{args.recipe_accumulation} x {args.recipe_max_tokens}",
        "step_ms": seconds / args.steps * 1e3,
        "padded_tokens_per_s": totals[0] / seconds,
        "tokens_per_s": totals[1] / seconds,
        "padding_efficiency": totals[1] / totals[0],
        "model_tflops": totals[2] / seconds / 1e12,
        "mfu": totals[2] / seconds / (peak * 1e12) if peak else None,
        "peak_tflops": peak,
    }


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def _run(command: list[str], env: dict[str, str], log: Path, timeout: int) -> tuple[int, float]:
    start = time.perf_counter()
    with log.open("a") as handle:
        handle.write("$ " + " ".join(command) + "\n")
        handle.flush()
        try:
            code = subprocess.run(
                command, env=env, stdout=handle, stderr=subprocess.STDOUT, timeout=timeout
            ).returncode
        except subprocess.TimeoutExpired:
            code = 124
    return code, time.perf_counter() - start


def fp16_trainer_check(output_dir: Path) -> dict[str, Any]:
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
               str(ROOT / "tests" / "test_precision.py"), "-k", "fp16_trainer", "-rs"]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    log = output_dir / "fp16_check.log"
    code, seconds = _run(command, env, log, timeout=240)
    passed = code == 0 and "1 passed" in log.read_text()  # a skip (no CUDA) is not a pass
    return {"check": "fp16 Trainer loss scaling", "ok": passed, "seconds": seconds}


def fsdp_smoke(output_dir: Path, args: CheckArguments) -> dict[str, Any]:
    import shutil

    from safetensors import safe_open
    from safetensors.torch import load_file
    from transformers import AutoModelForSeq2SeqLM

    from hf_vanilla.io.checkpoints import verify_checkpoint

    run_dir, resumed_dir = output_dir / "fsdp_run", output_dir / "fsdp_resumed"
    for folder in (run_dir, resumed_dir):
        shutil.rmtree(folder, ignore_errors=True)
    cpu = args.device == "cpu"  # dry run: 2 gloo processes, FSDP forced on by the tests' shim
    processes = 2 if cpu else args.fsdp_processes

    def launch() -> list[str]:  # --main_process_port 0: accelerate picks a free port
        return [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
                str(ROOT / "configs" / "accelerate" / "fsdp.yaml"), "--num_processes", str(processes),
                "--mixed_precision", "no" if cpu else "bf16", "--main_process_port", "0",
                str(ROOT / "tests" / "train_driver.py")]  # fmt: skip

    size = ["--preset", "base", "--layers", "2", "--bf16", "true"] if not cpu else ["--d_model", "32",
            "--layers", "2", "--attention_heads", "4", "--ffn_dim", "64", "--use_cpu"]  # fmt: skip
    train = ["--demo", "--demo_train_size", "4000", "--demo_validation_size", "15", "--demo_test_size", "0",
             "--tokenizer_vocab_size", "1000", *size, "--dropout", "0",
             "--per_device_train_batch_size", str(64 // processes), "--warmup_steps", "10", "--save_steps", "10",
             "--eval_strategy", "no", "--report_to", "none", "--disable_tqdm", "true"]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(ROOT)}
    if cpu:
        env["HF_VANILLA_TEST_FSDP_ON_CPU"] = "1"
    log = output_dir / "fsdp_smoke.log"

    def run(record: str, *extra: str) -> tuple[int, float]:
        command = [*launch(), *train, *extra]
        return _run(command, {**env, "HF_VANILLA_RECORD_DIR": str(output_dir / record)}, log, timeout=240)

    codes, seconds = [], 0.0
    for record, extra in (
        ("fsdp_record_1", ["--output_dir", str(run_dir), "--max_steps", "20", "--do_eval", "false"]),
        ("fsdp_record_2", ["--output_dir", str(run_dir), "--max_steps", "30", "--resume_from_checkpoint", "last"]),
        ("fsdp_record_3", ["--output_dir", str(resumed_dir), "--max_steps", "20", "--do_eval", "false",
                           "--resume_from_checkpoint", "last"]),
    ):  # fmt: skip
        if codes and codes[-1] != 0:
            break
        if record == "fsdp_record_3" and (run_dir / "checkpoint-10").is_dir():
            shutil.copytree(run_dir / "checkpoint-10", resumed_dir / "checkpoint-10")
        code, took = run(record, *extra)
        codes.append(code)
        seconds += took

    ranks = [json.loads(p.read_text()) for p in sorted((output_dir / "fsdp_record_1").glob("rank-*.json"))]
    sharded = len(ranks) == processes and all(
        r["distributed_type"] == "DistributedType.FSDP" and r["sharded"] for r in ranks
    )
    checkpoints, problems = sorted(p.name for p in run_dir.glob("checkpoint-*")), []
    for name in checkpoints:
        try:
            verify_checkpoint(run_dir / name)
            with safe_open(run_dir / name / "model.safetensors", "pt") as handle:
                if "lm_head.weight" in set(handle.keys()):
                    problems.append(f"{name}: the shared matrix is stored twice")
        except Exception as err:  # reported in the table, not raised: the other checks still count
            problems.append(f"{name}: {err}")
    resume_diff = None
    if (resumed_dir / "checkpoint-20" / "model.safetensors").is_file() and "checkpoint-20" in checkpoints:
        again = load_file(resumed_dir / "checkpoint-20" / "model.safetensors")
        first = load_file(run_dir / "checkpoint-20" / "model.safetensors")
        resume_diff = max((again[k].float() - first[k].float()).abs().max().item() for k in first)
    loads = False
    if (run_dir / "model.safetensors").is_file():
        model = AutoModelForSeq2SeqLM.from_pretrained(run_dir)
        loads = model.lm_head.weight is model.model.shared.weight and all(
            torch.isfinite(p).all() for p in model.parameters()
        )
    bleu = None
    if (run_dir / "eval_results.json").is_file():
        bleu = json.loads((run_dir / "eval_results.json").read_text()).get("eval_bleu")
    return {
        "check": f"FSDP {processes} {'CPU process' if cpu else 'GPU'}(es): train 20, resume to 30, eval",
        "ok": codes == [0, 0, 0]
        and sharded
        and checkpoints == ["checkpoint-10", "checkpoint-20", "checkpoint-30"]
        and not problems
        and resume_diff is not None
        and resume_diff <= args.fsdp_resume_atol
        and loads
        and bleu is not None,
        "exit_codes": codes,
        "sharded_fsdp_on_every_rank": sharded,
        "checkpoints": checkpoints,
        "checkpoint_problems": problems,
        "resumed_vs_uninterrupted_max_abs_diff": resume_diff,
        "final_model_loads_tied": loads,
        "eval_bleu": bleu,
        "seconds": seconds,
        "log": str(log),
    }


def table(report: dict[str, Any]) -> dict[str, Any]:
    """The comparison's table (:mod:`benchmarks.common.results`): the training step of each size, then the
    recipe's step, then each check."""
    rows = [
        [
            f"bf16 training step, {row['size']} ({row['parameters_m']:.1f} M parameters)",
            f"{row['step_ms']:.1f} ms, {row['tokens_per_s']:.0f} tokens/s, MFU {_percent(row['mfu'])}",
        ]
        for row in report["steps"]
    ]
    if report.get("recipe_step"):
        recipe = report["recipe_step"]
        rows.append(
            [
                f"WMT14 recipe step ({recipe['size']}, {recipe['tokens_per_step']} tokens)",
                f"{recipe['step_ms']:.0f} ms, {recipe['tokens_per_s']:.0f} tokens/s, MFU {_percent(recipe['mfu'])}",
            ]
        )
    rows += [[check["check"], "OK" if check["ok"] else "FAILED"] for check in report["checks"]]
    return {
        "title": f"GPU check on {report['environment'].get('device', 'the device')}",
        "columns": ["check", "result"],
        "rows": rows,
    }


def main() -> None:
    (args,) = HfArgumentParser(CheckArguments).parse_args_into_dataclasses()
    output_dir = Path(args.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    environment = {
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "batch": f"{args.batch_size} x ({args.source_length} + {args.target_length}) tokens",
    }
    peak = peak_tflops(args, environment["device"])
    environment["peak_tflops"] = peak
    print(json.dumps(environment))
    rows = []
    for size in [s.strip() for s in args.sizes.split(",") if s.strip()]:
        plain = measure_step(size, args, checkpointing=False, peak=peak)
        if device.type == "cuda":
            torch.cuda.empty_cache()  # the model and optimizer of the last measurement are gone
        checkpointed = measure_step(size, args, checkpointing=True, peak=peak)
        if device.type == "cuda":
            torch.cuda.empty_cache()
        rows.append({**plain, "checkpointed": checkpointed})
    header = (f"{'size':5} {'params':>7} {'attn':>5} {'step ms':>8} {'tok/s':>9} {'TFLOP/s':>8} {'MFU':>6} "
              f"{'cnt/ana':>7} {'mem GiB':>8} {'ckpt GiB':>8} {'ckpt ms':>8} {'finite':>6}")  # fmt: skip
    print(header)
    for row in rows:
        ck = row["checkpointed"]
        mem = f"{row['peak_memory_gib']:.2f}" if row["peak_memory_gib"] is not None else "-"
        ck_mem = f"{ck['peak_memory_gib']:.2f}" if ck["peak_memory_gib"] is not None else "-"
        print(
            f"{row['size']:5} {row['parameters_m']:6.1f}M {row['attn_implementation']:>5} {row['step_ms']:8.1f} "
            f"{row['tokens_per_s']:9.0f} {row['model_tflops']:8.1f} {_percent(row['mfu']):>6} "
            f"{row['counted_over_analytic']:7.3f} {mem:>8} {ck_mem:>8} {ck['step_ms']:8.1f} "
            f"{row['loss_finite'] and ck['loss_finite']!s:>6}"
        )
    recipe = None
    if args.recipe_check:
        recipe = recipe_step(args, peak)
        print(
            f"WMT14 recipe step ({recipe['size']}, bf16, {recipe['tokens_per_step']} tokens, fused Adam): "
            f"{recipe['step_ms']:.0f} ms, {recipe['tokens_per_s']:.0f} tokens/s "
            f"({recipe['padded_tokens_per_s']:.0f} with padding), {recipe['model_tflops']:.1f} TFLOP/s, "
            f"MFU {_percent(recipe['mfu'])} of {peak or '?'} TFLOP/s dense bf16"
        )
    checks = []
    if args.fp16_check:
        checks.append(fp16_trainer_check(output_dir))
    if args.fsdp_smoke:
        checks.append(fsdp_smoke(output_dir, args))
    for check in checks:
        extra = {k: v for k, v in check.items() if k not in ("check", "ok", "seconds")}
        print(
            f"{check['check']}: {'OK' if check['ok'] else 'FAILED'} ({check['seconds']:.0f} s) {json.dumps(extra)}"
        )
    report = {
        "meta": metadata(),
        "environment": environment,
        "arguments": asdict(args),
        "steps": rows,
        "recipe_step": recipe,
        "checks": checks,
    }
    (output_dir / "gpu_check.json").write_text(json.dumps({**report, "table": table(report)}, indent=2))


if __name__ == "__main__":
    main()
