"""A decoding step compiled with its search and a static cache inside, against ``generate()``.

``generate()`` pays a fixed cost at every decoding step: PyTorch's dispatch of each operator of the
decoder and the search, plus the Python of the modules and of transformers' loop. At the recipe's
size that cost, not arithmetic, is most of a step (benchmarks/RESULTS.md, "CTranslate2 on one
thread"), and transformers' own compiled route (static cache, ``torch.compile(model.forward)``:
``benchmarks.marian.run --cases compiled``) leaves the search, the cache and the loop in Python. This script
measures what is left when they are not: one function that embeds the last token, runs the decoder
layers over a static (layers, rows, heads, T_max, d_k) cache that it writes in place, projects to the
vocabulary and takes the search's step (greedy: argmax; beam: log-softmax, the running scores and the
top k of each sentence's k·V continuations, the cache reordered by the beams' origins) — eager, and
``torch.compile``d (inductor; optionally with ``freezing``, which folds the weights into the graph
and prepacks them for oneDNN: ``--freezing true``), and exported, dynamically int8-quantized for
inductor (PT2E, torchao's ``X86InductorQuantizer``) and compiled with freezing (``compiled-int8``;
needs the ``quant`` extra).

The workload is ``benchmarks.ct2``'s, so the numbers stand beside CTranslate2's there: ``benchmarks.marian``'s random
weights with a zero ``</s>`` embedding (no hypothesis ever ends), ``--source_length`` random source
tokens, exactly ``--new_tokens`` steps. Rows: ms per decoding step, median and range over
``--repeats`` interleaved rounds. The step is a measuring device, not a decoder: it has no finished
hypotheses, no length penalty and no stopping rule, which real decoding needs.

    python -m benchmarks.experiments.compiled_step --size small --batch_size 1 --beams 1
    python -m benchmarks.experiments.compiled_step --size small --batch_size 32 --beams 4 --modes generate,step,compiled
    python -m benchmarks.ct2.run --size small --ct2_threads 1    # CTranslate2 on the same workload
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch
import torch._inductor.config as inductor_config
import torch.nn.functional as F
from torch import nn
from transformers import GenerationConfig, HfArgumentParser

from benchmarks.common.timing import interleave, load_average, machine_description
from benchmarks.common.workloads import BOS, EOS, PAD, build_configs, build_ours
from hf_vanilla.models.vanilla_transformer.modeling_vanilla_transformer import (
    VanillaTransformerForConditionalGeneration,
)

MODES = ("generate", "step", "compiled", "compiled-int8")


@dataclass
class StepArguments:
    size: str = field(
        default="small", metadata={"help": "Model size of benchmarks.marian: tiny, small or base."}
    )
    batch_size: int = field(default=1, metadata={"help": "Sentences per call."})
    beams: int = field(default=1, metadata={"help": "1 = greedy; k > 1 = beam search with k beams."})
    source_length: int = field(
        default=32, metadata={"help": "Source tokens per sentence (as benchmarks.ct2)."}
    )
    new_tokens: int = field(default=32, metadata={"help": "Decoding steps per call (as benchmarks.ct2)."})
    dtype: str = field(default="float32", metadata={"help": "float32 or bfloat16."})
    threads: int = field(default=2, metadata={"help": "torch's intra-op threads."})
    modes: str = field(default=",".join(MODES), metadata={"help": f"Comma-separated, of {MODES}."})
    freezing: bool = field(
        default=False,
        metadata={
            "help": "Compile with inductor's freezing: weights folded into the graph, prepacked for oneDNN."
        },
    )
    repeats: int = field(default=5, metadata={"help": "Timed rounds."})
    warmup: int = field(default=1, metadata={"help": "Untimed rounds (after the compiling one)."})
    seed: int = field(default=0, metadata={"help": "Seed of the weights and the sources."})
    json_out: str | None = field(default=None, metadata={"help": "Also write the results here as JSON."})


class DecodingStep(nn.Module):
    """One step of greedy or beam search over a static cache, reading the model's own modules.

    ``tokens`` (R,) are the last tokens of the R = B·k rows, ``position`` (1,) their position,
    ``visible`` (1, 1, 1, T_max) True up to it; ``self_keys``/``self_values`` (N, R, H, T_max, d_k) are
    written at ``position`` in place; ``cross_keys``/``cross_values`` (N, B, H, S, d_k) hold each
    sentence's encoder K/V once (its k rows attend to them together, as the model's grouped
    cross-attention does). Returns the next tokens (R,) and, for beams, the running scores (B, k).
    """

    def __init__(
        self, model: VanillaTransformerForConditionalGeneration, beams: int, max_length: int
    ) -> None:
        super().__init__()
        config = model.config
        self.decoder = model.model.decoder
        self.lm_head = model.lm_head
        self.beams = beams
        self.heads = config.decoder_attention_heads
        self.head_dim = config.d_model // self.heads
        self.embed_scale = self.decoder.embed_scale
        # the decoder's own §3.5 encoding (its layout, timescales and offset), positions 0 … T_max − 1
        positions = self.decoder.embed_positions(max_length, 0, model.device, model.dtype)
        self.register_buffer("position_table", positions, persistent=False)  # (T_max, D)

    def _heads(self, states: torch.Tensor, rows: int) -> torch.Tensor:
        """(rows, t, D) → (rows, H, t, d_k)."""
        return states.view(rows, -1, self.heads, self.head_dim).transpose(1, 2)

    def forward(
        self,
        tokens: torch.Tensor,
        scores: torch.Tensor,
        position: torch.Tensor,
        visible: torch.Tensor,
        self_keys: torch.Tensor,
        self_values: torch.Tensor,
        cross_keys: torch.Tensor,
        cross_values: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        rows, sentences = tokens.shape[0], cross_keys.shape[1]
        x = self.decoder.embed_tokens(tokens).unsqueeze(1) * self.embed_scale
        x = x + self.position_table.index_select(0, position)  # (R, 1, D)
        for i, layer in enumerate(self.decoder.layers):
            attention = layer.self_attn
            self_keys[i].index_copy_(2, position, self._heads(attention.k_proj(x), rows))
            self_values[i].index_copy_(2, position, self._heads(attention.v_proj(x), rows))
            query = self._heads(attention.q_proj(x), rows)
            attended = F.scaled_dot_product_attention(query, self_keys[i], self_values[i], attn_mask=visible)
            attended = attention.out_proj(attended.transpose(1, 2).reshape(rows, 1, -1))
            x = layer.self_attn_layer_norm(x + attended)
            attention = layer.encoder_attn
            query = self._heads(attention.q_proj(x).view(sentences, -1, x.shape[-1]), sentences)  # (B,H,k,dk)
            attended = F.scaled_dot_product_attention(query, cross_keys[i], cross_values[i])
            attended = attention.out_proj(attended.transpose(1, 2).reshape(rows, 1, -1))
            x = layer.encoder_attn_layer_norm(x + attended)
            x = layer.final_layer_norm(x + layer.fc2(F.relu(layer.fc1(x))))
        logits = self.lm_head(x[:, 0]).float()  # (R, V)
        if self.beams == 1:
            return logits.argmax(-1), scores
        vocab = logits.shape[-1]
        candidates = F.log_softmax(logits, dim=-1) + scores.view(rows, 1)  # (R, V)
        scores, best = candidates.view(sentences, self.beams * vocab).topk(self.beams)  # (B, k)
        origin = (best // vocab + torch.arange(sentences).unsqueeze(1) * self.beams).view(rows)
        self_keys.copy_(self_keys.index_select(1, origin))  # each beam continues its origin's cache
        self_values.copy_(self_values.index_select(1, origin))
        return (best % vocab).view(rows), scores


def encoder_keys_values(
    model: VanillaTransformerForConditionalGeneration, source: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each decoder layer's cross-attention K/V of the encoder output, (N, B, H, S, d_k) each."""
    config = model.config
    heads = config.decoder_attention_heads
    states = model.get_encoder()(input_ids=source).last_hidden_state  # (B, S, D)
    shape = (states.shape[0], states.shape[1], heads, config.d_model // heads)
    layers = model.model.decoder.layers
    keys = torch.stack([layer.encoder_attn.k_proj(states).view(shape).transpose(1, 2) for layer in layers])
    values = torch.stack([layer.encoder_attn.v_proj(states).view(shape).transpose(1, 2) for layer in layers])
    return keys.contiguous(), values.contiguous()


def make_loop(
    step: Callable[..., tuple[torch.Tensor, torch.Tensor]],
    model: VanillaTransformerForConditionalGeneration,
    source: torch.Tensor,
    args: StepArguments,
) -> Callable[[], torch.Tensor]:
    """A call that encodes ``source`` and decodes ``new_tokens`` steps with ``step``; returns the
    (R, new_tokens) tokens the step chose."""
    config = model.config
    rows = source.shape[0] * args.beams
    cache_shape = (config.decoder_layers, rows, config.decoder_attention_heads, args.new_tokens)
    cache_shape += (config.d_model // config.decoder_attention_heads,)
    steps = torch.arange(args.new_tokens)

    def run() -> torch.Tensor:
        with torch.inference_mode():
            cross_keys, cross_values = encoder_keys_values(model, source)
            self_keys = torch.zeros(cache_shape, dtype=model.dtype)
            self_values = torch.zeros(cache_shape, dtype=model.dtype)
            tokens = torch.full((rows,), BOS, dtype=torch.long)
            scores = torch.zeros(source.shape[0], args.beams)
            scores[:, 1:] = -1e9  # the k rows start as one hypothesis
            chosen = []
            for t in range(args.new_tokens):
                visible = (steps <= t).view(1, 1, 1, -1)
                tokens, scores = step(
                    tokens,
                    scores,
                    steps[t : t + 1],
                    visible,
                    self_keys,
                    self_values,
                    cross_keys,
                    cross_values,
                )
                chosen.append(tokens)
            return torch.stack(chosen, dim=1)

    return run


def quantize_int8(
    step: DecodingStep,
    model: VanillaTransformerForConditionalGeneration,
    source: torch.Tensor,
    args: StepArguments,
) -> torch.nn.Module:
    """The step exported and dynamically int8-quantized for inductor (PT2E, torchao's
    ``X86InductorQuantizer``: int8 weights per channel, activations quantized per call, oneDNN
    kernels once compiled with freezing)."""
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
    from torchao.quantization.pt2e.quantizer import x86_inductor_quantizer as x86

    captured: list[tuple[torch.Tensor, ...]] = []

    def capture(*inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if not captured:  # normal tensors (not inference ones): export writes to the caches in place
            with torch.inference_mode(False):
                captured.append(tuple(x.clone() for x in inputs))
        return step(*inputs)

    make_loop(capture, model, source, args)()  # example inputs of one step
    with torch.no_grad():
        exported = torch.export.export(step, captured[0], strict=False).module()
        quantizer = x86.X86InductorQuantizer()
        quantizer.set_global(x86.get_default_x86_inductor_quantization_config(is_dynamic=True))
        prepared = prepare_pt2e(exported, quantizer)
        make_loop(prepared, model, source, args)()  # calibrates (dynamic: observes nothing that stays)
        return convert_pt2e(prepared)


def make_generate(
    model: VanillaTransformerForConditionalGeneration, source: torch.Tensor, args: StepArguments
) -> Callable[[], torch.Tensor]:
    """``generate()`` on the same sources: ``--beams`` beams, exactly ``--new_tokens`` new tokens."""
    config = GenerationConfig(
        max_new_tokens=args.new_tokens,
        num_beams=args.beams,
        do_sample=False,
        decoder_start_token_id=BOS,
        eos_token_id=EOS,
        pad_token_id=PAD,
    )
    mask = torch.ones_like(source)

    def run() -> torch.Tensor:
        with torch.inference_mode():
            return model.generate(source, attention_mask=mask, generation_config=config)[:, 1:]

    return run


def main() -> None:
    (args,) = HfArgumentParser(StepArguments).parse_args_into_dataclasses()
    modes = args.modes.split(",")
    unknown = set(modes) - set(MODES)
    if unknown:
        raise SystemExit(f"Unknown --modes {sorted(unknown)}: choose from {', '.join(MODES)}.")
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    config, _ = build_configs(args.size)
    model = build_ours(config, args.seed).to(getattr(torch, args.dtype)).eval()
    source = torch.randint(4, config.vocab_size, (args.batch_size, args.source_length))
    source[:, -1] = EOS
    calls: dict[str, Callable[[], torch.Tensor]] = {}
    compile_seconds: dict[str, float] = {}
    outputs: dict[str, torch.Tensor] = {}
    for mode in modes:
        if mode == "generate":
            calls[mode] = make_generate(model, source, args)
            outputs[mode] = calls[mode]()
            continue
        step: Callable[..., tuple[torch.Tensor, torch.Tensor]] = DecodingStep(
            model, args.beams, args.new_tokens
        )
        start = time.perf_counter()
        if mode == "compiled-int8":
            step = quantize_int8(step, model, source, args)
        if mode.startswith("compiled"):
            step = torch.compile(step, fullgraph=True, dynamic=False)
        calls[mode] = make_loop(step, model, source, args)
        # inductor reads `freezing` when it compiles, at the first call (int8's prepacking needs it)
        with inductor_config.patch(freezing=args.freezing or mode == "compiled-int8"):
            outputs[mode] = calls[mode]()
        compile_seconds[mode] = time.perf_counter() - start
    # Greedy: every mode picks the same tokens. Beam: the step's per-row tokens are not generate()'s
    # backtracked best hypotheses, so the step is compared with its compiled self only.
    # int8 rounds differently: its share of tokens equal to the first fp32 mode's is reported instead.
    comparable = {
        mode: out
        for mode, out in outputs.items()
        if mode != "compiled-int8" and (args.beams == 1 or mode != "generate")
    }
    reference = next(iter(comparable.values()), None)
    same = {mode: bool(torch.equal(out, reference)) for mode, out in comparable.items()}
    agreement = {
        mode: float((out == reference).float().mean())
        for mode, out in outputs.items()
        if reference is not None and out.shape == reference.shape
    }
    timings = interleave(calls, args.warmup, args.repeats)
    rows = {
        mode: {
            "ms_per_step": timing.median * 1e3 / args.new_tokens,
            "range": [
                min(timing.seconds) * 1e3 / args.new_tokens,
                max(timing.seconds) * 1e3 / args.new_tokens,
            ],
            "first_call_seconds": compile_seconds.get(mode),
            "tokens_equal_first_mode": same.get(mode),
            "token_agreement": agreement.get(mode),
        }
        for mode, timing in timings.items()
    }
    base = rows.get("generate")
    for mode, row in rows.items():
        ratio = f", {base['ms_per_step'] / row['ms_per_step']:.2f}× generate()" if base else ""
        first = row["first_call_seconds"]
        print(
            f"{mode:16s} {row['ms_per_step']:7.3f} ms/step [{row['range'][0]:.3f}–{row['range'][1]:.3f}]{ratio}"
            + (f", first call {first:.1f} s" if first is not None else "")
            + ("" if row["tokens_equal_first_mode"] in (None, True) else ", TOKENS DIFFER")
            + (f", {row['token_agreement']:.0%} of tokens as fp32" if mode == "compiled-int8" else "")
        )
    result = {"args": asdict(args), "machine": machine_description(), "load": load_average(), "rows": rows}
    if args.json_out:
        with open(args.json_out, "w", encoding="utf-8") as handle:
            json.dump(result, handle, indent=2)
    print(json.dumps({mode: round(row["ms_per_step"], 3) for mode, row in rows.items()}))


if __name__ == "__main__":
    main()
