"""``generate()`` over the ONNX graphs: greedy, beam search and sampling with ONNX Runtime.

    from hf_vanilla.interop.onnx_generation import OnnxVanillaTransformerForConditionalGeneration

    model = OnnxVanillaTransformerForConditionalGeneration.from_pretrained("demo_output_onnx")
    output_ids = model.generate(input_ids=ids, attention_mask=mask)  # the folder's generation config

:class:`OnnxVanillaTransformerForConditionalGeneration` is a ``PreTrainedModel`` with transformers'
``GenerationMixin`` (and the model's own §6.1 decoding policy: the per-sentence "source length + 50"
bound and the paper's defaults from ``generation_config.json``) whose forward runs the two ONNX
Runtime sessions of :mod:`hf_vanilla.interop.export_onnx` instead of torch modules:

* ``get_encoder()`` runs ``encoder.onnx``: the encoder and the first decoder step, kept in the
  :class:`OnnxEncoderOutput` that ``generate()`` hands to every forward call;
* the first forward (an empty cache) takes that step's logits and fills transformers' own
  ``EncoderDecoderCache`` with its tensors (one row per hypothesis: a sentence's rows are repeated
  for its beams or return sequences); every later forward runs ``decoder_with_past.onnx`` on the
  cache and replaces the self-attention entries with the grown ones it returns.

The cache holds torch tensors that share memory with the ONNX Runtime arrays (``torch.from_numpy``
and ``Tensor.numpy`` copy nothing), so beam search reorders it through the cache interface
(``reorder_cache``), as it does for the PyTorch model. Greedy and beam-4 tokens equal the PyTorch
model's on a padded batch (tested); sampling follows ``torch``'s seed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from transformers import DynamicCache, EncoderDecoderCache, GenerationConfig, GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import Seq2SeqLMOutput
from transformers.utils import ModelOutput

from hf_vanilla.interop.export_onnx import load_onnx_sessions, past_names
from hf_vanilla.models.vanilla_transformer.configuration_vanilla_transformer import VanillaTransformerConfig
from hf_vanilla.models.vanilla_transformer.generation_vanilla_transformer import (
    VanillaTransformerGenerationMixin,
)
from hf_vanilla.speed.search import DroppingFinishedSentencesMixin

__all__ = ["OnnxEncoder", "OnnxEncoderOutput", "OnnxVanillaTransformerForConditionalGeneration"]


@dataclass
class OnnxEncoderOutput(ModelOutput):
    """What ``encoder.onnx`` returns for a batch of B sentences: ``logits`` (B, V) of the first decoder
    step (from the decoder start token) and ``cache``, the tensors of the cache after that step in
    :func:`~hf_vanilla.interop.export_onnx.past_names` order (per layer: self-attention key and value
    (B, H, 1, Dh), cross-attention key and value (B, H, S, Dh))."""

    logits: torch.Tensor | None = None
    cache: tuple[torch.Tensor, ...] | None = None


def _numpy(tensor: torch.Tensor) -> np.ndarray:
    return tensor.detach().contiguous().numpy()


class OnnxEncoder(nn.Module):
    """``get_encoder()`` of the ONNX model: runs ``encoder.onnx`` (an ONNX Runtime session)."""

    main_input_name = "input_ids"

    def __init__(self, session: Any) -> None:
        super().__init__()
        self.session = session

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool = True,
    ) -> OnnxEncoderOutput:
        if output_attentions or output_hidden_states:
            raise ValueError(
                "The ONNX graphs return no attention weights or hidden states: "
                "drop output_attentions/output_hidden_states, or use the PyTorch model."
            )
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        logits, *cache = self.session.run(
            None,
            {"input_ids": _numpy(input_ids.long()), "attention_mask": _numpy(attention_mask.long())},
        )
        return OnnxEncoderOutput(
            logits=torch.from_numpy(logits), cache=tuple(torch.from_numpy(array) for array in cache)
        )


class OnnxVanillaTransformerForConditionalGeneration(
    PreTrainedModel, DroppingFinishedSentencesMixin, VanillaTransformerGenerationMixin, GenerationMixin
):
    """The exported model behind transformers' ``generate()``: a ``PreTrainedModel`` without
    parameters whose encoder and decoder steps are ONNX Runtime sessions (see the module docstring).
    Load it with :meth:`from_pretrained` from a folder that ``hf-vanilla-export-onnx`` wrote."""

    config_class = VanillaTransformerConfig
    main_input_name = "input_ids"

    def __init__(self, config: VanillaTransformerConfig, sessions: tuple[Any, Any]) -> None:
        super().__init__(config)
        self.encoder = OnnxEncoder(sessions[0])
        self.decoder_session = sessions[1]
        self.num_layers = config.decoder_layers
        self.past_inputs = past_names(self.num_layers, "past")
        self.post_init()

    @classmethod
    def from_pretrained(  # type: ignore[override]
        cls, folder: str | Path, intra_op_threads: int | None = None
    ) -> OnnxVanillaTransformerForConditionalGeneration:
        """The model of an ONNX export folder: its config, its generation config (the PyTorch
        model's decoding defaults) and CPU ONNX Runtime sessions of its two graphs
        (``intra_op_threads``: ONNX Runtime's default when ``None``)."""
        folder = Path(folder)
        model = cls(
            VanillaTransformerConfig.from_pretrained(folder),
            load_onnx_sessions(folder, intra_op_threads=intra_op_threads),
        )
        model.generation_config = GenerationConfig.from_pretrained(folder)
        return model

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")  # the sessions take and return CPU arrays

    @property
    def dtype(self) -> torch.dtype:
        return torch.float32

    def get_encoder(self, modality: str | None = None) -> OnnxEncoder:
        return self.encoder

    def _reorder_cache(self, cache: EncoderDecoderCache, beam_idx: torch.Tensor) -> EncoderDecoderCache:
        """Beam search: the self-attention cache follows the surviving hypotheses. The
        cross-attention entries are the same for every hypothesis of a sentence, and hypotheses
        never move to another sentence, so they stay as they are."""
        cache.self_attention_cache.reorder_cache(beam_idx)
        return cache

    def _start(
        self, encoder_outputs: OnnxEncoderOutput, rows: int
    ) -> tuple[torch.Tensor, EncoderDecoderCache]:
        """The first step's logits and cache from ``encoder.onnx``'s output, each sentence's row
        repeated for its ``rows // B`` hypotheses."""
        repeats = rows // encoder_outputs.logits.shape[0]
        tensors = [tensor.repeat_interleave(repeats, dim=0) for tensor in encoder_outputs.cache]
        cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
        for layer in range(self.num_layers):
            cache.self_attention_cache.update(tensors[4 * layer], tensors[4 * layer + 1], layer)
            cache.cross_attention_cache.update(tensors[4 * layer + 2], tensors[4 * layer + 3], layer)
            cache.is_updated[layer] = True
        return encoder_outputs.logits.repeat_interleave(repeats, dim=0), cache

    def _step(
        self, token: torch.Tensor, attention_mask: np.ndarray, cache: EncoderDecoderCache
    ) -> torch.Tensor:
        """One ``decoder_with_past.onnx`` step for ``token`` (rows, 1): its logits (rows, V); the
        self-attention entries of ``cache`` become the grown ones the graph returns."""
        own, cross = cache.self_attention_cache.layers, cache.cross_attention_cache.layers
        feed = {"input_ids": _numpy(token), "encoder_attention_mask": attention_mask}
        tensors = [
            t
            for layer in range(self.num_layers)
            for t in (own[layer].keys, own[layer].values, cross[layer].keys, cross[layer].values)
        ]
        feed.update(zip(self.past_inputs, map(_numpy, tensors), strict=True))
        logits, *grown = self.decoder_session.run(None, feed)
        for layer in range(self.num_layers):
            own[layer].keys = torch.from_numpy(grown[2 * layer])
            own[layer].values = torch.from_numpy(grown[2 * layer + 1])
        return torch.from_numpy(logits)

    def forward(
        self,
        decoder_input_ids: torch.Tensor,
        encoder_outputs: OnnxEncoderOutput,
        attention_mask: torch.Tensor | None = None,
        cache: EncoderDecoderCache | None = None,
        use_cache: bool | None = None,
        return_dict: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
    ) -> Seq2SeqLMOutput:
        """The next-token logits (rows, 1, V) after ``decoder_input_ids`` (rows, T): the tokens
        not yet in ``cache`` (all of them, from the decoder start token, when it is empty or
        ``None``), and the cache grown by them (``cache``; a new one when ``cache`` is
        empty: ``generate()`` reads it from the output)."""
        if output_attentions or output_hidden_states:
            raise ValueError(
                "The ONNX graphs return no attention weights or hidden states: "
                "drop output_attentions/output_hidden_states, or use the PyTorch model."
            )
        rows = decoder_input_ids.shape[0]
        if attention_mask is None:
            attention_mask = torch.ones(rows, encoder_outputs.cache[2].shape[2], dtype=torch.long)
        if cache is None or cache.get_seq_length() == 0:
            if not bool((decoder_input_ids[:, 0] == self.config.decoder_start_token_id).all()):
                raise ValueError(
                    "The ONNX encoder graph decodes its first step from the decoder start token "
                    f"({self.config.decoder_start_token_id}): begin decoder_input_ids with it."
                )
            logits, cache = self._start(encoder_outputs, rows)
            pending = decoder_input_ids[:, 1:]
        else:
            pending = decoder_input_ids
        mask = _numpy(attention_mask.long())
        for position in range(pending.shape[1]):
            logits = self._step(pending[:, position : position + 1], mask, cache)
        return Seq2SeqLMOutput(logits=logits[:, None, :], cache=cache)
