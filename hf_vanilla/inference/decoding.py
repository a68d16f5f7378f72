"""Decoding (§6.1): the paper's beam search settings, length penalties, n-best hypotheses."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import torch

from hf_vanilla.inference.options import (
    EARLY_STOPPING,
    DecodingOptions,
    check_nbest,
    refuse_non_finite,
)

__all__ = [
    "generate_hypotheses",
    "generate_ids",
    "gnmt_length_penalty",
    "hard_alignments",
    "nbest_log_probs",
    "paper_generation_kwargs",
]


def gnmt_length_penalty(length: torch.Tensor | float, alpha: float) -> torch.Tensor | float:
    """lp(Y) = ((5 + |Y|) / 6)^α (Wu et al., 2016, Eq. 14), the penalty the paper's α = 0.6 refers to."""
    return ((5.0 + length) / 6.0) ** alpha


def paper_generation_kwargs(options: DecodingOptions | None = None) -> dict[str, Any]:
    """``generate()`` keyword arguments for §6.1 decoding (beam size, α and the stopping rule; the
    length bound is the model's own). Greedy decoding (``num_beams=1``) gets ``num_beams`` alone: the
    length penalty and the stopping rule are beam search's, and ``generate()`` warns about them."""
    options = options or DecodingOptions()
    if options.do_sample:  # top_k 0 and top_p 1 turn transformers' own warpers off
        return {
            "num_beams": 1,
            "do_sample": True,
            "top_k": options.top_k,
            "top_p": options.top_p,
            "temperature": options.temperature,
        }
    if options.num_beams == 1:
        return {"num_beams": 1}
    return {
        "num_beams": options.num_beams,
        "length_penalty": options.length_penalty,
        "early_stopping": EARLY_STOPPING[options.early_stopping],
    }


def _eos_id(model: Any) -> int:
    eos = model.generation_config.eos_token_id
    if eos is None:
        eos = model.config.eos_token_id
    if isinstance(eos, (list, tuple)):
        if len(eos) != 1:
            raise ValueError(f"Expected one end-of-sentence id, the generation config has {eos}.")
        eos = eos[0]
    if eos is None:
        raise ValueError("The model has no eos_token_id: set it in the config or the generation config.")
    return int(eos)


