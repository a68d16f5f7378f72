# Copyright 2026 The hf_vanilla authors.
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
"""The original Transformer: Vaswani et al. (2017), "Attention Is All You Need", arXiv:1706.03762.

Order: decoder inputs (§3.1) and §3.5 positional encoding, §3.2.1 Eq. (1), §3.2.2 multi-head attention,
§3.3 Eq. (2) and §3.1 layers, initialisation, §3.1 stacks with §3.4 embeddings and §3.2.3 masks, the
model, §3.4 pre-softmax projection and §5.4 loss; §6.1 decoding: :mod:`generation_vanilla_transformer`.
It imports only torch, transformers and its siblings and calls stock operators only, so a saved folder
loads with ``trust_remote_code=True`` alone; the installed hf_vanilla adds its speed work from outside.

Deviations from the paper (each a deliberate, documented choice):

1. Initialisation is not specified by the paper. Embeddings (shared with the pre-softmax projection)
   are drawn from N(0, d_model^-0.5), so that after the √d_model scaling of §3.4 they have unit
   variance, the same scale as the positional encoding; every other linear layer is Xavier-uniform
   with zero bias (as tensor2tensor and fairseq do); LayerNorm starts at γ = 1, β = 0. The embedding
   row of the padding token is zero. ``config.init_std`` overrides the embedding standard deviation.
2. Decoding starts from ``decoder_start_token_id`` (by default the ``<s>`` token) and stops at
   ``</s>``; the paper does not name its start symbol.
3. The maximum output length of §6.1 (input length + 50) is applied per sentence: a row holds at
   most its own (unpadded) source length + 50 generated tokens, its ``</s>`` included (the 50 is the
   generation config's ``max_length_offset``).
4. Label smoothing (§5.4) is computed in the model's loss (``config.label_smoothing``) so that its
   normalisation under gradient accumulation and data parallelism is the same as the plain loss.
5. Padding: the paper does not discuss it. Keys that are padding are masked in every attention. A
   query row with no key to attend to (a fully padded sentence) stays finite in every precision: SDPA
   and flex attention give it a zero output, the eager kernel adds its mask in fp32 (its output is
   never used).
6. Options, all off by default, that let trained OPUS-MT (Marian) and fairseq (FSMT) checkpoints
   run unchanged (``hf_vanilla.interop.convert``): sin/cos in two halves instead of interleaved
   (``position_encoding_layout``), tensor2tensor's frequencies (``position_encoding_timescales``),
   positions starting at ``position_offset``, a fixed bias on the logits (``final_logits_bias``),
   separate source and target vocabularies (``share_encoder_decoder_embeddings``,
   ``decoder_vocab_size``); together with the existing ``activation_function`` (swish/GELU),
   ``scale_embedding`` (no √d_model), ``attention_bias`` and ``tie_word_embeddings``.
7. The length penalty α = 0.6 of §6.1 is applied as transformers' beam search does,
   log P(Y | X) / |Y|^α; the paper cites GNMT's ((5 + |Y|) / 6)^α, which ``hf_vanilla.inference.translation``
   offers as n-best rescoring (``length_penalty_type="gnmt"``).

Shape notation: B batch, S source length, T target length (new tokens in this call), P cached
target length, K key length, D = d_model, H heads, Dh = D / H per-head width, F = d_ff, V vocabulary.

Masks (§3.2.3) come from transformers' ``masking_utils`` in the kernel's format (``sdpa``, ``flex_attention``
and ``flash_attention_2`` are declared, as Marian does); a user's ``attention_mask``: 1 = token, 0 = padding.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn
from torch.nn import functional as F
from transformers import GenerationMixin, PreTrainedModel
from transformers import initialization as init
from transformers.activations import ACT2FN
from transformers.cache_utils import Cache, DynamicCache, EncoderDecoderCache
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import create_bidirectional_mask, create_causal_mask
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import (
    BaseModelOutput,
    BaseModelOutputWithPastAndCrossAttentions,
    Seq2SeqLMOutput,
    Seq2SeqModelOutput,
)
from transformers.modeling_utils import AttentionInterface
from transformers.utils.deprecation import deprecate_kwarg
from transformers.utils.generic import can_return_tuple
from transformers.utils.output_capturing import OutputRecorder, capture_outputs

from .configuration_vanilla_transformer import VanillaTransformerConfig
from .generation_vanilla_transformer import VanillaTransformerGenerationMixin
from .saving_vanilla_transformer import VanillaTransformerSavingMixin
from .vocabulary_vanilla_transformer import (
    VanillaTransformerVocabularyMixin,
    check_labels,
    check_token_ids,
    readable,
)


# --------------------------------------------------------------------------------------------------
# Decoder inputs from targets (teacher forcing, §3.1: "the output embeddings are offset by one
# position"), and §3.5 positional encoding
# --------------------------------------------------------------------------------------------------
def shift_tokens_right(labels: torch.Tensor, pad_token_id: int, decoder_start_token_id: int) -> torch.Tensor:
    """Decoder inputs from labels: prepend the start token, drop the last label, and turn ignored
    positions (-100) into padding. (B, T) → (B, T)."""
    start = labels.new_full((*labels.shape[:-1], 1), decoder_start_token_id)
    shifted = torch.cat((start, labels[..., :-1]), dim=-1)
    return shifted.masked_fill(shifted == -100, pad_token_id)


def sinusoidal_position_encoding(
    positions: torch.Tensor,
    d_model: int,
    dtype: torch.dtype = torch.float32,
    layout: str = "interleaved",
    timescales: str = "paper",
) -> torch.Tensor:
    """§3.5: PE(pos, 2i) = sin(pos / 10000^(2i/d_model)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d_model)).

    positions (..., L) → (..., L, D), computed in float32 and cast to ``dtype``. Deviation 6 (imported
    checkpoints): ``layout="halves"`` puts sines in dimensions [0, D/2) and cosines in [D/2, D);
    ``timescales="tensor2tensor"`` takes 10000^(-i/(D/2 - 1)) as the i-th frequency instead of 10000^(-2i/D).
    """
    i = torch.arange(d_model // 2, device=positions.device, dtype=torch.float32)  # (D/2,)
    denominator = d_model / 2 if timescales == "paper" else d_model / 2 - 1
    inv_freq = torch.exp(i * (-math.log(10000.0) / denominator))  # 10000^(-2i/D) in the paper
    angles = positions.to(torch.float32).unsqueeze(-1) * inv_freq  # (..., L, D/2)
    if layout == "halves":
        return torch.cat((angles.sin(), angles.cos()), dim=-1).to(dtype)  # (..., L, D)
    return torch.stack((angles.sin(), angles.cos()), dim=-1).flatten(-2).to(dtype)  # (..., L, D)


class VanillaTransformerPositionalEncoding(nn.Module):
    """§3.5 sinusoidal positional encoding, computed for any length on the fly.

    Nothing is stored: the encoding is a pure function of the position, so a model built on the meta
    device by ``from_pretrained`` cannot end up with an uninitialised table, and inputs longer than
    ``max_position_embeddings`` are encoded with the same closed form.
    """

    def __init__(
        self, d_model: int, layout: str = "interleaved", timescales: str = "paper", offset: int = 0
    ) -> None:
        super().__init__()
        self.d_model = d_model
        self.layout = layout  # deviation 6 options (imported checkpoints)
        self.timescales = timescales
        self.offset = offset  # the position of the first token: 0 in the paper

    @classmethod
    def from_config(cls, config: VanillaTransformerConfig) -> VanillaTransformerPositionalEncoding:
        return cls(
            config.d_model,
            layout=config.position_encoding_layout,
            timescales=config.position_encoding_timescales,
            offset=config.position_offset,
        )

    def forward(
        self, seq_len: int, past_len: int | torch.Tensor, device: torch.device, dtype: torch.dtype
    ) -> torch.Tensor:
        """(L, D) encodings of positions past_len … past_len + L − 1 (``past_len`` is a 0-d tensor
        for a static cache, so that compiled decoding does not specialise on it)."""
        positions = torch.arange(seq_len, device=device) + (past_len + self.offset)  # (L,)
        return sinusoidal_position_encoding(positions, self.d_model, dtype, self.layout, self.timescales)


# --------------------------------------------------------------------------------------------------
# §3.2.1 Scaled dot-product attention, §3.2.2 multi-head attention
# --------------------------------------------------------------------------------------------------
def eager_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    **kwargs: object,
) -> tuple[torch.Tensor, torch.Tensor]:
    """§3.2.1 Eq. (1): Attention(Q, K, V) = softmax(Q Kᵀ / √d_k) V. query (B, H, T, Dh), key and value
    (B, H, K, Dh) → (B, T, H, Dh) output and (B, H, T, K) probabilities. attention_mask (B, 1, T, K) from
    ``masking_utils``: additive (0 = attend, the dtype's minimum = masked; added in fp32, so a row with
    nothing to attend to stays finite), boolean (True = attend: SDPA's mask), or None (attend to all).
    """
    scores = torch.matmul(query, key.transpose(-1, -2)) * scaling  # (B, H, T, K)
    if attention_mask is not None and attention_mask.dtype == torch.bool:
        scores = scores.masked_fill(~attention_mask, torch.finfo(scores.dtype).min)
    elif attention_mask is not None:
        scores = scores.float() + attention_mask
    probs = F.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    probs = F.dropout(probs, p=dropout, training=module.training)
    output = torch.matmul(probs, value).transpose(1, 2).contiguous()  # (B, T, H, Dh)
    return output, probs


def sdpa_or_eager_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    **kwargs: object,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Eq. (1) for ``attn_implementation="sdpa"``: transformers' SDPA kernel, except where the
    attention weights are asked for (``output_attentions=True``; SDPA computes none): then
    :func:`eager_attention_forward`, which computes the same attention and returns its weights."""
    kernel: Callable = eager_attention_forward if kwargs.get("output_attentions") else sdpa_attention_forward
    return kernel(module, query, key, value, attention_mask, **kwargs)


#: transformers' attention functions with this model's own SDPA entry (its own ``AttentionInterface``,
#: under the name ``set_attn_implementation`` looks for in a model's source).
ALL_ATTENTION_FUNCTIONS = AttentionInterface()
ALL_ATTENTION_FUNCTIONS["sdpa"] = sdpa_or_eager_attention_forward


class VanillaTransformerAttention(nn.Module):
    """§3.2.2 multi-head attention: MultiHead(Q, K, V) = Concat(head_1, …, head_h) W^O with
    head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V); the h per-head projections are stored as one
    (D, D) matrix each (``q_proj``, ``k_proj``, ``v_proj``) and W^O is ``out_proj``.

    Used three ways (§3.2.3): encoder self-attention, masked decoder self-attention (``is_causal``)
    and encoder-decoder attention, where queries come from the decoder and keys and values from the
    output of the last encoder layer (``key_value_states``), each through its own projection.
    """

    def __init__(
        self,
        config: VanillaTransformerConfig,
        num_heads: int,
        is_causal: bool = False,
        layer_idx: int | None = None,
    ) -> None:
        super().__init__()
        self.config = config
        self.num_heads = num_heads
        self.head_dim = config.d_model // num_heads
        self.scaling = self.head_dim**-0.5  # 1 / √d_k
        self.is_causal = is_causal
        self.layer_idx = layer_idx
        self.dropout = config.attention_dropout
        bias = config.attention_bias
        self.q_proj = nn.Linear(config.d_model, config.d_model, bias=bias)
        self.k_proj = nn.Linear(config.d_model, config.d_model, bias=bias)
        self.v_proj = nn.Linear(config.d_model, config.d_model, bias=bias)
        self.out_proj = nn.Linear(config.d_model, config.d_model, bias=bias)

    def forward(
        self,
        hidden_states: torch.Tensor,
        key_value_states: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        cache: EncoderDecoderCache | None = None,
        **kwargs: object,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Eq. (1) for each head, softmax(Q K_iᵀ / √d_k) V_i, then Concat · W^O: hidden_states (B, T, D) →
        (B, T, D), and the (B, H, T, K) weights when the kernel returns them (``output_attentions=True``).
        key_value_states (B, S, D) for cross-attention, or (B / k, S, D) for k hypotheses per sentence:
        their k·T queries attend to the sentence's keys together (K/V projected and cached once).
        """
        batch, length, _ = hidden_states.shape
        query = self.q_proj(hidden_states)  # Q W^Q for all heads: (B, T, D)
        is_cross = key_value_states is not None
        key, value = self._keys_and_values(key_value_states if is_cross else hidden_states, is_cross, cache)
        groups = batch // key.shape[0]  # hypotheses per sentence; 1 except in grouped cross-attention
        query = query.view(batch // groups, groups * length, self.num_heads, self.head_dim).transpose(1, 2)
        attention_interface: Callable = ALL_ATTENTION_FUNCTIONS.get_interface(
            self.config._attn_implementation, eager_attention_forward
        )
        if isinstance(attention_mask, torch.Tensor) and attention_mask.device != query.device:  # pipelines
            attention_mask = attention_mask.to(query.device)
        output, weights = attention_interface(  # Eq. (1) for each head: (B / k, k·T, H, Dh)
            self,
            query,
            key,
            value,
            attention_mask,
            dropout=self.dropout if self.training else 0.0,
            scaling=self.scaling,
            **kwargs,
        )
        output = output.reshape(batch, length, -1)  # Concat(head_1, …, head_h): (B, T, D)
        if weights is not None and groups > 1:  # (B/k, H, k·T, K) → (B, H, T, K)
            weights = weights.unflatten(2, (groups, length)).transpose(1, 2).flatten(0, 1)
        return self.out_proj(output), weights  # · W^O

    def _keys_and_values(
        self, source: torch.Tensor, is_cross: bool, cache: EncoderDecoderCache | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """K W^K and V W^V for all heads, (B, K, D) → (B, H, K, Dh), with the cache: the decoder's self-attention
        appends this step's keys and values (``cache.update``); cross-attention projects the encoder
        output once, at the first step, and reads it back afterwards."""
        if is_cross and cache is not None and cache.is_updated.get(self.layer_idx):
            layer_cache = cache.cross_attention_cache.layers[self.layer_idx]
            return layer_cache.keys, layer_cache.values
        kv_shape = (source.shape[0], source.shape[1], self.num_heads, self.head_dim)
        key = self.k_proj(source).view(kv_shape).transpose(1, 2)  # (B, H, K, Dh)
        value = self.v_proj(source).view(kv_shape).transpose(1, 2)
        if cache is not None and is_cross:
            cache.is_updated[self.layer_idx] = True
            return cache.cross_attention_cache.update(key, value, self.layer_idx)
        if cache is not None:
            return cache.self_attention_cache.update(key, value, self.layer_idx)
        return key, value


# --------------------------------------------------------------------------------------------------
# §3.3 Position-wise feed-forward network, §3.1 encoder and decoder layers
# --------------------------------------------------------------------------------------------------
class _PostLNSublayers(GradientCheckpointingLayer):
    """What the encoder and decoder layers share: the residual connection around each sub-layer with
    post-LN, and the §3.3 feed-forward network."""

    dropout: nn.Dropout
    activation_dropout: nn.Dropout

    def _add_and_norm(
        self, residual: torch.Tensor, sublayer_output: torch.Tensor, norm: nn.LayerNorm
    ) -> torch.Tensor:
        """§3.1 and §5.4: LayerNorm(x + Dropout(Sublayer(x))), the normalisation after the add."""
        return norm(residual + self.dropout(sublayer_output))

    def _ff_block(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """§3.3 Eq. (2): FFN(x) = max(0, x W_1 + b_1) W_2 + b_2 (``fc1``, ``fc2``), (…, D) → (…, D)
        through (…, F). ``activation_dropout`` (0 in the paper) is for imported checkpoints."""
        hidden_states = self.activation_fn(self.fc1(hidden_states))  # (…, F)
        hidden_states = self.activation_dropout(hidden_states)
        return self.fc2(hidden_states)


class VanillaTransformerEncoderLayer(_PostLNSublayers):
    """§3.1 encoder layer: x = LayerNorm(x + Dropout(SelfAttention(x))); then
    x = LayerNorm(x + Dropout(FFN(x))). Post-LN as in the paper."""

    def __init__(self, config: VanillaTransformerConfig) -> None:
        super().__init__()
        self.self_attn = VanillaTransformerAttention(config, config.encoder_attention_heads)
        self.self_attn_layer_norm = nn.LayerNorm(config.d_model)
        self.fc1 = nn.Linear(config.d_model, config.encoder_ffn_dim)
        self.fc2 = nn.Linear(config.encoder_ffn_dim, config.d_model)
        self.final_layer_norm = nn.LayerNorm(config.d_model)
        self.activation_fn = ACT2FN[config.activation_function]
        self.dropout = nn.Dropout(config.dropout)
        self.activation_dropout = nn.Dropout(config.activation_dropout)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        **kwargs: object,
    ) -> tuple[torch.Tensor]:
        """(B, S, D) → (B, S, D), in a tuple as transformers' layers return it."""
        attended, _ = self.self_attn(hidden_states, attention_mask=attention_mask, **kwargs)
        hidden_states = self._add_and_norm(hidden_states, attended, self.self_attn_layer_norm)
        hidden_states = self._add_and_norm(
            hidden_states, self._ff_block(hidden_states), self.final_layer_norm
        )
        return (hidden_states,)


class VanillaTransformerDecoderLayer(_PostLNSublayers):
    """§3.1 decoder layer: masked self-attention, encoder-decoder attention and the FFN, each
    followed by Dropout, the residual add and LayerNorm (post-LN)."""

    def __init__(self, config: VanillaTransformerConfig, layer_idx: int) -> None:
        super().__init__()
        heads = config.decoder_attention_heads
        self.self_attn = VanillaTransformerAttention(config, heads, is_causal=True, layer_idx=layer_idx)
        self.self_attn_layer_norm = nn.LayerNorm(config.d_model)
        self.encoder_attn = VanillaTransformerAttention(config, heads, layer_idx=layer_idx)
        self.encoder_attn_layer_norm = nn.LayerNorm(config.d_model)
        self.fc1 = nn.Linear(config.d_model, config.decoder_ffn_dim)
        self.fc2 = nn.Linear(config.decoder_ffn_dim, config.d_model)
        self.final_layer_norm = nn.LayerNorm(config.d_model)
        self.activation_fn = ACT2FN[config.activation_function]
        self.dropout = nn.Dropout(config.dropout)
        self.activation_dropout = nn.Dropout(config.activation_dropout)

    def forward(
        self,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        cache: EncoderDecoderCache | None = None,
        **kwargs: object,
    ) -> tuple[torch.Tensor]:
        """(B, T, D) and encoder output (B, S, D) → (B, T, D), in a tuple."""
        attended, _ = self.self_attn(hidden_states, attention_mask=attention_mask, cache=cache, **kwargs)
        hidden_states = self._add_and_norm(hidden_states, attended, self.self_attn_layer_norm)
        attended, _ = self.encoder_attn(
            hidden_states,
            key_value_states=encoder_hidden_states,
            attention_mask=encoder_attention_mask,
            cache=cache,
            **kwargs,
        )
        hidden_states = self._add_and_norm(hidden_states, attended, self.encoder_attn_layer_norm)
        hidden_states = self._add_and_norm(
            hidden_states, self._ff_block(hidden_states), self.final_layer_norm
        )
        return (hidden_states,)


# --------------------------------------------------------------------------------------------------
# The pre-trained model base: initialisation (deviation 1) and HF capabilities
# --------------------------------------------------------------------------------------------------
class VanillaTransformerPreTrainedModel(VanillaTransformerSavingMixin, PreTrainedModel):
    """Weight initialisation and the capabilities declared to transformers."""

    config_class = VanillaTransformerConfig
    config: VanillaTransformerConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"
    supports_gradient_checkpointing = True
    _no_split_modules = ["VanillaTransformerEncoderLayer", "VanillaTransformerDecoderLayer"]
    _supports_sdpa = True  # as MarianMTModel: every kernel masking_utils builds masks for
    _supports_flash_attn = True
    _supports_flex_attn = True
    _can_compile_fullgraph = True  # a static cache and torch.compile(fullgraph=True) decoding

    def _init_weights(self, module: nn.Module) -> None:
        """Deviation 1: N(0, d_model^-0.5) embeddings (and untied output projection), Xavier-uniform
        linear layers with zero bias, LayerNorm γ = 1, β = 0."""
        std = self.config.init_std if self.config.init_std is not None else self.config.d_model**-0.5
        if isinstance(module, nn.Embedding) or module is getattr(self, "lm_head", None):
            init.normal_(module.weight, mean=0.0, std=std)
            padding_idx = getattr(module, "padding_idx", None)
            if padding_idx is not None and not getattr(module.weight, "_is_hf_initialized", False):
                init.zeros_(module.weight[padding_idx])
        elif isinstance(module, nn.Linear):
            init.xavier_uniform_(module.weight)
            if module.bias is not None:
                init.zeros_(module.bias)
        elif isinstance(module, nn.LayerNorm):
            init.ones_(module.weight)
            init.zeros_(module.bias)
        else:  # any other module type transformers initialises (this model has none today)
            super()._init_weights(module)
        if isinstance(getattr(module, "final_logits_bias", None), torch.Tensor):
            init.zeros_(module.final_logits_bias)  # deviation 6 (Marian's bias), zero unless loaded


# --------------------------------------------------------------------------------------------------
# §3.1 The encoder and decoder stacks, §3.4 embeddings
# --------------------------------------------------------------------------------------------------
class VanillaTransformerEncoder(VanillaTransformerPreTrainedModel):
    """§3.1 encoder: N identical layers over Dropout(√d_model · Embedding(x) + PE) (§3.4, §3.5, §5.4).
    There is no final LayerNorm: the last layer's post-LN output is the encoder output. Hidden states
    (the embedding output first) and attention weights are recorded by ``_can_record_outputs``."""

    _can_record_outputs = {
        "hidden_states": VanillaTransformerEncoderLayer,
        "attentions": VanillaTransformerAttention,
    }

    def __init__(self, config: VanillaTransformerConfig, embed_tokens: nn.Embedding) -> None:
        super().__init__(config)
        self.embed_tokens = embed_tokens
        # CODEPATH: the paper's model (§3.4), FSMT and some OPUS-MT models scale by √d_model; most OPUS-MT models do not.
        self.embed_scale = math.sqrt(config.d_model) if config.scale_embedding else 1.0
        self.embed_positions = VanillaTransformerPositionalEncoding.from_config(config)
        self.layers = nn.ModuleList(
            [VanillaTransformerEncoderLayer(config) for _ in range(config.encoder_layers)]
        )
        self.dropout = nn.Dropout(config.dropout)
        self.post_init()

    @capture_outputs
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        **kwargs: object,
    ) -> BaseModelOutput:
        """input_ids (B, S) → last_hidden_state (B, S, D); ``hidden_states[0]`` is the embedding output."""
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("Give exactly one of `input_ids` or `inputs_embeds` to the encoder.")
        if input_ids is not None:
            check_token_ids(input_ids, self.embed_tokens.num_embeddings, "input_ids")
            inputs_embeds = self.embed_tokens(input_ids)
        hidden_states = inputs_embeds * self.embed_scale  # (B, S, D)
        hidden_states = hidden_states + self.embed_positions(
            hidden_states.shape[1], 0, hidden_states.device, hidden_states.dtype
        )
        hidden_states = self.dropout(hidden_states)
        mask = create_bidirectional_mask(self.config, hidden_states, attention_mask)  # §3.2.3: padding
        kwargs.setdefault("output_attentions", self.config.output_attentions)  # read by the kernel
        for layer in self.layers:
            (hidden_states,) = layer(hidden_states, mask, **kwargs)
        return BaseModelOutput(last_hidden_state=hidden_states)


class VanillaTransformerDecoder(VanillaTransformerPreTrainedModel):
    """§3.1 decoder: N identical layers over Dropout(√d_model · Embedding(y) + PE), with the
    self-attention masked so that position i sees only positions ≤ i. No final LayerNorm. Hidden states
    and self- and cross-attention weights are recorded by ``_can_record_outputs``."""

    _can_record_outputs = {
        "hidden_states": VanillaTransformerDecoderLayer,
        "attentions": OutputRecorder(VanillaTransformerAttention, index=1, layer_name="self_attn"),
        "cross_attentions": OutputRecorder(VanillaTransformerAttention, index=1, layer_name="encoder_attn"),
    }

    def __init__(self, config: VanillaTransformerConfig, embed_tokens: nn.Embedding) -> None:
        super().__init__(config)
        self.embed_tokens = embed_tokens
        # CODEPATH: the paper's model (§3.4), FSMT and some OPUS-MT models scale by √d_model; most OPUS-MT models do not.
        self.embed_scale = math.sqrt(config.d_model) if config.scale_embedding else 1.0
        self.embed_positions = VanillaTransformerPositionalEncoding.from_config(config)
        self.layers = nn.ModuleList(
            [VanillaTransformerDecoderLayer(config, layer_idx=i) for i in range(config.decoder_layers)]
        )
        self.dropout = nn.Dropout(config.dropout)
        self.post_init()

    @capture_outputs
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        encoder_hidden_states: torch.Tensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        cache: EncoderDecoderCache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        **kwargs: object,
    ) -> BaseModelOutputWithPastAndCrossAttentions:
        """input_ids (B, T) and encoder output (B, S, D) → last_hidden_state (B, T, D)."""
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError(
                "Give exactly one of `decoder_input_ids` or `decoder_inputs_embeds` to the decoder."
            )
        if encoder_hidden_states is None:
            raise ValueError("The decoder needs `encoder_hidden_states` (the output of the encoder).")
        if use_cache and cache is None:
            cache = EncoderDecoderCache(DynamicCache(config=self.config), DynamicCache(config=self.config))
        # P: an int for a growing cache, a 0-d tensor for a static one
        past_length = cache.get_seq_length() if cache is not None else 0
        if input_ids is not None:
            if cache is None or cache.self_attention_cache.is_compileable or past_length == 0:
                # generated ids come from the model's own vocabulary; the check skips them
                check_token_ids(input_ids, self.embed_tokens.num_embeddings, "decoder_input_ids")
            inputs_embeds = self.embed_tokens(input_ids)
        hidden_states = inputs_embeds * self.embed_scale  # (B, T, D)
        length = hidden_states.shape[1]
        hidden_states = hidden_states + self.embed_positions(
            length, past_length, hidden_states.device, hidden_states.dtype
        )
        hidden_states = self.dropout(hidden_states)

        kwargs.setdefault("output_attentions", self.config.output_attentions)  # read by the kernel
        self_mask = create_causal_mask(  # §3.2.3: "masking out ... illegal connections", and padding
            self.config,
            hidden_states,
            attention_mask,
            cache.self_attention_cache if cache is not None else None,
            allow_is_causal_skip=not kwargs["output_attentions"],  # the eager kernel needs its mask
        )
        groups = hidden_states.shape[0] // encoder_hidden_states.shape[0]
        if hidden_states.shape[0] != groups * encoder_hidden_states.shape[0]:
            raise ValueError(
                f"The decoder batch ({hidden_states.shape[0]} rows) must be the encoder batch "
                f"({encoder_hidden_states.shape[0]} rows) or a multiple of it (k hypotheses per sentence, "
                "consecutive rows); repeat the encoder output with `repeat_interleave` to match."
            )
        if (
            encoder_attention_mask is not None
            and encoder_attention_mask.shape[0] != encoder_hidden_states.shape[0]
        ):
            encoder_attention_mask = encoder_attention_mask[::groups]  # one row per sentence
        cross_mask = create_bidirectional_mask(  # the k·T queries of a sentence share its mask row
            self.config,
            hidden_states.view(encoder_hidden_states.shape[0], groups * length, -1),
            encoder_attention_mask,
            encoder_hidden_states=encoder_hidden_states,
        )

        for layer in self.layers:
            (hidden_states,) = layer(
                hidden_states,
                encoder_hidden_states,
                attention_mask=self_mask,
                encoder_attention_mask=cross_mask,
                cache=cache,
                **kwargs,
            )
        return BaseModelOutputWithPastAndCrossAttentions(
            last_hidden_state=hidden_states, cache=cache if use_cache else None
        )


