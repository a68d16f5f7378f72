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
"""Configuration of the original Transformer (Vaswani et al., 2017): defaults are the *base* model of Table 3.

Paper symbols → HF seq2seq names: N → ``encoder_layers``/``decoder_layers`` (6); d_model → ``d_model`` (512);
h → ``*_attention_heads`` (8; d_k = d_v = d_model / h, §3.2.2); d_ff → ``*_ffn_dim`` (2048, ReLU, §3.3);
P_drop → ``dropout`` (0.1, §5.4); ε_ls → ``label_smoothing`` (0 here; the recipe sets 0.1). Embeddings × √d_model,
one shared matrix (§3.4), sinusoidal PE (§3.5). Types and choices: transformers' ``@strict`` validation.
"""

import copy
import re
from typing import Any, Literal, get_args

import transformers
from huggingface_hub.dataclasses import strict
from transformers import PretrainedConfig

#: The transformers releases this code runs on, as pip writes a requirement (pyproject.toml states the same;
#: hf_vanilla checks it at import, and a model folder's code at its first import). The floor is 5.24: that
#: release renamed the models' ``past_key_values`` argument and output field to ``cache``, which the model
#: and its decoding use throughout. Earlier releases load a folder, then fail in every ``generate()`` (5.18
#: to 5.23), or fail to load it (5.0); supporting them would mean both names in every cache read and write.
TRANSFORMERS_REQUIREMENT = ">=5.24,<6"


def check_transformers_version(version: str) -> None:
    """Raise an ``ImportError`` of one line naming the supported releases and the fix when ``version`` (a
    transformers release, e.g. ``"5.25.0"`` or ``"5.26.0.dev0"``) is outside :data:`TRANSFORMERS_REQUIREMENT`."""
    floor_major, floor_minor, below_major = map(int, re.findall(r"\d+", TRANSFORMERS_REQUIREMENT))
    release = tuple(map(int, re.findall(r"\d+", version)[:2]))
    if not (floor_major, floor_minor) <= release < (below_major,):
        raise ImportError(
            f"This model code runs on transformers{TRANSFORMERS_REQUIREMENT}, found transformers {version}: "
            f'pip install "transformers{TRANSFORMERS_REQUIREMENT}"'
        )


check_transformers_version(transformers.__version__)  # before the config class, which older releases refuse

Activation = Literal["relu", "gelu", "gelu_new", "swish", "silu"]
#: The feed-forward activations the model supports; the paper's is ``"relu"`` (§3.3).
ACTIVATIONS: tuple[str, ...] = get_args(Activation)

#: Named presets from Table 3 of the paper. ``base`` is also the default of the config class.
PRESETS: dict[str, dict[str, Any]] = {
    "base": {"d_model": 512, "encoder_layers": 6, "decoder_layers": 6, "encoder_attention_heads": 8,
             "decoder_attention_heads": 8, "encoder_ffn_dim": 2048, "decoder_ffn_dim": 2048, "dropout": 0.1},
    "big": {"d_model": 1024, "encoder_layers": 6, "decoder_layers": 6, "encoder_attention_heads": 16,
            "decoder_attention_heads": 16, "encoder_ffn_dim": 4096, "decoder_ffn_dim": 4096, "dropout": 0.3},
}  # fmt: skip
#: Field → (what a valid value is, the test): checked by `validate_architecture`, one error naming the field.
_RANGES: dict[str, tuple[str, Any]] = {
    **dict.fromkeys(
        ("vocab_size", "max_position_embeddings", *(k for k in PRESETS["base"] if k != "dropout")),
        ("a positive integer", lambda v: v > 0),
    ),
    **dict.fromkeys(
        ("dropout", "attention_dropout", "activation_dropout", "label_smoothing"),
        ("a probability in [0, 1)", lambda v: 0 <= v < 1),
    ),
    "init_std": ("a positive number or None", lambda v: v is None or v > 0),
    "position_offset": ("a non-negative integer (0 in the paper)", lambda v: v >= 0),
    "decoder_vocab_size": ("a positive integer or None", lambda v: v is None or v > 0),
}