def nbest_log_probs(outputs: Any, length_penalty: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed log-probabilities log P(Y | X) and lengths |Y| of beam-search hypotheses.

    ``outputs`` is a ``generate(..., output_scores=True, return_dict_in_generate=True)`` beam result.
    HF defines ``sequences_scores = Σ log p / |Y|^length_penalty`` with |Y| the generated tokens
    including ``</s>`` (``transformers.generation.utils``, ``_update_finished_beams``); |Y| is read
    from ``beam_indices``, which is -1 after a hypothesis ended.
    """
    if getattr(outputs, "beam_indices", None) is None or getattr(outputs, "sequences_scores", None) is None:
        raise ValueError(
            "Need a beam-search result with scores: call generate(num_beams>1, output_scores=True, "
            "return_dict_in_generate=True)."
        )
    lengths = (outputs.beam_indices >= 0).sum(dim=1).clamp(min=1).to(outputs.sequences_scores.dtype)
    return outputs.sequences_scores * lengths**length_penalty, lengths


def _greedy_scores(
    outputs: Any, eos_id: int, length_penalty: float, logits: tuple[torch.Tensor, ...] | None = None
) -> torch.Tensor:
    """log P(Y | X) / |Y|^α of greedy outputs (or samples, from their raw ``logits``), |Y| counting
    generated tokens up to ``</s>`` included (as ``sequences_scores`` does for beam search)."""
    steps = torch.stack(logits or outputs.scores, dim=1).float().log_softmax(dim=-1)  # (B, steps, V)
    generated = outputs.sequences[:, -steps.shape[1] :]  # (B, steps)
    log_probs = steps.gather(2, generated.unsqueeze(-1)).squeeze(-1)
    ended_before = (generated == eos_id).int().cumsum(dim=1) - (generated == eos_id).int()
    counted = ended_before == 0  # tokens up to the first </s>, that one included
    lengths = counted.sum(dim=1).clamp(min=1).float()
    return log_probs.masked_fill(~counted, 0.0).sum(dim=1) / lengths**length_penalty


@torch.inference_mode()
def generate_hypotheses(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    options: DecodingOptions | None = None,
    nbest: int | None = None,
    **generate_kwargs: Any,
) -> list[list[tuple[list[int], float | None]]]:
    """Decode one padded batch; per sentence, ``(output ids, score)`` pairs (decoder start, ``</s>`` and
    padding removed). ``generate_kwargs`` go to ``model.generate``.

    Without ``nbest``: the one chosen hypothesis, score ``None``. With ``nbest`` = N (at most the beam
    size): the N best, best first, each with the score it was ranked by, log P(Y | X) / |Y|^α (HF's
    ``sequences_scores``; greedy decoding computes the same) or, with ``length_penalty_type="gnmt"``,
    log P(Y | X) / ((5 + |Y|) / 6)^α. See the module docstring for the length bound and both penalties.
    """
    options = options or DecodingOptions()
    check_nbest(nbest, options.num_beams, options.do_sample)
    if generate_kwargs.get("num_return_sequences", 1) != 1:
        wanted = generate_kwargs["num_return_sequences"]
        raise ValueError(
            f"num_return_sequences={wanted}: translation keeps one hypothesis per sentence; for the "
            f"{wanted} best, pass nbest={wanted} (translate_nbest, hf-vanilla-translate --nbest {wanted})."
        )
    generate_kwargs.pop("num_return_sequences", None)
    refuse_non_finite({**asdict(options), **generate_kwargs})
    eos_id = _eos_id(model)
    kwargs = {**paper_generation_kwargs(options), **generate_kwargs}
    gnmt = options.length_penalty_type == "gnmt"
    if nbest is None and not gnmt:
        sequences = model.generate(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
        return [[(_strip(row.tolist(), model, eos_id), None)] for row in sequences]
    returned = options.num_beams if gnmt else nbest
    out = model.generate(
        input_ids=input_ids,
        attention_mask=attention_mask,
        num_return_sequences=returned,
        output_scores=True,
        output_logits=options.do_sample,
        return_dict_in_generate=True,
        **kwargs,
    )
    if options.do_sample:  # the model's own log-probabilities, not those of the warped distribution
        scores = _greedy_scores(out, eos_id, options.length_penalty, out.logits)
    elif options.num_beams == 1:
        scores = _greedy_scores(out, eos_id, options.length_penalty)
    elif gnmt:
        log_probs, lengths = nbest_log_probs(out, options.length_penalty)
        scores = log_probs / gnmt_length_penalty(lengths, options.length_penalty)
    else:
        scores = out.sequences_scores
    batch_size = input_ids.shape[0]
    scores = scores.view(batch_size, returned).float()
    results = []
    for sentence in range(batch_size):
        best_first = scores[sentence].argsort(descending=True, stable=True)[: nbest or 1].tolist()
        rows = [out.sequences[sentence * returned + k].tolist() for k in best_first]
        results.append(
            [
                (_strip(row, model, eos_id), float(scores[sentence, k]) if nbest else None)
                for row, k in zip(rows, best_first, strict=True)
            ]
        )
    return results


@torch.inference_mode()
def hard_alignments(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    outputs: list[list[int]],
    special_ids: set[int],
) -> list[list[tuple[int, int]]]:
    """Per sentence of a padded batch, the hard alignment of its output ``outputs`` (token ids, no start
    token or ``</s>``): for each target token t, the pair ``(s, t)`` with s the source token that the
    cross-attention of the last decoder layer, averaged over its heads, weighs most at the step
    that produced t (fairseq's ``extract_hard_alignment``). Indices count tokens from 0: source tokens as
    the tokenizer split the sentence (special tokens such as ``</s>`` are never aligned to), target tokens
    of the output. The attention is computed again with the output forced (teacher forcing)."""
    if not any(outputs):
        return [[] for _ in outputs]
    start, pad = model.config.decoder_start_token_id, model.config.pad_token_id
    width = 1 + max(len(ids) for ids in outputs)
    decoder_input_ids = torch.tensor(
        [[start, *ids] + [pad] * (width - 1 - len(ids)) for ids in outputs], device=input_ids.device
    )  # right padding: a causal decoder's real positions never read it
    result = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        decoder_input_ids=decoder_input_ids,
        output_attentions=True,
    )
    # The last layer, as fairseq's --print-alignment and CTranslate2 take by default. On the demo task
    # (English → German number words) it aligns 98-99% of the number words right, the penultimate layer
    # 23-81% (2 or 3 decoder layers; tests/inference/test_decoding_flags.py). Garg et al. (2019)
    # found the penultimate layer best in 6-layer models trained to align.
    cross = result.cross_attentions[-1].float().mean(dim=1)  # (B, T, S)
    special = torch.tensor(sorted(special_ids), device=input_ids.device)
    alignable = attention_mask.bool() & ~torch.isin(input_ids, special)  # (B, S)
    first = attention_mask.long().argmax(dim=1)  # the first real position (left padding)
    best = cross.masked_fill(~alignable[:, None, :], -1.0).argmax(dim=-1)  # (B, T)
    return [
        [(int(best[row, t]) - int(first[row]), t) for t in range(len(ids))] if alignable[row].any() else []
        for row, ids in enumerate(outputs)
    ]


def generate_ids(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    options: DecodingOptions | None = None,
    **generate_kwargs: Any,
) -> list[list[int]]:
    """Decode one padded batch; return the chosen output ids per sentence (decoder start, ``</s>`` and
    padding removed). ``generate_kwargs`` go to ``model.generate``.

    See the module docstring for the length bound and the two length penalties.
    """
    hypotheses = generate_hypotheses(model, input_ids, attention_mask, options, **generate_kwargs)
    return [best[0][0] for best in hypotheses]


def _strip(ids: list[int], model: Any, eos_id: int) -> list[int]:
    """Drop the decoder start token, and everything from end-of-sentence on (padding included)."""
    if ids and ids[0] == model.config.decoder_start_token_id:
        ids = ids[1:]
    if eos_id in ids:
        ids = ids[: ids.index(eos_id)]
    return ids
