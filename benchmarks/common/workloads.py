"""Workloads for benchmarks/marian/run.py: the two models and the cases timed on them.

Both models get the same dimensions and the *same weights* (:func:`build_marian` copies hf_vanilla's
state dict into Marian and overwrites Marian's position table with the paper's interleaved layout);
:func:`check_same_function` proves it before anything is timed. Each ``run_*`` case returns a
:class:`~bench_timing.Row` (or, for memory, compiled decoding and the Multi30k epoch, a dict) for
``bench_report``.
"""

from __future__ import annotations

import copy
import json
import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from transformers import (
    DataCollatorForSeq2Seq,
    GenerationConfig,
    MarianConfig,
    MarianMTModel,
    PreTrainedTokenizerBase,
)

from benchmarks.common.timing import MARIAN, OURS, Row, interleave, load_average
from benchmarks.marian.options import BenchArguments
from hf_vanilla import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration
from hf_vanilla.models.vanilla_transformer import modeling_vanilla_transformer
from hf_vanilla.models.vanilla_transformer.modeling_vanilla_transformer import sinusoidal_position_encoding
from hf_vanilla.speed import fast_paths

#: The entry point, which also runs each memory measurement in a fresh process (``--memory_child``).
PAD, BOS, EOS, UNK = 0, 1, 2, 3

#: Model sizes. ``base`` is Table 3's base model with a 32k shared vocabulary.
SIZES: dict[str, dict[str, int]] = {
    "tiny": {"vocab_size": 1000, "d_model": 64, "layers": 2, "heads": 4, "ffn": 256},
    "small": {"vocab_size": 8000, "d_model": 256, "layers": 3, "heads": 4, "ffn": 1024},
    "base": {"vocab_size": 32000, "d_model": 512, "layers": 6, "heads": 8, "ffn": 2048},
}


# --------------------------------------------------------------------------------------------------
# The two models: same dimensions, same weights, same function
# --------------------------------------------------------------------------------------------------
def build_configs(size: str) -> tuple[VanillaTransformerConfig, MarianConfig]:
    if size not in SIZES:
        raise ValueError(f"Unknown --size {size!r}: choose one of {sorted(SIZES)}.")
    s = SIZES[size]
    dims = {
        "vocab_size": s["vocab_size"],
        "d_model": s["d_model"],
        "encoder_layers": s["layers"],
        "decoder_layers": s["layers"],
        "encoder_attention_heads": s["heads"],
        "decoder_attention_heads": s["heads"],
        "encoder_ffn_dim": s["ffn"],
        "decoder_ffn_dim": s["ffn"],
        "max_position_embeddings": 1024,
        "dropout": 0.1,
        "attention_dropout": 0.0,
        "activation_dropout": 0.0,
        "activation_function": "relu",
        "scale_embedding": True,
        "tie_word_embeddings": True,
        "pad_token_id": PAD,
        "bos_token_id": BOS,
        "eos_token_id": EOS,
        "decoder_start_token_id": BOS,
    }
    ours = VanillaTransformerConfig(**dims, attention_bias=True)
    marian = MarianConfig(
        **dims,
        decoder_vocab_size=s["vocab_size"],
        share_encoder_decoder_embeddings=True,
        forced_eos_token_id=None,
    )
    return ours, marian


def build_ours(
    config: VanillaTransformerConfig, seed: int, folder_code: bool = False
) -> VanillaTransformerForConditionalGeneration:
    """Random weights, except that the embedding row of ``</s>`` is zero: the tied output projection
    then gives ``</s>`` a logit of exactly 0 at every step, the median of the random logits, so no
    greedy or beam hypothesis ever ends and every engine decodes exactly ``max_new_tokens`` without a
    minimum-length rule (``min_new_tokens`` adds two full-vocabulary passes per step to ``generate()``
    that real decoding does not have, and CTranslate2's ``min_decoding_length`` costs nothing)."""
    torch.manual_seed(seed)
    if folder_code:  # what a folder loaded without hf_vanilla runs: stock operators and search
        fast_paths.set_enabled(False)
        model = modeling_vanilla_transformer.VanillaTransformerForConditionalGeneration(config)
    else:
        model = VanillaTransformerForConditionalGeneration(config)
    with torch.no_grad():
        model.get_input_embeddings().weight[EOS].zero_()
    return model


