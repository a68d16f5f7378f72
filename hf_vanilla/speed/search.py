"""Beam and greedy search that stop decoding a sentence once its output is final (installed package only).

transformers' loops go on computing every row of a batch until the last sentence is done; here a
sentence whose n-best list is final (beam search) or that has ended (greedy search) leaves the batch,
the cache and the encoder output, and waits in the output. Each step runs transformers' own helpers on
the sentences still open, in the same order, so every sentence gets the sequences transformers' loop
returns. Beam search also keeps one encoder output per sentence, shared by its hypotheses.

:class:`DroppingFinishedSentencesMixin` enters these loops from ``GenerationMixin``'s own methods
(``_beam_search``, ``_sample``, ``_expand_inputs_for_generation``, ``_reorder_cache``), which
docs/internals.md lists with the test that fails when a transformers release changes them.
"""

from __future__ import annotations

import torch
from transformers import GenerationConfig, GenerationMixin, LogitsProcessorList
from transformers.cache_utils import DynamicCache, DynamicLayer, EncoderDecoderCache
from transformers.generation import logits_process, stopping_criteria
from transformers.generation.stopping_criteria import StoppingCriteriaList
from transformers.utils import ModelOutput

from hf_vanilla.models.vanilla_transformer.generation_vanilla_transformer import _SourceLengthBound
from hf_vanilla.speed import fast_paths


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


#: Logits processors and stopping criteria that treat every row on its own, without state that
#: follows the row's place in the batch: beam search may drop finished sentences' rows under them.
_ROW_WISE = (
    _SourceLengthBound,
    logits_process.MinLengthLogitsProcessor,
    logits_process.MinNewTokensLengthLogitsProcessor,
    logits_process.NoRepeatNGramLogitsProcessor,
    logits_process.RepetitionPenaltyLogitsProcessor,
    logits_process.NoBadWordsLogitsProcessor,
    logits_process.ForcedBOSTokenLogitsProcessor,
    logits_process.ForcedEOSTokenLogitsProcessor,
    logits_process.SuppressTokensLogitsProcessor,
    logits_process.SuppressTokensAtBeginLogitsProcessor,
    stopping_criteria.MaxLengthCriteria,
    stopping_criteria.MaxTimeCriteria,
    stopping_criteria.EosTokenCriteria,
)
#: What ``generate()`` hands beam search in ``model_kwargs`` for this model; anything else (an input
#: the search would have to follow row by row) keeps transformers' own loop.
_KNOWN_KWARGS = {
    "attention_mask",
    "encoder_outputs",
    "cache",
    "use_cache",
    "output_attentions",
    "output_hidden_states",
}


def _keep(value: object, sentences: torch.Tensor, rows: torch.Tensor, active: int, beams: int) -> object:
    """``value`` (a tensor, a model output or a tuple of them) for the kept ``sentences`` (indices into
    the ``active`` ones): a tensor with one row per sentence keeps ``sentences``, one with a row per
    hypothesis (``beams`` per sentence, consecutive) keeps ``rows``; anything else stays as it is."""
    if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape[0] in (active, active * beams):
        index = sentences if value.shape[0] == active else rows
        return value.index_select(0, index.to(value.device))
    if isinstance(value, ModelOutput):
        for key in list(value.keys()):
            value[key] = _keep(value[key], sentences, rows, active, beams)
        return value
    if isinstance(value, tuple):
        return tuple(_keep(item, sentences, rows, active, beams) for item in value)
    return value


def _keep_cross_attention(
    cache: EncoderDecoderCache, sentences: torch.Tensor, rows: torch.Tensor, active: int, beams: int
) -> None:
    """The cross-attention entries of the kept sentences (one row per sentence, shared by its
    hypotheses, or one per hypothesis where the encoder output was given expanded)."""
    for layer in cache.cross_attention_cache.layers:
        if layer.is_initialized:
            layer.keys = _keep(layer.keys, sentences, rows, active, beams)
            layer.values = _keep(layer.values, sentences, rows, active, beams)