# --------------------------------------------------------------------------------------------------
# The bare encoder-decoder of Figure 1
# --------------------------------------------------------------------------------------------------
class VanillaTransformerModel(VanillaTransformerPreTrainedModel):
    """The encoder-decoder of Figure 1 without the output projection; one embedding matrix
    (``shared``) serves source and target (§3.4). With ``share_encoder_decoder_embeddings=False``
    (deviation 6) ``shared`` is the source embedding and the decoder has its own."""

    _tied_weights_keys = {
        "encoder.embed_tokens.weight": "shared.weight",
        "decoder.embed_tokens.weight": "shared.weight",
    }

    def __init__(self, config: VanillaTransformerConfig) -> None:
        super().__init__(config)
        self.shared = nn.Embedding(config.vocab_size, config.d_model, padding_idx=config.pad_token_id)
        target_embeddings = self.shared
        # CODEPATH: the paper's model and OPUS-MT models with one vocabulary share one embedding matrix; FSMT and OPUS-MT models with two vocabularies do not.
        if not config.share_encoder_decoder_embeddings:
            target_embeddings = nn.Embedding(
                config.target_vocab_size, config.d_model, padding_idx=config.pad_token_id
            )
            self._tied_weights_keys = {"encoder.embed_tokens.weight": "shared.weight"}
        self.encoder = VanillaTransformerEncoder(config, self.shared)
        self.decoder = VanillaTransformerDecoder(config, target_embeddings)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.shared

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.shared = value
        self.encoder.embed_tokens = value
        # CODEPATH: the paper's model and OPUS-MT models with one vocabulary share one embedding matrix; FSMT and OPUS-MT models with two vocabularies do not.
        if self.config.share_encoder_decoder_embeddings:
            self.decoder.embed_tokens = value

    def get_encoder(self, modality: str | None = None) -> VanillaTransformerEncoder:
        return self.encoder

    def get_decoder(self) -> VanillaTransformerDecoder:
        return self.decoder

    @can_return_tuple
    @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")  # as transformers' own models
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.Tensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        encoder_outputs: BaseModelOutput | tuple[torch.Tensor, ...] | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        decoder_inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        **kwargs: object,
    ) -> Seq2SeqModelOutput:
        """Source (B, S) and decoder inputs (B, T) → decoder output (B, T, D). Other keywords
        (``output_attentions``, ...) go on to the encoder and the decoder, as in ``MarianModel``."""
        if cache is not None and not isinstance(cache, EncoderDecoderCache):
            raise TypeError(
                f"`cache` must be an EncoderDecoderCache (self- and cross-attention), got {type(cache).__name__}."
            )
        use_cache = use_cache if use_cache is not None else self.config.use_cache
        if decoder_input_ids is None and decoder_inputs_embeds is None:
            raise ValueError(
                "Give `decoder_input_ids` (or `labels` to VanillaTransformerForConditionalGeneration, which "
                "shifts them right to build the decoder inputs)."
            )
        if encoder_outputs is None:
            encoder_outputs = self.encoder(
                input_ids=input_ids,
                attention_mask=attention_mask,
                inputs_embeds=inputs_embeds,
                **kwargs,
            )
        elif not isinstance(encoder_outputs, BaseModelOutput):
            encoder_outputs = BaseModelOutput(
                last_hidden_state=encoder_outputs[0],
                hidden_states=encoder_outputs[1] if len(encoder_outputs) > 1 else None,
                attentions=encoder_outputs[2] if len(encoder_outputs) > 2 else None,
            )
        decoder_outputs = self.decoder(
            input_ids=decoder_input_ids,
            attention_mask=decoder_attention_mask,
            encoder_hidden_states=encoder_outputs.last_hidden_state,
            encoder_attention_mask=attention_mask,
            cache=cache,
            inputs_embeds=decoder_inputs_embeds,
            use_cache=use_cache,
            **kwargs,
        )
        return Seq2SeqModelOutput(
            last_hidden_state=decoder_outputs.last_hidden_state,
            cache=decoder_outputs.cache,
            decoder_hidden_states=decoder_outputs.hidden_states,
            decoder_attentions=decoder_outputs.attentions,
            cross_attentions=decoder_outputs.cross_attentions,
            encoder_last_hidden_state=encoder_outputs.last_hidden_state,
            encoder_hidden_states=encoder_outputs.hidden_states,
            encoder_attentions=encoder_outputs.attentions,
        )