@strict
class VanillaTransformerConfig(PretrainedConfig):
    r"""Config of [`VanillaTransformerModel`] and [`VanillaTransformerForConditionalGeneration`]: the comments beside
    the fields say what each is; the options for imported checkpoints are off by default (each a deviation)."""

    model_type = "vanilla_transformer"
    keys_to_ignore_at_inference = ["past_key_values", "cache"]
    attribute_map = {
        "hidden_size": "d_model",
        "num_attention_heads": "encoder_attention_heads",
        "num_hidden_layers": "encoder_layers",
    }
    #: Tasks hf_vanilla registered (set on import): dropped from custom_pipelines, so no trust_remote_code is needed.
    registered_pipelines = ()

    # The paper's model (Table 3, base)
    vocab_size: int = 37000
    d_model: int = 512
    encoder_layers: int = 6
    decoder_layers: int = 6
    encoder_attention_heads: int = 8
    decoder_attention_heads: int = 8
    encoder_ffn_dim: int = 2048
    decoder_ffn_dim: int = 2048
    activation_function: Activation = "relu"  # §3.3: ReLU
    dropout: float | int = 0.1
    attention_dropout: float | int = 0.0  # on attention probabilities: none in the paper
    activation_dropout: float | int = 0.0  # inside the FFN: none in the paper
    max_position_embeddings: int = 1024  # the longest input meant; PE is computed for any length (§3.5)
    scale_embedding: bool = True
    attention_bias: bool = False  # W^Q, W^K, W^V, W^O have no bias (§3.2.2); fairseq and Marian have
    label_smoothing: float | int = 0.0
    init_std: float | int | None = None  # embeddings' normal init; None: d_model^-0.5 (modeling file)
    tie_word_embeddings: bool = True
    pad_token_id: int | None = 0
    bos_token_id: int | None = 1
    eos_token_id: int | list[int] | None = 2
    decoder_start_token_id: int | None = None  # None: bos (decoding starts from <s>)
    use_cache: bool = True
    is_encoder_decoder: bool = True

    # Options for imported checkpoints, all off by default (deviation 6 of the modeling file)
    position_encoding_layout: Literal["interleaved", "halves"] = "interleaved"  # §3.5; halves: t2t, Marian
    position_encoding_timescales: Literal["paper", "tensor2tensor"] = "paper"  # t2t: 10000^(-i/(D/2-1))
    position_offset: int = 0  # position of the first token; fairseq: pad_token_id + 1
    final_logits_bias: bool = False  # Marian's (1, V) logits bias buffer
    share_encoder_decoder_embeddings: bool = True  # §3.4; False: separate source/target vocabularies
    decoder_vocab_size: int | None = None  # target size when not shared (vocab_size is then the source's)

    def __post_init__(self, **kwargs: Any) -> None:
        # One shared vocabulary has one size: keep it in `vocab_size` only (resizing updates that field).
        if self.share_encoder_decoder_embeddings and self.decoder_vocab_size == self.vocab_size:
            self.decoder_vocab_size = None
        if self.decoder_start_token_id is None:
            self.decoder_start_token_id = self.bos_token_id
        custom = kwargs.pop("custom_pipelines", None) or {}  # save_pretrained writes the entries again
        if kept := {task: entry for task, entry in custom.items() if task not in self.registered_pipelines}:
            kwargs["custom_pipelines"] = kept
        super().__post_init__(**kwargs)
        self.validate_architecture()  # a ValueError here; @strict runs it again (wrapped) on validate()

    @classmethod
    def from_preset(cls, name: str, **overrides: Any) -> "VanillaTransformerConfig":
        """Build the ``"base"`` or ``"big"`` model of Table 3; keyword arguments override fields."""
        if name not in PRESETS:
            raise ValueError(f"Unknown preset {name!r}: choose one of {sorted(PRESETS)}.")
        return cls(**{**PRESETS[name], **overrides})

    @property
    def target_vocab_size(self) -> int:
        """Size of the target vocabulary: the decoder embedding and the pre-softmax projection."""
        return self.vocab_size if self.decoder_vocab_size is None else self.decoder_vocab_size

    def get_text_config(self, decoder: bool | None = None, encoder: bool | None = None) -> PretrainedConfig:
        """transformers' per-side view, with the target vocabulary size on the decoder side (flattening renames
        ``decoder_*`` to plain names, so it is given the target size to rename into ``vocab_size``)."""
        if not decoder or encoder:
            return super().get_text_config(decoder=decoder, encoder=encoder)
        source = copy.deepcopy(self)
        source.decoder_vocab_size = self.target_vocab_size
        text_config = PretrainedConfig.get_text_config(source, decoder=True)
        text_config.decoder_vocab_size = None  # "the same as vocab_size", so that it can be flattened again
        return text_config

    def validate_architecture(self) -> None:
        """Raise a ``ValueError`` naming the field and the fix for a size, rate or id the model cannot take (an
        out-of-vocabulary special id raises where transformers only warns: it breaks the embedding)."""
        for name, (valid, check) in _RANGES.items():
            if not check(getattr(self, name)):
                raise ValueError(f"`{name}` must be {valid}, got {getattr(self, name)!r}.")
        for name in ("encoder_attention_heads", "decoder_attention_heads"):
            if self.d_model % (heads := getattr(self, name)):
                fit = max(h for h in range(1, heads + 1) if self.d_model % h == 0)
                raise ValueError(
                    f"`d_model` ({self.d_model}) must be divisible by `{name}` ({heads}): each head gets d_k = d_model / h dimensions. Choose e.g. {name}={fit}."
                )
        if self.d_model % 2 or (self.position_encoding_timescales == "tensor2tensor" and self.d_model < 4):
            raise ValueError(
                f"`d_model` must be even (≥ 4 with tensor2tensor timescales) for the sin/cos positional encoding (§3.5), got {self.d_model}."
            )
        if self.decoder_vocab_size is not None and self.share_encoder_decoder_embeddings:
            raise ValueError(
                f"`decoder_vocab_size` ({self.decoder_vocab_size}) differs from `vocab_size` ({self.vocab_size}), but one shared embedding (`share_encoder_decoder_embeddings=True`, §3.4) needs one vocabulary: set `share_encoder_decoder_embeddings=False` for separate source and target vocabularies."
            )
        pad_limit = min(self.vocab_size, self.target_vocab_size)  # padding occurs on both sides
        for name in ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id"):
            ids, limit = getattr(self, name), pad_limit if name == "pad_token_id" else self.target_vocab_size
            if any(not 0 <= i < limit for i in (ids if isinstance(ids, list) else [ids]) if i is not None):
                raise ValueError(f"`{name}` = {ids!r} lies outside the vocabulary [0, {limit}): set it to an id of your tokenizer's special token, or raise `vocab_size`.")  # fmt: skip
