"""hf_vanilla's model class: the folder's ``VanillaTransformerForConditionalGeneration`` with the CPU fast
paths of :mod:`hf_vanilla.speed.fast_paths` and the searches of :mod:`hf_vanilla.speed.search`.

It computes what the folder's class computes and has its name, config and weights; ``save_pretrained``
saves it as the folder's class. Importing this module registers :func:`fast_paths.sdpa_attention` as
the ``"sdpa"`` entry of the model file's ``ALL_ATTENTION_FUNCTIONS`` (transformers' ``AttentionInterface``).
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from hf_vanilla.models.vanilla_transformer import modeling_vanilla_transformer as modeling
from hf_vanilla.models.vanilla_transformer.vocabulary_vanilla_transformer import check_token_ids
from hf_vanilla.speed import fast_paths
from hf_vanilla.speed.search import DroppingFinishedSentencesMixin

modeling.ALL_ATTENTION_FUNCTIONS["sdpa"] = fast_paths.sdpa_attention


class VanillaTransformerForConditionalGeneration(
    DroppingFinishedSentencesMixin, modeling.VanillaTransformerForConditionalGeneration
):
    """The paper's model with the installed package's fast paths: stock linear and dropout layers enter
    them from their ``forward``, the training loss is fused with the output projection, and beam and
    greedy search drop finished sentences over a self-attention cache that grows in place."""

    def save_pretrained(self, *args: object, **kwargs: object) -> None:
        """Saved as the folder's class (its ``save_pretrained``, files, ``auto_map`` and name), so that
        the folder loads where hf_vanilla is not installed. A subclass (e.g. FSDP2's) is saved by the
        folder's saving mixin as the folder's class too."""
        if type(self) is not VanillaTransformerForConditionalGeneration:
            return super().save_pretrained(*args, **kwargs)
        self.__class__ = modeling.VanillaTransformerForConditionalGeneration
        try:
            return self.save_pretrained(*args, **kwargs)
        finally:
            self.__class__ = VanillaTransformerForConditionalGeneration

    def post_init(self) -> None:
        super().post_init()
        fast_paths.route_modules(self)

    def set_output_embeddings(self, new_embeddings: nn.Linear) -> None:
        super().set_output_embeddings(new_embeddings)
        fast_paths.route_modules(new_embeddings)  # as at construction

    @functools.wraps(modeling.VanillaTransformerForConditionalGeneration.forward)  # its signature
    def forward(self, *args: object, **kwargs: object) -> object:
        """The folder's ``forward``; in training, with the source and target embeddings of one shared
        matrix looked up in one call (:meth:`_embed_both`)."""
        shared = self.model.encoder.embed_tokens is self.model.decoder.embed_tokens
        if not args and shared and fast_paths.enabled() and torch.is_grad_enabled():
            input_ids, decoder_input_ids = kwargs.get("input_ids"), kwargs.get("decoder_input_ids")
            labels = kwargs.get("labels")
            if (
                decoder_input_ids is None
                and labels is not None
                and kwargs.get("decoder_inputs_embeds") is None
            ):
                decoder_input_ids = self.prepare_decoder_input_ids_from_labels(labels)
            if (
                input_ids is not None
                and decoder_input_ids is not None
                and kwargs.get("encoder_outputs") is None
            ):
                kwargs["inputs_embeds"], kwargs["decoder_inputs_embeds"] = self._embed_both(
                    input_ids, decoder_input_ids
                )
                kwargs["input_ids"] = kwargs["decoder_input_ids"] = None
        return super().forward(*args, **kwargs)

    def _embed_both(
        self, input_ids: torch.Tensor, decoder_input_ids: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Source (B, S) and decoder (B, T) ids → their (B, S, D) and (B, T, D) rows of the shared
        matrix, looked up in one call, so that in training the embeddings give the shared matrix one
        (V, D) gradient instead of two (then added). Same values and gradients as two lookups."""
        embed_tokens = self.model.encoder.embed_tokens  # the decoder's too
        check_token_ids(input_ids, embed_tokens.num_embeddings, "input_ids")
        check_token_ids(decoder_input_ids, embed_tokens.num_embeddings, "decoder_input_ids")
        both = embed_tokens(torch.cat([input_ids.reshape(-1), decoder_input_ids.reshape(-1)]))
        source, target = both.split([input_ids.numel(), decoder_input_ids.numel()])
        return source.view(*input_ids.shape, -1), target.view(*decoder_input_ids.shape, -1)

    def _logits_and_loss(
        self, hidden_states: torch.Tensor, labels: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The folder's projection and summed loss, as one autograd node in CPU fp32 training."""
        if labels is not None:
            bias = self.final_logits_bias.view(-1) if self.config.final_logits_bias else None
            fused = fast_paths.linear_cross_entropy(
                self.lm_head, hidden_states, bias, labels, self.config.label_smoothing
            )
            if fused is not None:
                total, logits = fused
                return logits, total
        return super()._logits_and_loss(hidden_states, labels)