def _drop_rows(
    model_kwargs: dict[str, object],
    logits_processor: LogitsProcessorList,
    kept: torch.Tensor,
    rows: torch.Tensor,
    self_attention_index: torch.Tensor,
    active: int,
    beams: int,
) -> None:
    """Go on decoding only the ``kept`` sentences (indices into the ``active`` ones; ``rows``: their
    hypotheses' rows): one gather both reorders the self-attention cache by ``self_attention_index``
    (rows before dropping) and drops the others; the cross-attention entries, the encoder output, the
    source mask and the length bound keep the kept sentences' rows."""
    cache = model_kwargs["cache"]
    cache.self_attention_cache.reorder_cache(self_attention_index)
    _keep_cross_attention(cache, kept, rows, active, beams)
    for key in ("attention_mask", "encoder_outputs"):
        if model_kwargs.get(key) is not None:
            model_kwargs[key] = _keep(model_kwargs[key], kept, rows, active, beams)
    for processor in logits_processor:
        if isinstance(processor, _SourceLengthBound):  # the bounds of the kept sentences
            processor.limits = processor.limits[kept.to(processor.limits.device)]


def _next_token_logits(
    model: GenerationMixin,
    decoder_input_ids: torch.Tensor,
    model_outputs: ModelOutput | None,
    model_kwargs: dict[str, object],
) -> tuple[torch.Tensor, dict[str, object]]:
    """(rows, V) fp32 logits of the next token, from ``model_outputs`` (the prefill's) or else from one
    cached decoder step over the last of ``decoder_input_ids`` (rows, T); and ``model_kwargs`` with the
    step's cache. The step's inputs are what ``prepare_inputs_for_generation`` makes of the kwargs
    :data:`_KNOWN_KWARGS` allows (the last token, the rest passed on), without its general checks."""
    if model_outputs is None:
        model_outputs = model(decoder_input_ids=decoder_input_ids[:, -1:], **model_kwargs, return_dict=True)
    model_kwargs = model._update_model_kwargs_for_generation(
        model_outputs, model_kwargs, is_encoder_decoder=True
    )
    # no copy (transformers copies to free the logits early: here nothing else keeps them)
    logits = model_outputs.logits[:, -1, :].to(dtype=torch.float32, device=decoder_input_ids.device)
    return logits, model_kwargs


def _processed(
    logits_processor: LogitsProcessorList, input_ids: torch.Tensor, scores: torch.Tensor
) -> torch.Tensor:
    """``logits_processor(input_ids, scores)`` for processors that take exactly those two arguments (the
    :data:`_ROW_WISE` ones), without the list's signature inspection of every processor at every step."""
    for processor in logits_processor:
        scores = processor(input_ids, scores)
    return scores


def _search_over(
    unsatisfied: torch.Tensor, is_sent_finished: torch.Tensor, early_stopping: bool | str
) -> torch.Tensor:
    """(B,) whether each sentence's n-best list is final: no running hypothesis can still enter it
    (transformers' early-stop state), or with ``early_stopping=True`` all its beams have finished
    (``_update_finished_beams`` then admits no new hypothesis)."""
    over = ~unsatisfied[:, 0]
    if early_stopping is True:
        over = over | is_sent_finished.all(dim=-1)
    return over