def build_marian(
    config: MarianConfig, ours: VanillaTransformerForConditionalGeneration | None
) -> MarianMTModel:
    """Marian with hf_vanilla's weights (when given) and the paper's position-encoding layout."""
    marian = MarianMTModel(config)
    if ours is not None:
        state = ours.state_dict()
        result = marian.load_state_dict(state, strict=False)
        expected_missing = {
            "final_logits_bias",
            "model.encoder.embed_positions.weight",
            "model.decoder.embed_positions.weight",
        }
        if result.unexpected_keys or set(result.missing_keys) - expected_missing:
            raise RuntimeError(f"Weight copy into Marian failed: {result}")
    table = sinusoidal_position_encoding(torch.arange(config.max_position_embeddings), config.d_model)
    with torch.no_grad():
        marian.model.encoder.embed_positions.weight.copy_(table)
        marian.model.decoder.embed_positions.weight.copy_(table)
        marian.final_logits_bias.zero_()
    return marian


def check_same_function(
    ours: VanillaTransformerForConditionalGeneration, marian: MarianMTModel, seed: int
) -> dict[str, Any]:
    """Same logits (eval mode) and the same beam-4 output: the benchmark compares one function."""
    generator = torch.Generator().manual_seed(seed)
    vocab = ours.config.vocab_size
    source = torch.randint(4, vocab, (3, 11), generator=generator)
    mask = torch.ones_like(source)
    source[2, 7:], mask[2, 7:] = PAD, 0
    labels = torch.randint(4, vocab, (3, 9), generator=generator)
    ours.eval(), marian.eval()
    with torch.inference_mode():
        a = ours(input_ids=source, attention_mask=mask, labels=labels)
        b = marian(input_ids=source, attention_mask=mask, labels=labels)
        config = generation_config(num_beams=4, new_tokens=12)
        same_beam = torch.equal(
            ours.generate(source, attention_mask=mask, generation_config=config),
            marian.generate(source, attention_mask=mask, generation_config=config),
        )
    diff = float((a.logits - b.logits).abs().max())
    if diff > 1e-3 or not same_beam:
        raise RuntimeError(
            f"The two models are not the same function (max |Δlogit| = {diff:.2e}, same beam output: "
            f"{same_beam}); the weight copy or the Marian config is wrong."
        )
    return {
        "max_abs_logit_diff": diff,
        "loss_diff": float((a.loss - b.loss).abs()),
        "same_beam_output": same_beam,
    }


def generation_config(num_beams: int, new_tokens: int) -> GenerationConfig:
    """At most ``new_tokens`` tokens (exactly that many on :func:`build_ours`' weights, which never end a
    hypothesis), no sampling; §6.1's α = 0.6 for beam search."""
    beam_options = {"length_penalty": 0.6, "early_stopping": True} if num_beams > 1 else {}
    return GenerationConfig(
        do_sample=False,
        num_beams=num_beams,
        max_new_tokens=new_tokens,
        **beam_options,
        use_cache=True,
        pad_token_id=PAD,
        bos_token_id=BOS,
        eos_token_id=EOS,
        decoder_start_token_id=BOS,
    )


# --------------------------------------------------------------------------------------------------
# FLOPs (matrix products only: GEMMs and the two attention products) and weight bytes
# --------------------------------------------------------------------------------------------------
def forward_flops(config: VanillaTransformerConfig, batch: int, source: int, target: int) -> float:
    """Multiply-adds × 2 of one teacher-forced forward pass; attention counts the full T×K products."""
    d, f, v = config.d_model, config.encoder_ffn_dim, config.vocab_size
    enc = batch * source * (8 * d * d + 4 * d * f) + 4 * batch * source * source * d
    dec = (
        batch * target * (8 * d * d + 4 * d * d + 4 * d * f)  # self q,k,v,o; cross q,o; FFN
        + batch * source * 4 * d * d  # cross k,v
        + 4 * batch * target * target * d  # self QKᵀ and PV
        + 4 * batch * target * source * d  # cross QKᵀ and PV
    )
    head = 2 * batch * target * d * v
    return config.encoder_layers * enc + config.decoder_layers * dec + head


def generate_flops(
    config: VanillaTransformerConfig, batch: int, beams: int, source: int, new_tokens: int
) -> float:
    """Useful FLOPs of cached decoding: the encoder once, cross K/V once, then one row per hypothesis."""
    d, f, v = config.d_model, config.decoder_ffn_dim, config.vocab_size
    rows = batch * beams
    enc = config.encoder_layers * (batch * source * (8 * d * d + 4 * d * f) + 4 * batch * source * source * d)
    cross_kv = config.decoder_layers * rows * source * 4 * d * d
    per_step_fixed = (
        config.decoder_layers * rows * (12 * d * d + 4 * d * f + 4 * source * d) + 2 * rows * d * v
    )
    attention = sum(config.decoder_layers * 4 * rows * (t + 1) * d for t in range(new_tokens))
    return enc + cross_kv + new_tokens * per_step_fixed + attention


