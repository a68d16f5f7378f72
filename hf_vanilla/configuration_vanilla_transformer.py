"""Configuration of the original Transformer (Vaswani et al., 2017, "Attention Is All You Need").

Defaults are the paper's *base* model (Table 3, row "base"): N = 6 encoder and 6 decoder layers,
d_model = 512, h = 8 heads, d_ff = 2048, P_drop = 0.1, ReLU feed-forward (§3.3), embeddings scaled
by √d_model and one weight matrix shared by the source embedding, the target embedding and the
pre-softmax projection (§3.4), sinusoidal positional encodings (§3.5).

The paper's symbols map to the Hugging Face seq2seq field names as follows:

| paper     | field                                                      |
|-----------|------------------------------------------------------------|
| N         | ``encoder_layers``, ``decoder_layers``                     |
| d_model   | ``d_model`` (alias ``hidden_size``)                        |
| h         | ``encoder_attention_heads``, ``decoder_attention_heads``   |
| d_ff      | ``encoder_ffn_dim``, ``decoder_ffn_dim``                   |
| P_drop    | ``dropout``                                                |
| ε_ls      | ``label_smoothing`` (0.0 by default; the training recipe sets 0.1) |
"""

from __future__ import annotations

from typing import Any

from transformers import PretrainedConfig

_ACTIVATIONS = ("relu", "gelu", "gelu_new", "swish", "silu")
_POSITION_ENCODING_LAYOUTS = ("interleaved", "halves")
_POSITION_ENCODING_TIMESCALES = ("paper", "tensor2tensor")

#: Named presets from Table 3 of the paper. ``base`` is also the default of the config class.
PRESETS: dict[str, dict[str, Any]] = {
    "base": {
        "d_model": 512,
        "encoder_layers": 6,
        "decoder_layers": 6,
        "encoder_attention_heads": 8,
        "decoder_attention_heads": 8,
        "encoder_ffn_dim": 2048,
        "decoder_ffn_dim": 2048,
        "dropout": 0.1,
    },
    "big": {
        "d_model": 1024,
        "encoder_layers": 6,
        "decoder_layers": 6,
        "encoder_attention_heads": 16,
        "decoder_attention_heads": 16,
        "encoder_ffn_dim": 4096,
        "decoder_ffn_dim": 4096,
        "dropout": 0.3,
    },
}