def _beam_search_dropping_finished(
    model: GenerationMixin,
    input_ids: torch.Tensor,
    logits_processor: LogitsProcessorList,
    stopping_criteria: StoppingCriteriaList,
    generation_config: GenerationConfig,
    **model_kwargs: object,
) -> torch.Tensor:
    """``GenerationMixin._beam_search`` (deterministic, sequences only) that stops decoding a sentence
    as soon as its n-best list is final: its rows leave the batch, the cache and the encoder output,
    and its finished hypotheses wait in the output. Each step runs transformers' own helpers on the
    sentences still open, in the same order, so every sentence gets the hypotheses transformers'
    loop returns; the rows it drops are the ones that loop goes on computing without effect."""
    pad_token_id = generation_config._pad_token_tensor
    eos_token_id = generation_config._eos_token_tensor
    early_stopping = generation_config.early_stopping
    length_penalty = generation_config.length_penalty
    max_length = generation_config.max_length
    beams = generation_config.num_beams
    device = input_ids.device
    batch_size, cur_len = input_ids.shape[0] // beams, input_ids.shape[1]
    decoder_prompt_len = cur_len
    beams_to_keep = max(2, 1 + (eos_token_id.shape[0] if eos_token_id is not None else 0)) * beams
    top_num_beam_mask = torch.arange(beams_to_keep, device=device) < beams

    fill = pad_token_id or eos_token_id[0] if eos_token_id is not None else -1
    running_sequences = torch.full((batch_size, beams, max_length), fill, dtype=torch.int64, device=device)
    running_sequences[:, :, :cur_len] = model._unflatten_beam_dim(input_ids, batch_size, beams)
    sequences = running_sequences.detach().clone()
    running_beam_scores = torch.zeros((batch_size, beams), dtype=torch.float, device=device)
    running_beam_scores[:, 1:] = -1e9
    beam_scores = torch.full((batch_size, beams), fill_value=-1e9, dtype=torch.float, device=device)
    is_sent_finished = torch.zeros((batch_size, beams), dtype=torch.bool, device=device)
    unsatisfied = torch.ones((batch_size, 1), dtype=torch.bool, device=device)
    running_beam_indices = torch.full(
        (batch_size, beams, max_length - cur_len), fill_value=-1, dtype=torch.int32, device=device
    )
    beam_indices = running_beam_indices.detach().clone()
    # The output of every sentence, written when its search is over; `open_` maps the sentences still
    # decoded (rows of the tensors above) to their place in the batch.
    final_sequences, final_beam_indices = sequences.clone(), beam_indices.clone()
    open_ = torch.arange(batch_size, device=device)

    flat_running_sequences = input_ids
    model_outputs = model._prefill(input_ids, generation_config, model_kwargs)
    while True:
        if model_outputs is None:
            flat_running_sequences = model._flatten_beam_dim(running_sequences[:, :, :cur_len])
        logits, model_kwargs = _next_token_logits(model, flat_running_sequences, model_outputs, model_kwargs)
        model_outputs = None
        log_probs = _processed(
            logits_processor, flat_running_sequences, torch.nn.functional.log_softmax(logits, dim=-1)
        )
        active = open_.shape[0]
        log_probs = model._unflatten_beam_dim(log_probs, active, beams) + running_beam_scores[:, :, None]
        log_probs = torch.reshape(log_probs, (active, -1))

        topk_log_probs, topk_running_sequences, topk_running_beam_indices = model._get_top_k_continuations(
            accumulated_log_probs=log_probs,
            running_sequences=running_sequences,
            running_beam_indices=running_beam_indices,
            cur_len=cur_len,
            decoder_prompt_len=decoder_prompt_len,
            do_sample=False,
            beams_to_keep=beams_to_keep,
            num_beams=beams,
            batch_size=active,
        )
        hits = stopping_criteria(model._flatten_beam_dim(topk_running_sequences[:, :, : cur_len + 1]), None)
        hits = model._unflatten_beam_dim(hits, active, beams_to_keep)
        running_sequences, running_beam_scores, running_beam_indices = (
            model._get_running_beams_for_next_iteration(
                topk_log_probs=topk_log_probs,
                topk_running_sequences=topk_running_sequences,
                topk_running_beam_indices=topk_running_beam_indices,
                next_token_hits_stopping_criteria=hits,
                num_beams=beams,
            )
        )
        sequences, beam_scores, beam_indices, is_sent_finished = model._update_finished_beams(
            sequences=sequences,
            topk_running_sequences=topk_running_sequences,
            beam_scores=beam_scores,
            topk_log_probs=topk_log_probs,
            beam_indices=beam_indices,
            topk_running_beam_indices=topk_running_beam_indices,
            is_early_stop_heuristic_unsatisfied=unsatisfied,
            is_sent_finished=is_sent_finished,
            next_token_hits_stopping_criteria=hits,
            top_num_beam_mask=top_num_beam_mask,
            num_beams=beams,
            cur_len=cur_len,
            decoder_prompt_len=decoder_prompt_len,
            length_penalty=length_penalty,
            early_stopping=early_stopping,
        )
        beam_idx = model._flatten_beam_dim(running_beam_indices[..., cur_len - decoder_prompt_len])
        cur_len = cur_len + 1
        unsatisfied = model._check_early_stop_heuristic(
            is_early_stop_heuristic_unsatisfied=unsatisfied,
            running_beam_scores=running_beam_scores,
            beam_scores=beam_scores,
            is_sent_finished=is_sent_finished,
            cur_len=cur_len,
            max_length=max_length,
            decoder_prompt_len=decoder_prompt_len,
            early_stopping=early_stopping,
            length_penalty=length_penalty,
        )
        going_on = model._beam_search_has_unfinished_sequences(
            unsatisfied, is_sent_finished, hits, early_stopping
        )
        over = _search_over(unsatisfied, is_sent_finished, early_stopping)
        if not going_on or bool(over.all()):
            break
        if not bool(over.any()):
            model_kwargs["cache"] = model._reorder_cache(model_kwargs["cache"], beam_idx)
            continue
        # Those sentences' lists are final: write them out and go on with the others only.
        final_sequences[open_[over]] = sequences[over]
        final_beam_indices[open_[over]] = beam_indices[over]
        kept = (~over).nonzero().squeeze(1)
        rows = (kept[:, None] * beams + torch.arange(beams, device=device)).flatten()
        state = (running_sequences, running_beam_scores, running_beam_indices, sequences, beam_scores)
        running_sequences, running_beam_scores, running_beam_indices, sequences, beam_scores = (
            tensor.index_select(0, kept) for tensor in state
        )
        beam_indices, is_sent_finished, unsatisfied = (
            tensor.index_select(0, kept) for tensor in (beam_indices, is_sent_finished, unsatisfied)
        )
        # beam_idx numbers the rows before dropping; the cross-attention entries never move between
        # sentences.
        _drop_rows(model_kwargs, logits_processor, kept, rows, beam_idx.index_select(0, rows), active, beams)
        open_ = open_[kept]

    final_sequences[open_] = sequences
    final_beam_indices[open_] = beam_indices
    returned = generation_config.num_return_sequences
    sequences = model._flatten_beam_dim(final_sequences[:, :returned, :])
    beam_indices = model._flatten_beam_dim(final_beam_indices[:, :returned, :])
    max_generated_length = ((beam_indices + 1).bool()).sum(dim=1).max()
    return sequences[:, : decoder_prompt_len + max_generated_length]