def decode_step_weight_bytes(model: VanillaTransformerForConditionalGeneration) -> int:
    """Bytes of weights one cached decoding step must read: the decoder without the cross-attention
    K/V projections (used once per generation) plus the output projection."""
    total = 0
    for name, param in model.model.decoder.named_parameters():
        if "embed_tokens" in name or "encoder_attn.k_proj" in name or "encoder_attn.v_proj" in name:
            continue
        total += param.numel() * param.element_size()
    return total + model.lm_head.weight.numel() * model.lm_head.weight.element_size()


# --------------------------------------------------------------------------------------------------
# Cases
# --------------------------------------------------------------------------------------------------
def random_batch(vocab: int, batch: int, length: int, generator: torch.Generator) -> torch.Tensor:
    return torch.randint(4, vocab, (batch, length), generator=generator)


def training_batch(config: VanillaTransformerConfig, args: BenchArguments) -> dict[str, torch.Tensor]:
    """The random training batch of the train and memory cases: ``batch_size`` sentences of
    ``source_length`` → ``target_length`` tokens."""
    generator = torch.Generator().manual_seed(args.seed + 1)
    source = random_batch(config.vocab_size, args.batch_size, args.source_length, generator)
    labels = random_batch(config.vocab_size, args.batch_size, args.target_length, generator)
    return {"input_ids": source, "attention_mask": torch.ones_like(source), "labels": labels}


def make_optimizer(model: torch.nn.Module) -> torch.optim.AdamW:
    """AdamW with the paper's β and ε, fused: the Trainer's default optimizer (``adamw_torch_fused``
    on torch ≥ 2.8)."""
    return torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9, fused=True)