class VanillaTransformerConfig(PretrainedConfig):
    r"""Configuration for [`VanillaTransformerModel`] and [`VanillaTransformerForConditionalGeneration`].

    Args:
        vocab_size: size of the shared source/target vocabulary (§3.4; the paper used 37,000 BPE
            tokens for English-German).
        d_model: model width d_model (§3.1).
        encoder_layers / decoder_layers: N, the number of stacked layers (§3.1).
        encoder_attention_heads / decoder_attention_heads: h, the number of heads (§3.2.2);
            d_k = d_v = d_model / h.
        encoder_ffn_dim / decoder_ffn_dim: d_ff, the inner width of the feed-forward network (§3.3).
        activation_function: activation of the feed-forward network; the paper's is ``"relu"``.
        dropout: P_drop, applied to every sub-layer output before the residual add and to the
            sums of embeddings and positional encodings (§5.4).
        attention_dropout: dropout on attention probabilities; 0.0 in the paper (not described).
        activation_dropout: dropout inside the feed-forward network; 0.0 in the paper.
        max_position_embeddings: the longest input the model is meant for. The model itself
            computes the encodings on the fly for any length (§3.5: the sinusoid "may allow the
            model to extrapolate"); the CTranslate2 export writes a table of this many positions.
        scale_embedding: multiply embeddings by √d_model (§3.4).
        attention_bias: add biases to the attention projections. The paper's W^Q, W^K, W^V, W^O have
            none (§3.2.2; so does tensor2tensor); fairseq and Marian checkpoints use them.
        label_smoothing: ε_ls of §5.4 used by the model's loss; 0.0 here, the training recipe
            sets the paper's 0.1.
        init_std: standard deviation of the normal initialisation of the embeddings; ``None``
            means d_model^-0.5 (so that √d_model-scaled embeddings have unit variance). Linear
            layers use Xavier-uniform, as in tensor2tensor and fairseq. See the modeling file.
        tie_word_embeddings: share the pre-softmax projection with the embeddings (§3.4).
        pad_token_id / bos_token_id / eos_token_id / decoder_start_token_id: special token ids;
            they must lie inside the vocabulary.
        use_cache: return the key/value cache for incremental decoding.

    Options for imported checkpoints (OPUS-MT/Marian, fairseq/FSMT; see ``hf_vanilla.convert``). Each
    is off by default, so the defaults stay the paper's model; each is a documented deviation:

        position_encoding_layout: ``"interleaved"`` (§3.5: sine on even, cosine on odd dimensions)
            or ``"halves"`` (sines in the first D/2 dimensions, cosines in the last D/2, as
            tensor2tensor, fairseq and Marian lay them out).
        position_encoding_timescales: ``"paper"`` (frequency ω_i = 10000^(-2i/d_model), §3.5) or
            ``"tensor2tensor"`` (ω_i = 10000^(-i/(d_model/2 - 1)), used by tensor2tensor and fairseq).
        position_offset: the position of the first token; 0 in the paper and Marian, ``pad_token_id
            + 1`` in fairseq (whose positions of right-padded inputs then coincide with these).
        final_logits_bias: add a (non-trained) bias buffer ``final_logits_bias`` of shape (1, V) to the
            logits, as Marian does; absent when off, so the paper's state dict is unchanged.
        share_encoder_decoder_embeddings: one vocabulary and embedding matrix for source and target
            (§3.4). ``False`` gives the decoder its own embedding (``decoder.embed_tokens``), as
            fairseq models with separate dictionaries have; a tied pre-softmax projection then shares
            the decoder embedding.
        decoder_vocab_size: the target vocabulary size when the embeddings are not shared (``None``:
            the same as ``vocab_size``). ``vocab_size`` is then the source vocabulary size. Either way
            ``get_text_config(decoder=True).vocab_size`` is the target size and
            ``get_text_config(encoder=True).vocab_size`` the source size, as for Marian.
    """

    model_type = "vanilla_transformer"
    keys_to_ignore_at_inference = ["past_key_values", "cache"]
    attribute_map = {
        "hidden_size": "d_model",
        "num_attention_heads": "encoder_attention_heads",
        "num_hidden_layers": "encoder_layers",
    }

    # The paper's model (Table 3, base)
    vocab_size: int = 37000
    d_model: int = 512
    encoder_layers: int = 6
    decoder_layers: int = 6
    encoder_attention_heads: int = 8
    decoder_attention_heads: int = 8
    encoder_ffn_dim: int = 2048
    decoder_ffn_dim: int = 2048
    activation_function: str = "relu"
    dropout: float | int = 0.1
    attention_dropout: float | int = 0.0
    activation_dropout: float | int = 0.0
    max_position_embeddings: int = 1024
    scale_embedding: bool = True
    attention_bias: bool = False
    label_smoothing: float | int = 0.0
    init_std: float | None = None
    tie_word_embeddings: bool = True
    pad_token_id: int | None = 0
    bos_token_id: int | None = 1
    eos_token_id: int | list[int] | None = 2
    decoder_start_token_id: int | None = None  # None: bos_token_id
    use_cache: bool = True
    is_encoder_decoder: bool = True

    # Options for imported checkpoints (OPUS-MT/Marian, fairseq/FSMT), all off by default (deviation 6)
    position_encoding_layout: str = "interleaved"
    position_encoding_timescales: str = "paper"
    position_offset: int = 0
    final_logits_bias: bool = False
    share_encoder_decoder_embeddings: bool = True
    decoder_vocab_size: int | None = None

    def __post_init__(self, **kwargs: Any) -> None:
        # One shared vocabulary has one size: keep it in `vocab_size` only (resizing updates that field).
        if self.share_encoder_decoder_embeddings and self.decoder_vocab_size == self.vocab_size:
            self.decoder_vocab_size = None
        # The paper starts decoding from a beginning-of-sentence symbol; default to bos.
        if self.decoder_start_token_id is None:
            self.decoder_start_token_id = self.bos_token_id
        super().__post_init__(**kwargs)
        self.validate_architecture()

    @classmethod
    def from_preset(cls, name: str, **overrides: Any) -> VanillaTransformerConfig:
        """Build the ``"base"`` or ``"big"`` model of Table 3; keyword arguments override fields."""
        if name not in PRESETS:
            raise ValueError(f"Unknown preset {name!r}: choose one of {sorted(PRESETS)}.")
        return cls(**{**PRESETS[name], **overrides})

    @property
    def target_vocab_size(self) -> int:
        """Size of the target vocabulary: the decoder embedding and the pre-softmax projection."""
        return self.vocab_size if self.decoder_vocab_size is None else self.decoder_vocab_size

    def get_text_config(self, decoder: bool | None = None, encoder: bool | None = None) -> PretrainedConfig:
        """``PretrainedConfig.get_text_config``, with the target vocabulary size on the decoder side.

        transformers flattens an encoder-decoder config for one side by renaming its ``decoder_*`` (or
        ``encoder_*``) fields to the plain names; ``decoder_vocab_size`` is ``None`` for one shared
        vocabulary, which would overwrite ``vocab_size`` with ``None``. Generation (cache construction,
        generation defaults, assisted decoding) reads the decoder side's ``vocab_size``, so it is set to
        :attr:`target_vocab_size` here — also right after ``resize_token_embeddings``, which updates
        ``vocab_size`` only. The decoder view keeps ``decoder_vocab_size = None`` ("the same as
        ``vocab_size``"), so that it can be flattened again (generation does).
        """
        text_config = super().get_text_config(decoder=decoder, encoder=encoder)
        if decoder and not encoder and text_config is not self:
            text_config.vocab_size = self.target_vocab_size
            text_config.decoder_vocab_size = None
        return text_config

    def validate_architecture(self) -> None:
        """Raise a ``ValueError`` naming the field and the fix for any invalid setting."""
        positive = (
            "vocab_size",
            "d_model",
            "encoder_layers",
            "decoder_layers",
            "encoder_attention_heads",
            "decoder_attention_heads",
            "encoder_ffn_dim",
            "decoder_ffn_dim",
            "max_position_embeddings",
        )
        for name in positive:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"`{name}` must be a positive integer, got {value!r}.")
        for name in ("encoder_attention_heads", "decoder_attention_heads"):
            heads = getattr(self, name)
            if self.d_model % heads:
                raise ValueError(
                    f"`d_model` ({self.d_model}) must be divisible by `{name}` ({heads}): each head gets "
                    f"d_k = d_model / h dimensions. Choose e.g. {name}="
                    f"{max(h for h in range(1, heads + 1) if self.d_model % h == 0)}."
                )
        if self.d_model % 2:
            raise ValueError(
                f"`d_model` must be even for the sin/cos positional encoding (§3.5), got {self.d_model}."
            )
        for name in ("dropout", "attention_dropout", "activation_dropout", "label_smoothing"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
                raise ValueError(f"`{name}` must be a probability in [0, 1), got {value!r}.")
        if self.activation_function not in _ACTIVATIONS:
            raise ValueError(
                f"Unknown `activation_function` {self.activation_function!r}: choose one of {_ACTIVATIONS} "
                "(the paper uses 'relu')."
            )
        if self.init_std is not None and not (isinstance(self.init_std, (int, float)) and self.init_std > 0):
            raise ValueError(f"`init_std` must be a positive number or None, got {self.init_std!r}.")
        self._validate_checkpoint_options()
        for name in ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id"):
            value = getattr(self, name, None)
            if value is None:
                continue
            # Padding occurs on both sides; the other special tokens are target (decoder) tokens.
            limit = (
                min(self.vocab_size, self.target_vocab_size)
                if name == "pad_token_id"
                else self.target_vocab_size
            )
            ids = value if isinstance(value, (list, tuple)) else [value]
            for token_id in ids:
                if not isinstance(token_id, int) or not 0 <= token_id < limit:
                    raise ValueError(
                        f"`{name}` = {value!r} lies outside the vocabulary [0, {limit}): set it to an "
                        "id of your tokenizer's special token, or raise `vocab_size`."
                    )

    def _validate_checkpoint_options(self) -> None:
        """Check the options that exist for imported checkpoints (see the class docstring)."""
        if self.position_encoding_layout not in _POSITION_ENCODING_LAYOUTS:
            raise ValueError(
                f"Unknown `position_encoding_layout` {self.position_encoding_layout!r}: choose one of "
                f"{_POSITION_ENCODING_LAYOUTS} (the paper's is 'interleaved')."
            )
        if self.position_encoding_timescales not in _POSITION_ENCODING_TIMESCALES:
            raise ValueError(
                f"Unknown `position_encoding_timescales` {self.position_encoding_timescales!r}: choose one of "
                f"{_POSITION_ENCODING_TIMESCALES} (the paper's is 'paper')."
            )
        if self.position_encoding_timescales == "tensor2tensor" and self.d_model < 4:
            raise ValueError("`position_encoding_timescales='tensor2tensor'` needs `d_model` >= 4.")
        offset = self.position_offset
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise ValueError(
                f"`position_offset` must be a non-negative integer (0 in the paper), got {offset!r}."
            )
        size = self.decoder_vocab_size
        if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size <= 0):
            raise ValueError(f"`decoder_vocab_size` must be a positive integer or None, got {size!r}.")
        if size is not None and self.share_encoder_decoder_embeddings:
            raise ValueError(
                f"`decoder_vocab_size` ({size}) differs from `vocab_size` ({self.vocab_size}), but one shared "
                "embedding (`share_encoder_decoder_embeddings=True`, §3.4) needs one vocabulary: set "
                "`share_encoder_decoder_embeddings=False` for separate source and target vocabularies."
            )
