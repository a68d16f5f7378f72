"""Ensemble decoding: several models that share one vocabulary translate together, their next-token
distributions averaged at every step inside transformers' ``generate()``.

:func:`ensemble` wraps the models in an :class:`EnsembleModel`, a ``PreTrainedModel`` whose forward runs
each member with its own cache and returns log(mean_m p_m(y | ...)) as its logits (logsumexp of the
members' log-softmax minus log M, as fairseq's ``EnsembleModel`` averages probabilities). Everything
else is the first member's ``generate()``: beam search, greedy search, sampling, the length bound and
the logits processors run unchanged on these logits. What ``generate()`` asks of a model is delegated to
each member: its encoder, its cache (kept side by side in an :class:`EnsembleCache`), the expansion of
its encoder output for beam search, and the reordering of its cache when beams move. An ensemble of one
model decodes exactly as the model alone (log-softmax changes no ranking, and beam search takes the
log-softmax of the logits anyway).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers.cache_utils import Cache
from transformers.modeling_outputs import Seq2SeqLMOutput
from transformers.utils import ModelOutput

from hf_vanilla.inference.ctranslate2 import resolve_backend
from hf_vanilla.inference.loading import load_model_and_tokenizer
from hf_vanilla.inference.options import InferenceModelArguments

__all__ = [
    "EnsembleCache",
    "EnsembleEncoderOutput",
    "EnsembleModel",
    "ensemble",
    "load_ensemble",
    "parse_ensemble",
]

#: Why ``--ensemble`` needs the transformers backend (CTranslate2 decodes with one model).
NO_CTRANSLATE2_ENSEMBLE = (
    "--ensemble needs --backend transformers: CTranslate2 translates with one model and does not decode "
    "ensembles; give the transformers model folders (those the CTranslate2 exports were made from)."
)

#: The config entries that define the vocabulary a model's distributions are over, and its special tokens.
_VOCABULARY_KEYS = (
    "vocab_size",
    "decoder_vocab_size",
    "pad_token_id",
    "eos_token_id",
    "decoder_start_token_id",
)


@dataclass
class EnsembleEncoderOutput(ModelOutput):
    """The members' encoder outputs; ``last_hidden_state`` is the first member's (``generate()`` reads a
    batch's size from it)."""

    last_hidden_state: torch.Tensor | None = None
    members: tuple[ModelOutput, ...] | None = None


class EnsembleCache(Cache):
    """One cache per member (each the cache the member builds for itself), side by side."""

    def __init__(self, members: Sequence[Cache | None]) -> None:
        super().__init__(layers=[])
        self.members = list(members)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.members[0].get_seq_length(layer_idx)

    @property
    def is_compileable(self) -> bool:  # generate() compiles the forward for a static cache only
        return False


class _EnsembleEncoder(nn.Module):
    """Each member's encoder on the same source."""

    def __init__(self, members: nn.ModuleList) -> None:
        super().__init__()
        self.members = members

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
    ) -> EnsembleEncoderOutput:
        outputs = tuple(
            member.get_encoder()(
                input_ids=input_ids,
                attention_mask=attention_mask,
                output_attentions=output_attentions,
                output_hidden_states=output_hidden_states,
                return_dict=True,
            )
            for member in self.members
        )
        return EnsembleEncoderOutput(last_hidden_state=outputs[0].last_hidden_state, members=outputs)