def make_train_step(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> Callable[[], float]:
    """One Trainer-like step: forward with labels, backward, fused AdamW, zero grads."""
    optimizer = make_optimizer(model)

    def step() -> float:
        model.train()
        loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return float(loss.detach())

    return step


def make_generate(
    model: torch.nn.Module, source: torch.Tensor, config: GenerationConfig, new_tokens: int
) -> Callable[[], torch.Tensor]:
    mask = torch.ones_like(source)

    def run() -> torch.Tensor:
        model.eval()
        with torch.inference_mode():
            out = model.generate(source, attention_mask=mask, generation_config=config)
        if out.shape[1] != new_tokens + 1 or bool((out[:, 1:] == EOS).any()):
            raise RuntimeError(f"Expected {new_tokens} new tokens in every row, got {out[:, 1:].tolist()}.")
        return out

    return run


def run_train(
    ours: torch.nn.Module,
    marian: torch.nn.Module,
    config: VanillaTransformerConfig,
    args: BenchArguments,
    repeats: int,
) -> Row:
    batch = training_batch(config, args)
    calls = {OURS: make_train_step(ours, batch), MARIAN: make_train_step(marian, batch)}
    timings = interleave(calls, args.warmup, repeats, args.clock)
    flops = 3 * forward_flops(config, args.batch_size, args.source_length, args.target_length)
    return Row(
        f"train step (fwd+bwd+AdamW), {args.batch_size} × {args.source_length}→{args.target_length}",
        "ms/step",
        timings,
        steps=1,
        tokens=args.batch_size * args.target_length,
        flops=flops,
    )


def decoding_case(
    config: VanillaTransformerConfig, args: BenchArguments, batch: int, beams: int, new_tokens: int
) -> tuple[str, torch.Tensor, GenerationConfig]:
    """A decoding case's name, its random source batch and its generation config, the same for every
    model timed on it."""
    generator = torch.Generator().manual_seed(args.seed + 2)
    source = random_batch(config.vocab_size, batch, args.source_length, generator)
    search = "greedy" if beams == 1 else f"beam {beams}"
    case = f"generate {search}, batch {batch}, {args.source_length}→{new_tokens} tokens"
    return case, source, generation_config(beams, new_tokens)


def run_generate(
    ours: torch.nn.Module,
    marian: torch.nn.Module,
    config: VanillaTransformerConfig,
    args: BenchArguments,
    batch: int,
    beams: int,
    new_tokens: int,
    repeats: int,
) -> Row:
    case, source, gen_config = decoding_case(config, args, batch, beams, new_tokens)
    calls = {
        OURS: make_generate(ours, source, gen_config, new_tokens),
        MARIAN: make_generate(marian, source, gen_config, new_tokens),
    }
    timings = interleave(calls, args.warmup, repeats, args.clock)
    return Row(
        case,
        "ms/new token",
        timings,
        steps=new_tokens,
        tokens=batch * new_tokens,
        flops=generate_flops(config, batch, beams, args.source_length, new_tokens),
        extra={"batch": batch, "beams": beams, "new_tokens": new_tokens},
    )


def run_compiled(
    ours: VanillaTransformerForConditionalGeneration,
    config: VanillaTransformerConfig,
    args: BenchArguments,
    batch: int,
    beams: int,
    new_tokens: int,
    repeats: int,
) -> dict[str, Any]:
    """Compiled decoding — a static cache and ``torch.compile(model.forward)``, transformers' route to
    fast generation — against the same model's eager decoding with its growing cache, interleaved."""
    case, source, eager_config = decoding_case(config, args, batch, beams, new_tokens)
    static_config = copy.deepcopy(eager_config)
    static_config.cache_implementation = "static"
    compiled = copy.deepcopy(ours)
    compiled.forward = torch.compile(compiled.forward, fullgraph=True)
    run_compiled_generate = make_generate(compiled, source, static_config, new_tokens)
    start = time.perf_counter()
    run_compiled_generate()  # compiles
    compile_seconds = time.perf_counter() - start
    timings = interleave(
        {"eager": make_generate(ours, source, eager_config, new_tokens), "compiled": run_compiled_generate},
        args.warmup,
        repeats,
        args.clock,
    )
    ratios = [e / c for e, c in zip(timings["eager"].seconds, timings["compiled"].seconds, strict=True)]
    return {
        "case": case,
        "compile_seconds": compile_seconds,
        "eager_ms_per_token": timings["eager"].median * 1e3 / new_tokens,
        "compiled_ms_per_token": timings["compiled"].median * 1e3 / new_tokens,
        "speedup": statistics.median(ratios),
        "speedup_range": [min(ratios), max(ratios)],
    }


def _rss_bytes(field_name: str) -> int:
    """``VmRSS`` (resident now) or ``VmHWM`` (resident high-water mark) of this process, in bytes."""
    with open("/proc/self/status", encoding="ascii") as handle:
        for line in handle:
            if line.startswith(field_name + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field_name} not found in /proc/self/status")


def memory_child(args: BenchArguments) -> None:
    """Peak resident memory of training steps of one model, in a fresh process (printed as JSON).

    torch's CPU allocator keeps no statistics and tracemalloc sees only Python objects, so the
    high-water mark of the process's resident set is the measure: it sees weights, gradients, AdamW
    state, activations and allocator slack alike. After the imports the mark is reset (Linux
    ``/proc/self/clear_refs``), so the number is what building the model and training it add,
    the same accounting for both models.
    """
    with open("/proc/self/clear_refs", "w", encoding="ascii") as handle:
        handle.write("5")  # reset VmHWM to the current resident set
    baseline = _rss_bytes("VmRSS")
    ours_config, marian_config = build_configs(args.size)
    model = (
        build_ours(ours_config, args.seed, args.folder_code)
        if args.memory_child == OURS
        else build_marian(marian_config, None)
    )
    batch = training_batch(ours_config, args)
    after_build = _rss_bytes("VmHWM")
    step = make_train_step(model, batch)
    for _ in range(3):
        step()
    peak = _rss_bytes("VmHWM")
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    print(json.dumps({"baseline": baseline, "after_build": after_build, "peak": peak, "param_bytes": params}))


def run_memory(args: BenchArguments) -> dict[str, dict[str, int]]:
    results = {}
    for name in (OURS, MARIAN):
        command = [sys.executable, "-m", "benchmarks.marian.run", "--memory_child", name, "--size", args.size]
        command += ["--batch_size", str(args.batch_size), "--source_length", str(args.source_length)]
        command += ["--target_length", str(args.target_length), "--seed", str(args.seed)]
        if args.threads is not None:
            command += ["--threads", str(args.threads)]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"Memory measurement of {name} failed:\n{done.stderr[-3000:]}")
        results[name] = json.loads(done.stdout.strip().splitlines()[-1])
    return results