def _greedy_search_dropping_finished(
    model: GenerationMixin,
    input_ids: torch.Tensor,
    logits_processor: LogitsProcessorList,
    stopping_criteria: StoppingCriteriaList,
    generation_config: GenerationConfig,
    **model_kwargs: object,
) -> torch.Tensor:
    """``GenerationMixin._sample`` for greedy search (deterministic, sequences only) that stops decoding
    a sentence as soon as it has ended: its row leaves the batch, the cache and the encoder output, and
    its tokens wait in the output, followed by the padding transformers' loop writes after ``</s>``
    while it computes that row on. The sentences still open see the same processors and criteria in
    the same order, so every sentence gets the tokens transformers' loop returns."""
    pad_token_id = generation_config._pad_token_tensor
    batch_size, device = input_ids.shape[0], input_ids.device
    open_ = torch.arange(batch_size, device=device)  # the sentences still decoded, by place in the batch
    ended: list[tuple[torch.Tensor, torch.Tensor]] = []  # (places, tokens so far) of sentences over

    model_outputs = model._prefill(input_ids, generation_config, model_kwargs)
    while True:
        logits, model_kwargs = _next_token_logits(model, input_ids, model_outputs, model_kwargs)
        model_outputs = None
        next_tokens = torch.argmax(_processed(logits_processor, input_ids, logits), dim=-1)
        input_ids = torch.cat([input_ids, next_tokens[:, None]], dim=-1)
        over = stopping_criteria(input_ids, None)  # (active,)
        if bool(over.all()):
            break
        if not bool(over.any()):
            continue
        ended.append((open_[over], input_ids[over]))
        kept = (~over).nonzero().squeeze(1)
        _drop_rows(model_kwargs, logits_processor, kept, kept, kept, open_.shape[0], 1)
        input_ids, open_ = input_ids.index_select(0, kept), open_[kept]

    if not ended:
        return input_ids
    # Sentences end apart only at </s>, and then transformers has set a padding token (</s> at worst).
    fill = pad_token_id if pad_token_id is not None else generation_config._eos_token_tensor[0]
    sequences = input_ids.new_full((batch_size, input_ids.shape[1]), int(fill))
    for places, tokens in (*ended, (open_, input_ids)):
        sequences[places, : tokens.shape[1]] = tokens
    return sequences


