"""Before/after check for speed work on the modeling file: same outputs within fp tolerance.

    python -m benchmarks.experiments.check_equivalence --save /tmp/reference.pt     # before a change
    python -m benchmarks.experiments.check_equivalence --compare /tmp/reference.pt  # after it

It records, for a few tiny configurations (with and without attention biases, with padding, label
smoothing): eval logits, training loss and every gradient under a fixed dropout seed, and the outputs
of greedy, beam-4 (with n-best lists), sampled and attention-returning generation, and compares them
with ``atol`` (default 1e-5; generated token ids must be equal). The tests in tests/models/test_modeling.py
check properties (eager == SDPA, cache == no cache, save → load); this checks that a speed change
left the function itself alone.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import torch

from hf_vanilla import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration

CONFIGS: dict[str, dict[str, Any]] = {
    "tiny": {"vocab_size": 100, "d_model": 32, "encoder_layers": 2, "decoder_layers": 2,
             "encoder_attention_heads": 4, "decoder_attention_heads": 4, "encoder_ffn_dim": 64,
             "decoder_ffn_dim": 64, "max_position_embeddings": 64},
    "tiny_bias_ls": {"vocab_size": 120, "d_model": 48, "encoder_layers": 2, "decoder_layers": 3,
                     "encoder_attention_heads": 4, "decoder_attention_heads": 6, "encoder_ffn_dim": 96,
                     "decoder_ffn_dim": 80, "max_position_embeddings": 64, "attention_bias": True,
                     "label_smoothing": 0.1},
}  # fmt: skip


def batch(vocab: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(7)
    input_ids = torch.randint(4, vocab, (3, 10), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    input_ids[1, 6:], attention_mask[1, 6:] = 0, 0
    input_ids[2, 3:], attention_mask[2, 3:] = 0, 0
    labels = torch.randint(4, vocab, (3, 8), generator=generator)
    labels[2, 5:] = -100
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def record(name: str, overrides: dict[str, Any]) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    model = VanillaTransformerForConditionalGeneration(VanillaTransformerConfig(**overrides))
    data = batch(overrides["vocab_size"])
    out: dict[str, torch.Tensor] = {}
    model.eval()
    with torch.no_grad():
        out["eval_logits"] = model(**data).logits
        out["eval_loss"] = model(**data).loss
    model.train()
    torch.manual_seed(1)
    loss = model(**data).loss
    loss.backward()
    out["train_loss"] = loss.detach()
    for param_name, param in model.named_parameters():
        if param.grad is not None:
            out[f"grad.{param_name}"] = param.grad.clone()
    model.eval()
    source = {"input_ids": data["input_ids"], "attention_mask": data["attention_mask"]}
    with torch.no_grad():
        out["greedy"] = model.generate(**source, num_beams=1, max_new_tokens=12)
        beam = model.generate(
            **source,
            num_beams=4,
            num_return_sequences=2,
            max_new_tokens=12,
            return_dict_in_generate=True,
            output_scores=True,
        )
        out["beam_sequences"] = beam.sequences
        out["beam_scores"] = beam.sequences_scores
        out["beam_default"] = model.generate(**source)  # §6.1 defaults: beam 4, α 0.6, source + 50
        torch.manual_seed(3)
        out["sampled"] = model.generate(**source, do_sample=True, num_return_sequences=3, max_new_tokens=10)
        attn = model.generate(
            **source,
            num_beams=2,
            max_new_tokens=5,
            return_dict_in_generate=True,
            output_attentions=True,
            output_scores=True,
        )
        out["attn_sequences"] = attn.sequences
        out["attn_cross_last"] = attn.cross_attentions[-1][-1]
        out["attn_self_last"] = attn.decoder_attentions[-1][-1]
        out["attn_encoder"] = attn.encoder_attentions[-1]
    return {f"{name}.{key}": value for key, value in out.items()}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--save", help="write the reference outputs here")
    group.add_argument("--compare", help="compare with the reference outputs saved here")
    parser.add_argument("--atol", type=float, default=1e-5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    results: dict[str, torch.Tensor] = {}
    for name, overrides in CONFIGS.items():
        results.update(record(name, overrides))
    if args.save:
        torch.save(results, args.save)
        print(f"saved {len(results)} tensors to {args.save}")
        return
    reference = torch.load(args.compare, weights_only=True)
    failures = []
    for key in sorted(set(reference) | set(results)):
        if key not in reference or key not in results:
            failures.append(f"{key}: present in only one of the runs")
            continue
        a, b = reference[key], results[key]
        if a.shape != b.shape:
            failures.append(f"{key}: shape {tuple(a.shape)} != {tuple(b.shape)}")
        elif not a.is_floating_point():
            if not torch.equal(a, b):
                failures.append(f"{key}: token ids differ")
        elif not torch.allclose(a, b, atol=args.atol, rtol=0):
            failures.append(f"{key}: max |Δ| = {float((a - b).abs().max()):.2e}")
    worst = max(
        (float((reference[k] - results[k]).abs().max()) for k in reference
         if k in results and reference[k].is_floating_point() and reference[k].shape == results[k].shape),
        default=0.0,
    )  # fmt: skip
    print(f"compared {len(reference)} tensors; worst float |Δ| = {worst:.2e}")
    if failures:
        print("DIFFERENT:\n  " + "\n  ".join(failures))
        sys.exit(1)
    print("same within atol", args.atol)


if __name__ == "__main__":
    main()