# --------------------------------------------------------------------------------------------------
# Real data: one Multi30k epoch, token-budget batches vs sentence-count batches
# --------------------------------------------------------------------------------------------------
def multi30k_examples(
    args: BenchArguments, vocab_size: int
) -> tuple[list[tuple[list[int], list[int]]], PreTrainedTokenizerBase]:
    """Tokenised (source, target) id lists ending in ``</s>``, from the project's byte-level BPE
    (``hf_vanilla.data.tokenization``) trained on the training text, in a seeded random order; and the
    tokenizer."""
    from hf_vanilla.data.loading import read_parallel_text
    from hf_vanilla.data.tokenization import train_bpe_tokenizer

    folder = args.multi30k or ""
    langs = (args.multi30k_source, args.multi30k_target)
    paths = {lang: os.path.join(folder, f"train.{lang}.gz") for lang in langs}
    for path in paths.values():
        if not os.path.exists(path):
            raise FileNotFoundError(
                f"--multi30k {folder!r}: {path} does not exist (expected train.{{de,en}}.gz)."
            )
    source_lines, target_lines = read_parallel_text(paths[langs[0]], paths[langs[1]])
    tokenizer = train_bpe_tokenizer([source_lines + target_lines], vocab_size=min(vocab_size, 8000))
    pairs = list(zip(tokenizer(source_lines)["input_ids"], tokenizer(target_lines)["input_ids"], strict=True))
    random.Random(args.seed).shuffle(pairs)
    if args.multi30k_sentences is not None:
        pairs = pairs[: args.multi30k_sentences]
    return pairs, tokenizer


def sentence_batches(pairs: Sequence[tuple[list[int], list[int]]], batch_size: int) -> list[list[int]]:
    """The Trainer's default: the (already shuffled) epoch in consecutive groups of ``batch_size``."""
    return [list(range(i, min(i + batch_size, len(pairs)))) for i in range(0, len(pairs), batch_size)]


def token_budget_batches(
    pairs: Sequence[tuple[list[int], list[int]]], max_tokens: int, seed: int
) -> list[list[int]]:
    """hf_vanilla's batches: ``TokenBudgetBatchSampler`` (length-sorted, ≤ ``max_tokens`` padded
    source + target tokens per batch, batch order shuffled)."""
    from hf_vanilla.data.batching import TokenBudgetBatchSampler

    sampler = TokenBudgetBatchSampler(
        [len(src) for src, _ in pairs], [len(tgt) for _, tgt in pairs], max_tokens, seed=seed
    )
    return list(sampler)


def run_multi30k(
    ours: torch.nn.Module, marian: torch.nn.Module, config: VanillaTransformerConfig, args: BenchArguments
) -> dict[str, Any]:
    pairs, tokenizer = multi30k_examples(args, config.vocab_size)
    collator = DataCollatorForSeq2Seq(tokenizer, return_tensors="pt")  # the Trainer's: pad, labels -100

    def collate(indices: Sequence[int]) -> dict[str, torch.Tensor]:
        return collator([{"input_ids": pairs[i][0], "labels": pairs[i][1]} for i in indices])

    mean_len = statistics.fmean(len(src) + len(tgt) for src, tgt in pairs)
    max_tokens = round(args.batch_size * mean_len)  # ≈ the same sentences per step as the Trainer batches
    plans = {
        OURS: [collate(b) for b in token_budget_batches(pairs, max_tokens, args.seed)],
        MARIAN: [collate(b) for b in sentence_batches(pairs, args.batch_size)],
    }
    stats = {
        name: {
            "seconds": 0.0,
            "real_target_tokens": 0,
            "padded_target_tokens": 0,
            "padded_source_tokens": 0,
            "real_source_tokens": 0,
            "steps": len(plan),
            "load": [],
        }
        for name, plan in plans.items()
    }
    models = {OURS: ours, MARIAN: marian}
    optimizers = {name: make_optimizer(model) for name, model in models.items()}
    for name, model in models.items():  # warm-up: one untimed step each (allocates the AdamW state)
        model.train()
        model(**plans[name][0]).loss.backward()
        optimizers[name].step()
        optimizers[name].zero_grad(set_to_none=True)
    timer = time.process_time if args.clock == "cpu" else time.perf_counter
    for index in range(max(len(plan) for plan in plans.values())):
        for name, plan in plans.items():
            if index >= len(plan):
                continue
            batch = plan[index]
            stats[name]["load"].append(load_average())
            start = timer()
            model = models[name]
            loss = model(**batch).loss
            loss.backward()
            optimizers[name].step()
            optimizers[name].zero_grad(set_to_none=True)
            stats[name]["seconds"] += timer() - start
            stats[name]["real_target_tokens"] += int((batch["labels"] != -100).sum())
            stats[name]["padded_target_tokens"] += batch["labels"].numel()
            stats[name]["real_source_tokens"] += int(batch["attention_mask"].sum())
            stats[name]["padded_source_tokens"] += batch["input_ids"].numel()
    for values in stats.values():
        values["real_target_tokens_per_s"] = values["real_target_tokens"] / values["seconds"]
    return {"sentences": len(pairs), "max_tokens": max_tokens, "sentence_batch": args.batch_size, **stats}
