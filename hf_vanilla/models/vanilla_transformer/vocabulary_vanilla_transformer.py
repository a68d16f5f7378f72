# Copyright 2026 The hf_vanilla authors.
# SPDX-License-Identifier: Apache-2.0 (http://www.apache.org/licenses/LICENSE-2.0)
"""The vocabulary of the Transformer of :mod:`modeling_vanilla_transformer`: token ids and labels
checked against it (a clear error instead of an index error deep inside torch), and resized with it
(``resize_token_embeddings``, as ``MarianMTModel`` resizes one shared or two separate vocabularies).

Input checks and vocabulary plumbing, not the paper: kept beside the modeling file, which calls them.
It imports only torch and transformers: it travels with the modeling file into a Hub folder.
"""

from __future__ import annotations

import os

import torch
from torch import nn

#: Set to ``1`` to check token ids against the vocabulary on every device. On the CPU the check is
#: always made (it costs nothing there); elsewhere it reads the ids back to the host, a sync per
#: forward, so it is off unless asked for (an id out of range then fails inside the embedding).
CHECK_TOKEN_IDS = "HF_VANILLA_CHECK_TOKEN_IDS"
#: ... read once, when the model is imported (never inside ``forward``).
_CHECK_TOKEN_IDS_EVERYWHERE = os.environ.get(CHECK_TOKEN_IDS) == "1"


def readable(tensor: torch.Tensor) -> bool:
    """Whether the values of ``tensor`` can be read on the host for free: a CPU tensor outside
    ``torch.compile``, TorchScript tracing and ``torch.func`` transforms. Checks that read values
    (is there padding? are the ids in the vocabulary?) run only then, so that no other path has a
    host sync or data-dependent control flow."""
    return (
        tensor.device.type == "cpu"
        and not torch.compiler.is_compiling()
        and not torch.jit.is_tracing()
        and not torch._C._functorch.is_functorch_wrapped_tensor(tensor)
    )


def check_token_ids(input_ids: torch.Tensor, vocab_size: int, name: str) -> None:
    """Raise a clear error for ids outside [0, V) instead of an index error deep inside torch: on
    the CPU always (outside compilation and transforms), elsewhere only with
    ``HF_VANILLA_CHECK_TOKEN_IDS=1`` at import (it needs a host sync)."""
    if input_ids.numel() == 0:
        raise ValueError(
            f"`{name}` is empty (shape {tuple(input_ids.shape)}): give at least one row of at least one token."
        )
    if not (readable(input_ids) or (_CHECK_TOKEN_IDS_EVERYWHERE and not torch.compiler.is_compiling())):
        return
    low, high = int(input_ids.min()), int(input_ids.max())
    if low < 0 or high >= vocab_size:
        raise ValueError(
            f"`{name}` contains token id {high if high >= vocab_size else low}, outside the vocabulary "
            f"[0, {vocab_size}). Use the tokenizer the model was trained with, or resize the embeddings "
            "with `model.resize_token_embeddings(len(tokenizer))`."
        )


def check_labels(labels: torch.Tensor, vocab_size: int) -> None:
    """Raise a clear error for labels outside [0, V) other than -100 (ignored), instead of an index
    error inside the loss. It reads the values, so the caller runs it only where that is free
    (:func:`readable`)."""
    if labels.numel() == 0:
        return
    bad = labels[(labels != -100) & ((labels < 0) | (labels >= vocab_size))]
    if bad.numel():
        raise ValueError(
            f"`labels` contain token id {int(bad[0])}, outside the vocabulary [0, {vocab_size}) (-100 marks "
            "ignored positions). Tokenize the targets with the tokenizer the model was trained with."
        )


class VanillaTransformerVocabularyMixin:
    """Resizing the vocabulary (a base of ``VanillaTransformerForConditionalGeneration``, before
    ``PreTrainedModel``, whose methods it extends)."""

    def resize_token_embeddings(
        self,
        new_num_tokens: int | None = None,
        pad_to_multiple_of: int | None = None,
        mean_resizing: bool = True,
    ) -> nn.Embedding:
        """``PreTrainedModel.resize_token_embeddings``, as ``MarianMTModel`` does it: with one shared
        vocabulary (§3.4) the embedding, the output projection and ``final_logits_bias`` (kept
        entries, new ones 0); with separate vocabularies (``share_encoder_decoder_embeddings=False``,
        deviation 6) the source embedding only, see :meth:`resize_decoder_token_embeddings`."""
        if not self.config.share_encoder_decoder_embeddings and self.config.decoder_vocab_size is None:
            self.config.decoder_vocab_size = self.config.vocab_size  # the target vocabulary keeps its size
        embeddings = super().resize_token_embeddings(new_num_tokens, pad_to_multiple_of, mean_resizing)
        if self.config.share_encoder_decoder_embeddings:
            self._resize_final_logits_bias(embeddings.num_embeddings)
        return embeddings

    def _resize_token_embeddings(
        self, new_num_tokens: int | None, pad_to_multiple_of: int | None = None, mean_resizing: bool = True
    ) -> nn.Embedding:
        """The source (or shared) embedding, resized in place, so a tied projection follows it; an
        untied projection over the same, shared vocabulary is resized alongside."""
        embeddings = self._get_resized_embeddings(
            self.get_input_embeddings(), new_num_tokens, pad_to_multiple_of, mean_resizing
        )
        if self.config.share_encoder_decoder_embeddings and not self.config.tie_word_embeddings:
            self.set_output_embeddings(
                self._get_resized_lm_head(
                    self.lm_head, embeddings.num_embeddings, mean_resizing=mean_resizing
                )
            )
        return embeddings

    def resize_decoder_token_embeddings(
        self, new_num_tokens: int, pad_to_multiple_of: int | None = None, mean_resizing: bool = True
    ) -> nn.Embedding:
        """Resize the target vocabulary of a model with separate vocabularies: the decoder embedding,
        the output projection (tied to it, or resized alongside) and ``final_logits_bias``, and
        ``config.decoder_vocab_size`` (``MarianMTModel.resize_decoder_token_embeddings``)."""
        if self.config.share_encoder_decoder_embeddings:
            raise ValueError(
                "This model has one vocabulary shared by source and target "
                "(`share_encoder_decoder_embeddings=True`): resize it with `resize_token_embeddings`."
            )
        embeddings = self._get_resized_embeddings(
            self.model.decoder.embed_tokens, new_num_tokens, pad_to_multiple_of, mean_resizing
        )
        if not self.config.tie_word_embeddings:
            self.set_output_embeddings(
                self._get_resized_lm_head(
                    self.lm_head, embeddings.num_embeddings, mean_resizing=mean_resizing
                )
            )
        self.config.decoder_vocab_size = embeddings.num_embeddings
        self.tie_weights()
        self._resize_final_logits_bias(embeddings.num_embeddings)
        return embeddings

    def _resize_final_logits_bias(self, new_num_tokens: int) -> None:
        """Deviation 6 (Marian's bias): follow a resized target vocabulary, new entries 0."""
        if not self.config.final_logits_bias:
            return
        old = self.final_logits_bias  # (1, V)
        if new_num_tokens <= old.shape[-1]:
            self.final_logits_bias = old[:, :new_num_tokens].clone()
        else:
            self.final_logits_bias = torch.cat([old, old.new_zeros(1, new_num_tokens - old.shape[-1])], dim=1)
