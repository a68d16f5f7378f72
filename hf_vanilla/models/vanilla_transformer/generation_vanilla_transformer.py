# Copyright 2026 The hf_vanilla authors.
# SPDX-License-Identifier: Apache-2.0 (http://www.apache.org/licenses/LICENSE-2.0)
"""§6.1 decoding policy of the Transformer in :mod:`modeling_vanilla_transformer`.

What ``generate()`` adds to ``GenerationMixin`` for this model, apart from the paper's architecture:
the paper's decoding defaults (beam 4, α = 0.6), the maximum output length "input length + 50"
applied per sentence (deviation 3 of the modeling file). The search is transformers' own. It imports
only torch and transformers: it travels with the modeling file into a Hub folder.
"""

from __future__ import annotations

import copy
import math

import torch
from transformers import GenerationConfig, GenerationMixin, LogitsProcessor, LogitsProcessorList
from transformers.cache_utils import Cache

#: The paper's decoding defaults (§6.1), as generation-config keys: "we used beam search with a beam
#: size of 4 and length penalty α = 0.6"; "we set the maximum output length during inference to input
#: length + 50" (``max_length_offset``); "terminate early when possible", i.e. stop when no better
#: hypothesis can appear, which is HF's ``early_stopping="never"`` (``True`` stops as soon as
#: ``num_beams`` hypotheses have finished). The only place these numbers are written: hf_vanilla's
#: commands read this literal from the file's source (without importing torch).
PAPER_DECODING = {"num_beams": 4, "length_penalty": 0.6, "early_stopping": "never", "max_length_offset": 50}
MAX_LENGTH_OFFSET: int = PAPER_DECODING["max_length_offset"]


def _source(inputs: torch.Tensor | None, kwargs: dict[str, object]) -> torch.Tensor | None:
    """The source of a ``generate()`` call: its ids (B, S), else the encoder states (B, S, D) given instead."""
    source = inputs if inputs is not None else kwargs.get("input_ids")
    if source is None and kwargs.get("encoder_outputs") is not None:
        source = kwargs["encoder_outputs"][0]
    return source


def _source_lengths(source: torch.Tensor | None, attention_mask: torch.Tensor | None) -> torch.Tensor | None:
    """(B,) unpadded source lengths: from the ``attention_mask``, else the source's width; or ``None``."""
    if attention_mask is not None or source is None:
        return None if attention_mask is None else attention_mask.sum(dim=-1)
    return torch.full((source.shape[0],), source.shape[1], device=source.device)


def _first_set(name: str, kwargs: dict[str, object], configs: list[GenerationConfig]) -> object:
    """The value of a generation parameter as ``generate()`` resolves it: the call's keyword argument,
    else the first generation config (the one passed, then the model's) that sets it; ``None``."""
    values = (kwargs.get(name), *(getattr(config, name, None) for config in configs))
    return next((value for value in values if value is not None), None)


def _user_length_cap(kwargs: dict[str, object], configs: list[GenerationConfig]) -> bool:
    """Whether a ``max_new_tokens`` or ``max_length`` caps this ``generate()`` call. A config's
    ``max_length`` equal to transformers' global default (20) is not a cap: ``Seq2SeqTrainer``
    writes that default into the model's generation config when it is unset."""
    if _first_set("max_new_tokens", kwargs, configs) is not None or kwargs.get("max_length") is not None:
        return True
    max_length = _first_set("max_length", kwargs, configs)
    return max_length not in (None, GenerationConfig._get_default_generation_params()["max_length"])