# --------------------------------------------------------------------------------------------------
# §3.4 The pre-softmax projection; §5.4 the loss (§6.1 decoding: generation_vanilla_transformer.py)
# --------------------------------------------------------------------------------------------------
def smoothed_cross_entropy_sum(logits: torch.Tensor, labels: torch.Tensor, smoothing: float) -> torch.Tensor:
    """§5.4 label-smoothed cross-entropy, summed over the target tokens whose label is not -100:
    per token (1 − ε)·(−log p(y)) + ε·(−Σ_v log p(v) / V), i.e. ε/V spread over the whole
    vocabulary. logits (…, V), labels (…) → a scalar, computed in at least fp32."""
    logits = logits.reshape(-1, logits.shape[-1])
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    return F.cross_entropy(
        logits, labels.reshape(-1), ignore_index=-100, reduction="sum", label_smoothing=smoothing
    )


class VanillaTransformerForConditionalGeneration(
    VanillaTransformerVocabularyMixin,
    VanillaTransformerPreTrainedModel,
    VanillaTransformerGenerationMixin,
    GenerationMixin,
):
    """The full model of Figure 1: encoder-decoder plus the pre-softmax linear projection, which
    shares its weight with the embeddings (§3.4), and the training loss (§5.4 label smoothing)."""

    _tied_weights_keys = {"lm_head.weight": "model.shared.weight"}

    def __init__(self, config: VanillaTransformerConfig) -> None:
        super().__init__(config)
        self.model = VanillaTransformerModel(config)
        self.lm_head = nn.Linear(config.d_model, config.target_vocab_size, bias=False)
        # CODEPATH: the paper's model and OPUS-MT models with one vocabulary share one embedding matrix; FSMT and OPUS-MT models with two vocabularies do not.
        if not config.share_encoder_decoder_embeddings:  # deviation 6: tie to the target embedding
            self._tied_weights_keys = {"lm_head.weight": "model.decoder.embed_tokens.weight"}
        # CODEPATH: OPUS-MT (Marian) models carry a fixed logits bias; the paper's model and FSMT do not.
        if config.final_logits_bias:  # deviation 6 (Marian): a fixed bias on the logits
            self.final_logits_bias = nn.Buffer(torch.zeros(1, config.target_vocab_size))
        self.post_init()
        self._set_paper_generation_defaults()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.model.shared

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.model.set_input_embeddings(value)

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def set_output_embeddings(self, new_embeddings: nn.Linear) -> None:
        self.lm_head = new_embeddings

    def get_encoder(self, modality: str | None = None) -> VanillaTransformerEncoder:
        return self.model.encoder

    def get_decoder(self) -> VanillaTransformerDecoder:
        return self.model.decoder

    def prepare_decoder_input_ids_from_labels(self, labels: torch.Tensor) -> torch.Tensor:
        """Used by ``DataCollatorForSeq2Seq``: teacher-forcing inputs from padded labels."""
        return shift_tokens_right(labels, self.config.pad_token_id, self.config.decoder_start_token_id)

    @can_return_tuple
    @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")  # as transformers' own models
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.Tensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        encoder_outputs: BaseModelOutput | tuple[torch.Tensor, ...] | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        decoder_inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        use_cache: bool | None = None,
        num_items_in_batch: int | torch.Tensor | None = None,
        **kwargs: object,
    ) -> Seq2SeqLMOutput:
        """Logits (B, T, V) over the shared vocabulary; with ``labels`` (B, T) also the loss.

        ``labels`` (-100 = ignored) are shifted right into the decoder inputs, not shifted again for the
        loss: the summed (label-smoothed) token cross-entropies divided by ``num_items_in_batch`` when the
        Trainer passes it, else by this batch's label count. ``past_key_values`` (the old name of
        ``cache``) still works, with transformers' deprecation warning.
        """
        if labels is not None:
            if readable(labels):
                check_labels(labels, self.config.target_vocab_size)
            use_cache = False
            if decoder_input_ids is None and decoder_inputs_embeds is None:
                decoder_input_ids = self.prepare_decoder_input_ids_from_labels(labels)
        outputs = self.model(
            input_ids,
            attention_mask=attention_mask,
            decoder_input_ids=decoder_input_ids,
            decoder_attention_mask=decoder_attention_mask,
            encoder_outputs=encoder_outputs,
            cache=cache,
            inputs_embeds=inputs_embeds,
            decoder_inputs_embeds=decoder_inputs_embeds,
            use_cache=use_cache,
            **kwargs,
        )
        hidden_states = outputs.last_hidden_state  # (B, T, D)
        if labels is not None:
            labels = labels.to(hidden_states.device)
        logits, total = self._logits_and_loss(hidden_states, labels)
        loss = None if total is None else self._per_token(total, labels, num_items_in_batch)
        return Seq2SeqLMOutput(
            loss=loss,
            logits=logits,
            cache=outputs.cache,
            decoder_hidden_states=outputs.decoder_hidden_states,
            decoder_attentions=outputs.decoder_attentions,
            cross_attentions=outputs.cross_attentions,
            encoder_last_hidden_state=outputs.encoder_last_hidden_state,
            encoder_hidden_states=outputs.encoder_hidden_states,
            encoder_attentions=outputs.encoder_attentions,
        )

    def _logits_and_loss(
        self, hidden_states: torch.Tensor, labels: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(B, T, V) logits of the decoder output (B, T, D), §3.4 the pre-softmax projection, and with
        ``labels`` the summed §5.4 loss (else None)."""
        logits = self.lm_head(hidden_states)
        # CODEPATH: OPUS-MT (Marian) models carry a fixed logits bias; the paper's model and FSMT do not.
        if self.config.final_logits_bias:
            logits = logits + self.final_logits_bias  # (1, V)
        if labels is None:
            return logits, None
        return logits, smoothed_cross_entropy_sum(logits, labels, self.config.label_smoothing)

    @staticmethod
    def _per_token(
        total: torch.Tensor, labels: torch.Tensor, num_items_in_batch: int | torch.Tensor | None
    ) -> torch.Tensor:
        """The summed loss divided by ``num_items_in_batch`` (counted by the Trainer over all
        accumulation steps and processes), or by this batch's label count."""
        if num_items_in_batch is None:
            num_items_in_batch = (labels != -100).sum().clamp(min=1)
        if isinstance(num_items_in_batch, torch.Tensor):
            num_items_in_batch = num_items_in_batch.to(total.device)
        return total / num_items_in_batch


__all__ = [
    "VanillaTransformerForConditionalGeneration",
    "VanillaTransformerModel",
    "VanillaTransformerPreTrainedModel",
]