class EnsembleModel(PreTrainedModel):
    """Models with one vocabulary as one: logits log(mean_m p_m), each member with its own encoder output
    and cache. Made by :func:`ensemble`, which adds the first member's generation mixin (its
    ``generate()``)."""

    # The members attend, each as its config says; the wrapper takes any attention implementation.
    _supports_sdpa = _supports_flash_attn = _supports_flex_attn = True

    def __init__(self, members: Sequence[PreTrainedModel]) -> None:
        config = copy.deepcopy(members[0].config)
        lengths = [getattr(member.config, "max_position_embeddings", None) for member in members]
        if None not in lengths:  # the longest input every member takes
            config.max_position_embeddings = min(lengths)
        super().__init__(config)
        self.members = nn.ModuleList(members)
        self.generation_config = copy.deepcopy(members[0].generation_config)

    def get_encoder(self, modality: str | None = None) -> _EnsembleEncoder:
        return _EnsembleEncoder(self.members)

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.Tensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        encoder_outputs: EnsembleEncoderOutput | None = None,
        cache: EnsembleCache | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        return_dict: bool | None = None,
    ) -> Seq2SeqLMOutput:
        """(B, T, V) logits log(mean_m softmax(logits_m)); the cache holds each member's. With
        ``output_attentions``: each attention the members' mean (members of one architecture)."""
        if encoder_outputs is None:
            encoder_outputs = self.get_encoder()(input_ids, attention_mask)
        caches = cache.members if cache is not None else [None] * len(self.members)
        outputs = [
            member(
                attention_mask=attention_mask,
                decoder_input_ids=decoder_input_ids,
                decoder_attention_mask=decoder_attention_mask,
                encoder_outputs=member_encoder_outputs,
                cache=member_cache,
                use_cache=use_cache,
                output_attentions=output_attentions,
                return_dict=True,
            )
            for member, member_encoder_outputs, member_cache in zip(
                self.members, encoder_outputs.members, caches, strict=True
            )
        ]
        log_probs = torch.stack([output.logits.float().log_softmax(dim=-1) for output in outputs])
        logits = log_probs.logsumexp(dim=0) - math.log(len(outputs))
        return Seq2SeqLMOutput(
            logits=logits,
            cache=EnsembleCache([output.cache for output in outputs]) if use_cache else None,
            decoder_attentions=self._mean(outputs, "decoder_attentions"),
            cross_attentions=self._mean(outputs, "cross_attentions"),
        )

    @staticmethod
    def _mean(outputs: list[Seq2SeqLMOutput], name: str) -> tuple[torch.Tensor, ...] | None:
        """The members' attentions ``name``, layer by layer, averaged over the members."""
        layers = [getattr(output, name) for output in outputs]
        if layers[0] is None:
            return None
        shapes = {tuple(tuple(layer.shape) for layer in member) for member in layers}
        if len(shapes) > 1:
            raise ValueError(
                "An ensemble's attention (--alignment_file) is its members' mean, layer by layer: give members with "
                "the same number of layers and heads."
            )
        return tuple(torch.stack(layer).float().mean(dim=0) for layer in zip(*layers, strict=True))

    def _prepare_cache_for_generation(
        self,
        generation_config: Any,
        model_kwargs: dict[str, Any],
        generation_mode: Any,
        batch_size: int,
        max_cache_length: int,
    ) -> None:
        """Each member's cache, as the member prepares it for itself, in one :class:`EnsembleCache`."""
        if model_kwargs.get("cache") is not None or generation_config.use_cache is False:
            super()._prepare_cache_for_generation(
                generation_config, model_kwargs, generation_mode, batch_size, max_cache_length
            )
            return
        caches = []
        for member in self.members:
            member_kwargs: dict[str, Any] = {}
            member._prepare_cache_for_generation(
                generation_config, member_kwargs, generation_mode, batch_size, max_cache_length
            )
            caches.append(member_kwargs.get("cache"))
        model_kwargs["cache"] = EnsembleCache(caches)

    def _expand_inputs_for_generation(
        self,
        expand_size: int = 1,
        is_encoder_decoder: bool = False,
        input_ids: torch.Tensor | None = None,
        **model_kwargs: Any,
    ) -> tuple[torch.Tensor | None, dict[str, Any]]:
        """The decoder inputs expanded per hypothesis as the generation mixin does; each member's encoder
        output as that member expands it (an hf_vanilla model keeps one row per sentence)."""
        encoder_outputs = model_kwargs.pop("encoder_outputs", None)
        input_ids, model_kwargs = super()._expand_inputs_for_generation(
            expand_size=expand_size, is_encoder_decoder=False, input_ids=input_ids, **model_kwargs
        )
        if encoder_outputs is not None:
            members = tuple(
                member._expand_inputs_for_generation(
                    expand_size=expand_size, is_encoder_decoder=True, encoder_outputs=outputs
                )[1]["encoder_outputs"]
                for member, outputs in zip(self.members, encoder_outputs.members, strict=True)
            )
            model_kwargs["encoder_outputs"] = EnsembleEncoderOutput(
                encoder_outputs.last_hidden_state, members
            )
        return input_ids, model_kwargs

    def _reorder_cache(self, cache: EnsembleCache, beam_idx: torch.Tensor) -> EnsembleCache:
        """Beam search: each member's cache follows the surviving hypotheses as the member reorders it."""
        for k, (member, member_cache) in enumerate(zip(self.members, cache.members, strict=True)):
            if hasattr(member, "_reorder_cache"):
                cache.members[k] = member._reorder_cache(member_cache, beam_idx)
            else:
                member_cache.reorder_cache(beam_idx)
        return cache