class DroppingFinishedSentencesMixin(GenerationMixin):
    """``GenerationMixin`` whose beam and greedy search drop finished sentences (same sequences)."""

    #: Beam search stops decoding each sentence once its n-best list is final, greedy search once the
    #: sentence has ended (see ``_beam_search_dropping_finished``, ``_greedy_search_dropping_finished``);
    #: ``False`` runs transformers' own loops, which return the same sequences and go on computing
    #: those rows. ``HF_VANILLA_FAST_PATHS=0`` also turns it off.
    drop_finished_sentences: bool = True

    def _drops_finished_sentences(
        self,
        input_ids: torch.Tensor,
        logits_processor: LogitsProcessorList,
        stopping_criteria: StoppingCriteriaList,
        generation_config: GenerationConfig,
        synced_gpus: bool,
        model_kwargs: dict[str, object],
    ) -> bool:
        """Whether this beam or greedy search may drop finished sentences: deterministic, returning
        sequences only (no scores, cache or attentions), a fresh cache, only row-wise processors and
        inputs, and the decoder's inputs built as transformers builds them (its own
        ``prepare_inputs_for_generation``, the ids on the model's device)."""
        cache = model_kwargs.get("cache")
        return (
            self.drop_finished_sentences
            and fast_paths.enabled()
            and type(self).prepare_inputs_for_generation is GenerationMixin.prepare_inputs_for_generation
            and input_ids.device == self.device
            and not (synced_gpus or generation_config.do_sample or generation_config.return_dict_in_generate)
            and getattr(generation_config, "prefill_chunk_size", None) is None
            and not getattr(generation_config, "is_assistant", False)
            and bool(model_kwargs.get("use_cache"))
            and isinstance(cache, EncoderDecoderCache)
            and cache.get_seq_length() == 0
            and set(model_kwargs) <= _KNOWN_KWARGS
            and all(type(item) in _ROW_WISE for item in (*logits_processor, *stopping_criteria))
        )

    def _beam_search(
        self,
        input_ids: torch.Tensor,
        logits_processor: LogitsProcessorList,
        stopping_criteria: StoppingCriteriaList,
        generation_config: GenerationConfig,
        synced_gpus: bool = False,
        **model_kwargs: object,
    ) -> object:
        """transformers' beam search, or the same search without the rows of sentences whose n-best
        list is final where :meth:`_drops_finished_sentences` allows it (same sequences); either way over
        a self-attention cache that grows in place (:class:`fast_paths.GrowableLayer`)."""
        fast_paths.make_growable(model_kwargs.get("cache"))
        if self._drops_finished_sentences(
            input_ids, logits_processor, stopping_criteria, generation_config, synced_gpus, model_kwargs
        ):
            return _beam_search_dropping_finished(
                self, input_ids, logits_processor, stopping_criteria, generation_config, **model_kwargs
            )
        return super()._beam_search(
            input_ids, logits_processor, stopping_criteria, generation_config, synced_gpus, **model_kwargs
        )

    def _sample(
        self,
        input_ids: torch.Tensor,
        logits_processor: LogitsProcessorList,
        stopping_criteria: StoppingCriteriaList,
        generation_config: GenerationConfig,
        synced_gpus: bool = False,
        streamer: object | None = None,
        **model_kwargs: object,
    ) -> object:
        """transformers' greedy search and sampling, or greedy search without the rows of sentences
        that have ended where :meth:`_drops_finished_sentences` allows it, nothing streams the tokens
        and the cache is dynamic (a static one is transformers' compiled loop): same sequences. A
        dynamic self-attention cache grows in place (:class:`fast_paths.GrowableLayer`)."""
        cache = model_kwargs.get("cache")
        fast_paths.make_growable(cache)
        if (
            streamer is None
            and isinstance(cache, EncoderDecoderCache)
            and type(cache.self_attention_cache) is DynamicCache
            and self._drops_finished_sentences(
                input_ids, logits_processor, stopping_criteria, generation_config, synced_gpus, model_kwargs
            )
        ):
            return _greedy_search_dropping_finished(
                self, input_ids, logits_processor, stopping_criteria, generation_config, **model_kwargs
            )
        return super()._sample(
            input_ids,
            logits_processor,
            stopping_criteria,
            generation_config,
            synced_gpus,
            streamer,
            **model_kwargs,
        )

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
        cache.self_attention_cache.reorder_cache(beam_idx)
        cross = cache.cross_attention_cache
        if (
            cross.layers
            and cross.layers[0].is_initialized
            and cross.layers[0].keys.shape[0] == beam_idx.shape[0]
        ):
            cross.reorder_cache(beam_idx)
        return cache

    def generate(self, *args: object, **kwargs: object) -> object:
        """The model's ``generate``; a returned cache has one cross-attention row per hypothesis again."""
        output = super().generate(*args, **kwargs)
        cache = getattr(output, "cache", None)  # not `past_key_values`: that alias logs a deprecation
        if isinstance(cache, EncoderDecoderCache):
            _one_row_per_hypothesis(cache)
        return output