class _SourceLengthBound(LogitsProcessor):
    """§6.1 per sentence: a hypothesis holds at most ``source length + offset`` generated tokens, its
    ``</s>`` included, so after ``source length + offset - 1`` tokens only ``</s>`` may follow.
    ``source_lengths`` has one entry per sentence (rows are sentences × beams); ``start_length`` is
    the length of the decoder prompt (the start token, or the ``decoder_input_ids`` given)."""

    def __init__(
        self, source_lengths: torch.Tensor, start_length: int, eos_token_id: int, offset: int
    ) -> None:
        # (rows,) decoder length at which only </s> may follow: source length + offset tokens in all.
        self.limits = source_lengths + offset - 1 + start_length
        self.first_limit = int(self.limits.min())  # no row is at its bound before this decoder length
        self.eos_token_id = eos_token_id

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if input_ids.shape[1] < self.first_limit:  # most steps: the scores stay as they are
            return scores
        limits = self.limits.to(input_ids.device).repeat_interleave(len(input_ids) // len(self.limits))
        done = input_ids.shape[1] >= limits  # (rows,)
        # </s> keeps its own score (beam search ranks the ended hypothesis by it); if another
        # processor banned it (e.g. min_new_tokens beyond the bound), the lowest finite score instead
        # of -inf, so the row never becomes all -inf (NaN after log-softmax).
        eos_scores = scores[:, self.eos_token_id].clamp(min=torch.finfo(scores.dtype).min)  # (rows,)
        bounded = scores.masked_fill(done[:, None], -math.inf)  # (rows, V)
        bounded[:, self.eos_token_id] = torch.where(done, eos_scores, scores[:, self.eos_token_id])
        return bounded


class VanillaTransformerGenerationMixin(GenerationMixin):
    """``GenerationMixin`` with the paper's §6.1 decoding: the defaults and the per-sentence length bound;
    the search itself is transformers' own."""

    def _set_paper_generation_defaults(self) -> None:
        # PAPER_DECODING; the length penalty is applied as HF's log P / |Y|^α (the paper cites GNMT's
        # ((5 + |Y|) / 6)^α; see hf_vanilla.inference.translation); the output length bound is
        # source length + `max_length_offset` per sentence (see generate).
        for key, value in PAPER_DECODING.items():
            setattr(self.generation_config, key, value)
        # Ours, not derived from the model config: saved and loaded with its custom key (transformers
        # drops keys it does not know from a config marked as derived from the model config).
        self.generation_config._from_model_config = False

    def generate(
        self,
        inputs: torch.Tensor | None = None,
        generation_config: GenerationConfig | None = None,
        logits_processor: LogitsProcessorList | None = None,
        **kwargs: object,
    ) -> torch.Tensor:
        """``GenerationMixin.generate`` with the §6.1 bound on every call: each sentence produces at
        most its own (unpadded) source length + ``max_length_offset`` tokens, ``</s>`` included.

        ``max_length_offset`` (50, the paper's) is a generation-config key or a keyword argument. A
        user's ``max_length`` or ``max_new_tokens`` caps the whole batch further, never lifting the bound;
        a config's ``max_length`` equal to transformers' default (20, which ``Seq2SeqTrainer`` writes into
        it) counts as unset. A continuation from a returned ``cache`` with the full ``decoder_input_ids``
        gets a decoder attention mask as long as the ids: without one, transformers feeds every id again.
        """
        cache, decoder_input_ids = kwargs.get("cache"), kwargs.get("decoder_input_ids")
        if (
            isinstance(cache, Cache)
            and decoder_input_ids is not None
            and kwargs.get("decoder_attention_mask") is None
            and decoder_input_ids.shape[1] > cache.get_seq_length()
        ):
            kwargs["decoder_attention_mask"] = torch.ones_like(decoder_input_ids)
        source = _source(inputs, kwargs)
        if isinstance(source, torch.Tensor) and source.shape[0] == 0:
            raise ValueError(
                f"generate() got an empty batch (shape {tuple(source.shape)}): give at least one sentence."
            )
        configs = [config for config in (generation_config, self.generation_config) if config is not None]
        offset = _first_set("max_length_offset", kwargs, configs)
        kwargs.pop("max_length_offset", None)
        offset = MAX_LENGTH_OFFSET if offset is None else offset
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise ValueError(
                f"`max_length_offset` must be a non-negative number of tokens (§6.1: {MAX_LENGTH_OFFSET}), "
                f"got {offset!r}."
            )
        source_lengths = _source_lengths(source, kwargs.get("attention_mask"))
        if source_lengths is not None:
            decoder_input_ids = kwargs.get("decoder_input_ids")
            start_length = decoder_input_ids.shape[-1] if isinstance(decoder_input_ids, torch.Tensor) else 1
            if not _user_length_cap(kwargs, configs):
                # The batch runs at most as long as its longest sentence's bound.
                max_length = start_length + int(source_lengths.max()) + offset
                if generation_config is not None:
                    generation_config = copy.deepcopy(generation_config)
                    generation_config.max_length = max_length
                else:
                    kwargs["max_length"] = max_length
            bound = _SourceLengthBound(source_lengths, start_length, self.config.eos_token_id, offset)
            cap = _first_set("max_new_tokens", kwargs, configs)  # ending all before the bound: no processor
            if cap is None or start_length + cap > bound.first_limit:
                logits_processor = LogitsProcessorList([*(logits_processor or []), bound])
        return super().generate(
            inputs, generation_config=generation_config, logits_processor=logits_processor, **kwargs
        )