@functools.cache
def _ensemble_class(mixin: type[GenerationMixin]) -> type[EnsembleModel]:
    return type(f"Ensemble{mixin.__name__}", (EnsembleModel, mixin), {})


def _generation_mixin(model: PreTrainedModel) -> type[GenerationMixin]:
    """The class that gives ``model`` its ``generate()`` (e.g. hf_vanilla's, with §6.1's length bound),
    passing over mixins that replace transformers' search loops: those (hf_vanilla.speed's loops that drop
    finished sentences) work on one model's cache, and an ensemble searches with transformers' own loops."""
    return next(
        base
        for base in type(model).__mro__
        if issubclass(base, GenerationMixin)
        and not issubclass(base, PreTrainedModel)
        and (base is GenerationMixin or not {"_beam_search", "_sample"} & set(vars(base)))
    )


def ensemble(models: Sequence[PreTrainedModel], names: Sequence[str] | None = None) -> EnsembleModel:
    """The ensemble of ``models`` (transformers encoder-decoders over one vocabulary), decoded with the
    first one's ``generate()`` and generation config. Models whose vocabularies or special-token ids differ
    are refused, naming both (``names``, default "model 1", "model 2", ...)."""
    if not models:
        raise ValueError("An ensemble needs at least one model.")
    names = list(names or [f"model {k + 1}" for k in range(len(models))])
    first = models[0].config
    for name, model in zip(names[1:], models[1:], strict=True):
        differing = [
            f"{key} {getattr(model.config, key, None)} vs {getattr(first, key, None)}"
            for key in _VOCABULARY_KEYS
            if getattr(model.config, key, None) != getattr(first, key, None)
        ]
        if differing:
            raise ValueError(_different_vocabularies(names[0], name, ", ".join(differing)))
    return _ensemble_class(_generation_mixin(models[0]))(models)


def _different_vocabularies(first: str, other: str, detail: str) -> str:
    return (
        f"--ensemble: {other} and {first} have different vocabularies ({detail}); an ensemble averages "
        "next-token distributions over one vocabulary: give models trained with the same tokenizer."
    )


def parse_ensemble(value: str) -> list[str]:
    """The model folders of ``--ensemble A,B,...``; an empty name is refused."""
    folders = [folder.strip() for folder in value.split(",")]
    if not all(folders):
        raise ValueError(
            f"--ensemble {value!r}: give model folders separated by commas, e.g. runs/a,runs/b (no empty name)."
        )
    return folders


def load_ensemble(args: InferenceModelArguments, folders: Sequence[str]) -> tuple[EnsembleModel, Any]:
    """The ensemble of ``args.model_name_or_path`` and ``folders`` (each loaded as ``args`` says) and the
    first one's tokenizer. A CTranslate2 export, or a folder whose tokenizer has another vocabulary than the
    first's, is refused in one line naming it."""
    names = [args.model_name_or_path, *folders]
    members = [dataclasses.replace(args, model_name_or_path=name) for name in names]
    if any(resolve_backend(member) == "ctranslate2" for member in members):
        raise ValueError(NO_CTRANSLATE2_ENSEMBLE)
    models, tokenizer = [], None
    for name, member in zip(names, members, strict=True):
        model, member_tokenizer = load_model_and_tokenizer(member)
        if tokenizer is None:
            tokenizer = member_tokenizer
        elif member_tokenizer.get_vocab() != tokenizer.get_vocab():
            ids, first_ids = member_tokenizer.get_vocab(), tokenizer.get_vocab()
            token = min(token for token in {*ids, *first_ids} if ids.get(token) != first_ids.get(token))
            detail = f"token {token!r}: id {ids.get(token)} vs {first_ids.get(token)}"
            raise ValueError(_different_vocabularies(names[0], name, detail))
        models.append(model)
    return ensemble(models, names), tokenizer
