"""Beam search's stopping rule on tiny random models: how often transformers' ``early_stopping=True``
and ``False`` return a worse best hypothesis than ``"never"``, and what each costs in time.

    python -m benchmarks.experiments.early_stopping [--models 4] [--sentences 40] [--rounds 3] [--eos_bias 9]

§6.1 decodes with beam 4 and α = 0.6 and "terminate[s] early when possible": stop when no running
hypothesis can still beat the finished ones. That is transformers' ``"never"``; ``True`` stops as soon
as ``num_beams`` hypotheses have finished, ``False`` when the best running score, at the current
length, cannot beat the worst finished one (a heuristic). For each random model (the tests' tiny
configuration, seeds 0, 1, ...) and random source sentence (3-12 tokens, batches of 8), all three
decode with the model's §6.1 settings; the best hypothesis's score (HF's log P / |Y|^α) is compared
with ``"never"``'s. Times are the median over ``--rounds`` interleaved rounds, one torch thread.

The tests' tiny random models never choose </s>: every hypothesis runs to the source + 50 bound and
the three rules cannot differ. Here the embeddings are drawn with ``init_std`` 0.5 (peaked
distributions) and </s> gets a fixed logit bias (``--eos_bias``, through ``final_logits_bias``), so
that hypotheses end at lengths from 1 to the bound.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from hf_vanilla import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration

TINY = {
    "vocab_size": 100,
    "d_model": 32,
    "encoder_layers": 2,
    "decoder_layers": 2,
    "encoder_attention_heads": 4,
    "decoder_attention_heads": 4,
    "encoder_ffn_dim": 64,
    "decoder_ffn_dim": 64,
}
SETTINGS = {"True": True, "False": False, "never": "never"}


def batches(seed: int, sentences: int, batch_size: int = 8) -> list[dict[str, torch.Tensor]]:
    """Right-padded random sources over non-special ids (4..99), 3 to 12 tokens, the last one </s>."""
    generator = torch.Generator().manual_seed(1000 + seed)
    lengths = torch.randint(3, 13, (sentences,), generator=generator).tolist()
    out = []
    for start in range(0, sentences, batch_size):
        rows = lengths[start : start + batch_size]
        input_ids = torch.zeros(len(rows), max(rows), dtype=torch.long)
        attention_mask = torch.zeros_like(input_ids)
        for i, n in enumerate(rows):
            input_ids[i, : n - 1] = torch.randint(4, 100, (n - 1,), generator=generator)
            input_ids[i, n - 1] = 2
            attention_mask[i, :n] = 1
        out.append({"input_ids": input_ids, "attention_mask": attention_mask})
    return out


@torch.inference_mode()
def decode(model: VanillaTransformerForConditionalGeneration, data: list[dict], stopping: object) -> tuple:
    start = time.perf_counter()
    scores = []
    for batch in data:
        out = model.generate(
            **batch, early_stopping=stopping, output_scores=True, return_dict_in_generate=True
        )
        scores.append(out.sequences_scores)
    return torch.cat(scores), time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", type=int, default=4)
    parser.add_argument("--sentences", type=int, default=40, help="per model")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--eos_bias", type=float, default=9.0, help="logit bias of </s>")
    parser.add_argument("--init_std", type=float, default=0.5, help="embedding standard deviation")
    args = parser.parse_args()
    torch.set_num_threads(1)
    scores: dict[str, list[torch.Tensor]] = {name: [] for name in SETTINGS}
    seconds: dict[str, list[float]] = {name: [0.0] * args.rounds for name in SETTINGS}
    for seed in range(args.models):
        torch.manual_seed(seed)
        config = VanillaTransformerConfig(**TINY, init_std=args.init_std, final_logits_bias=True)
        model = VanillaTransformerForConditionalGeneration(config).eval()
        with torch.no_grad():
            model.final_logits_bias[0, config.eos_token_id] = args.eos_bias
        data = batches(seed, args.sentences)
        for round_ in range(args.rounds):
            for name, stopping in SETTINGS.items():
                result, elapsed = decode(model, data, stopping)
                seconds[name][round_] += elapsed
                if round_ == 0:
                    scores[name].append(result)
    never = torch.cat(scores["never"])
    report = {
        "sentences": len(never),
        "settings": "beam 4, length penalty 0.6, max length source + 50",
        "eos_bias": args.eos_bias,
        "init_std": args.init_std,
    }
    for name in SETTINGS:
        gap = never - torch.cat(scores[name])  # > 0: a worse best hypothesis than "never"
        report[name] = {
            "worse_than_never": int((gap > 1e-4).sum()),
            "better_than_never": int((gap < -1e-4).sum()),
            "largest_gap": round(float(gap.max()), 3),
            "seconds": round(statistics.median(seconds[name]), 2),
        }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
