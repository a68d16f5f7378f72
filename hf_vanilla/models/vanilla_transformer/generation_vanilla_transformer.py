"""§6.1 decoding policy of the Transformer in :mod:`modeling_vanilla_transformer`.

What ``generate()`` adds to ``GenerationMixin`` for this model, apart from the paper's architecture:
the paper's decoding defaults (beam 4, α = 0.6), the maximum output length "input length + 50"
applied per sentence (deviation 3 of the modeling file) and beam search that shares each sentence's
encoder output among its hypotheses. It imports only torch and transformers: it travels with the
modeling file into a Hub folder.
"""

from __future__ import annotations

import copy
import math

import torch
from transformers import GenerationConfig, GenerationMixin, LogitsProcessor, LogitsProcessorList
from transformers.cache_utils import Cache, DynamicLayer, EncoderDecoderCache

from .fast_paths import reorder_self_attention_cache

#: §6.1: "We set the maximum output length during inference to input length + 50".
MAX_LENGTH_OFFSET = 50


def _source_lengths(inputs: torch.Tensor | None, kwargs: dict[str, object]) -> torch.Tensor | None:
    """(B,) unpadded source lengths of a ``generate()`` call: from its ``attention_mask``, else the
    width of the source ids or of the encoder states given instead; ``None`` when there is neither."""
    attention_mask = kwargs.get("attention_mask")
    if attention_mask is not None:  # (B, S) → (B,)
        return attention_mask.sum(dim=-1)
    source = inputs if inputs is not None else kwargs.get("input_ids")
    if source is None and kwargs.get("encoder_outputs") is not None:
        source = kwargs["encoder_outputs"][0]  # (B, S, D) encoder states given instead of the source
    if source is None:
        return None
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
        # Before this decoder length no row is at its bound (read once here, not at every step).
        self.first_limit = int(self.limits.min())
        self.eos_token_id = eos_token_id

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if input_ids.shape[1] < self.first_limit:  # most steps: the scores stay as they are
            return scores
        rows = input_ids.shape[0]
        limits = self.limits.to(input_ids.device).repeat_interleave(rows // self.limits.shape[0])
        done = input_ids.shape[1] >= limits  # (rows,)
        # </s> keeps its own score (beam search ranks the ended hypothesis by it); if another
        # processor banned it (e.g. min_new_tokens beyond the bound), the lowest finite score instead
        # of -inf, so the row never becomes all -inf (NaN after log-softmax).
        eos_scores = scores[:, self.eos_token_id].clamp(min=torch.finfo(scores.dtype).min)  # (rows,)
        bounded = scores.masked_fill(done[:, None], -math.inf)  # (rows, V)
        bounded[:, self.eos_token_id] = torch.where(done, eos_scores, scores[:, self.eos_token_id])
        return bounded


def _one_row_per_hypothesis(cache: EncoderDecoderCache) -> None:
    """Give the cross-attention entries of a cache that ``generate()`` returns one row per hypothesis,
    as every transformers model returns them: during the search they hold one row per sentence,
    shared by its hypotheses (see ``_expand_inputs_for_generation``); the returned cache is what
    users and tools read, and a later call continues from it unchanged."""
    self_layers, cross_layers = cache.self_attention_cache.layers, cache.cross_attention_cache.layers
    if not (self_layers and cross_layers and self_layers[0].is_initialized):
        return
    rows = self_layers[0].keys.shape[0]  # sentences × hypotheses
    for layer in cross_layers:
        if type(layer) is DynamicLayer and layer.is_initialized and rows != layer.keys.shape[0]:
            hypotheses = rows // layer.keys.shape[0]
            layer.keys = layer.keys.repeat_interleave(hypotheses, dim=0)
            layer.values = layer.values.repeat_interleave(hypotheses, dim=0)


class VanillaTransformerGenerationMixin(GenerationMixin):
    """``GenerationMixin`` with the paper's §6.1 decoding: the defaults, the per-sentence length bound
    and beam search over one encoder output per sentence."""

    def _set_paper_generation_defaults(self) -> None:
        # §6.1: beam size 4; length penalty α = 0.6, applied as HF's log P / |Y|^α (the paper cites
        # GNMT's ((5 + |Y|) / 6)^α; see hf_vanilla.inference.translation); max output length = source length +
        # `max_length_offset` per sentence (see generate); stop when no better hypothesis can appear,
        # which is HF's "never" (True stops as soon as num_beams hypotheses have finished).
        self.generation_config.num_beams = 4
        self.generation_config.length_penalty = 0.6
        self.generation_config.early_stopping = "never"
        self.generation_config.max_length_offset = MAX_LENGTH_OFFSET
        # Ours, not derived from the model config: saved and loaded with its custom key (transformers
        # drops keys it does not know from a config marked as derived from the model config).
        self.generation_config._from_model_config = False

    def _expand_inputs_for_generation(
        self,
        expand_size: int = 1,
        is_encoder_decoder: bool = False,
        input_ids: torch.Tensor | None = None,
        **model_kwargs: object,
    ) -> tuple[torch.Tensor | None, dict[str, object]]:
        """Beam search and ``num_return_sequences`` decode ``expand_size`` hypotheses per sentence.
        Everything is repeated per hypothesis as in ``GenerationMixin`` except the encoder output: the
        cross-attention computes K/V once per sentence and lets its hypotheses attend to them together
        (same function; K/V projections, cache and per-step reads ``expand_size`` times smaller)."""
        encoder_outputs = model_kwargs.pop("encoder_outputs", None)
        if is_encoder_decoder and encoder_outputs is None:
            raise ValueError("Generation needs `encoder_outputs` here; run the encoder first.")
        input_ids, model_kwargs = super()._expand_inputs_for_generation(
            expand_size=expand_size, is_encoder_decoder=False, input_ids=input_ids, **model_kwargs
        )
        if encoder_outputs is not None:
            model_kwargs["encoder_outputs"] = encoder_outputs
        return input_ids, model_kwargs

    def _reorder_cache(self, cache: EncoderDecoderCache, beam_idx: torch.Tensor) -> EncoderDecoderCache:
        """Beam search: the self-attention cache follows the surviving hypotheses. The cross-attention
        cache has one entry per sentence, shared by its hypotheses (which never move to another
        sentence), so it is reordered only when it was built from an expanded encoder output."""
        reorder_self_attention_cache(cache.self_attention_cache, beam_idx)
        cross = cache.cross_attention_cache
        if (
            cross.layers
            and cross.layers[0].is_initialized
            and cross.layers[0].keys.shape[0] == beam_idx.shape[0]
        ):
            cross.reorder_cache(beam_idx)
        return cache

    def generate(
        self,
        inputs: torch.Tensor | None = None,
        generation_config: GenerationConfig | None = None,
        logits_processor: LogitsProcessorList | None = None,
        **kwargs: object,
    ) -> torch.Tensor:
        """``GenerationMixin.generate`` with the §6.1 bound on every call: each sentence produces at
        most its own (unpadded) source length + ``max_length_offset`` tokens, ``</s>`` included.

        ``max_length_offset`` is a generation-config key (50, the paper's, in this model's config;
        50 too when a config has none) or a keyword argument of this call. A ``max_length`` or
        ``max_new_tokens`` set by the user (in the call or in a generation config) caps the output
        further for the whole batch; it never lifts the per-sentence bound. A generation config's
        ``max_length`` equal to transformers' global default (20) counts as unset:
        ``Seq2SeqTrainer(predict_with_generate=True)`` writes that default into
        ``model.generation_config`` (and so into the saved ``generation_config.json``). To cap at
        exactly 20 tokens, pass ``max_length=20`` to this call or set ``max_new_tokens``.

        Continuing from a returned ``cache`` with the full ``decoder_input_ids`` (as ``generate()``
        returned them): transformers slices off the cached part only when a decoder attention mask
        as long as the ids says so, so one is given here (without it, every id would be fed again).
        """
        cache, decoder_input_ids = kwargs.get("cache"), kwargs.get("decoder_input_ids")
        if (
            isinstance(cache, Cache)
            and decoder_input_ids is not None
            and kwargs.get("decoder_attention_mask") is None
            and decoder_input_ids.shape[1] > cache.get_seq_length()
        ):
            kwargs["decoder_attention_mask"] = torch.ones_like(decoder_input_ids)
        source = inputs if inputs is not None else kwargs.get("input_ids")
        encoder_outputs = kwargs.get("encoder_outputs")
        if source is None and encoder_outputs is not None:
            source = encoder_outputs[0]  # (B, S, D) encoder states given instead of the source
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
                f"`max_length_offset` must be a non-negative number of tokens (§6.1: 50), got {offset!r}."
            )
        source_lengths = _source_lengths(inputs, kwargs)
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
            logits_processor = LogitsProcessorList([*(logits_processor or []), bound])
        output = super().generate(
            inputs, generation_config=generation_config, logits_processor=logits_processor, **kwargs
        )
        cache = getattr(output, "past_key_values", None)
        if isinstance(cache, EncoderDecoderCache):
            _one_row_per_hypothesis(cache)
        return output
