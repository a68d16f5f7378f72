"""Export an hf_vanilla model folder to CTranslate2, a fast inference engine for this architecture.

CTranslate2 (optional dependency: ``pip install hf_vanilla[ct2]``) runs the post-LN encoder-decoder
of the paper natively; what it needs is a model specification filled with our weights. This module
builds it with CTranslate2's spec API (``ctranslate2.specs.TransformerSpec``, one
``TransformerEncoderSpec`` and one ``TransformerDecoderSpec`` with ``pre_norm=False``: §3.1's
``LayerNorm(x + Sublayer(x))``), the same way CTranslate2's own Marian/BART loaders do:

* attention (§3.2.2): W^Q, W^K, W^V fused into one projection for self-attention; W^Q alone and
  W^K, W^V fused for encoder-decoder attention; W^O as the output projection;
* feed-forward (§3.3): ``fc1``, ``fc2`` and the activation;
* embeddings (§3.4): the (shared) embedding matrices, the √d_model scaling flag, the pre-softmax
  projection (plus ``final_logits_bias`` when a converted Marian model has one);
* positional encoding (§3.5): the table of our closed form, written out explicitly, so every layout
  option (interleaved, halves, tensor2tensor timescales, offset) is exported exactly: the encoder's
  for ``max_position_embeddings`` positions (the longest input), the decoder's for that many plus
  the generation config's ``max_length_offset`` (50) and the start token, so that the longest input's
  longest translation (§6.1: input length + 50) fits. CTranslate2 cannot go past these tables (it
  raises "No position encodings are defined for positions >= ..."); ``hf_vanilla.inference.translation`` refuses
  a longer input with the same message for both backends.

CTranslate2 works on token strings, so the folder must hold the tokenizer: its vocabulary becomes the
model's source and target vocabularies, and the special tokens (``</s>``, ``<unk>``, the decoder start
token) are written to the CTranslate2 config. The tokenizer is saved into the exported folder too
(``model_max_length`` = ``max_position_embeddings``), so ``hf-vanilla-translate`` runs it alone. Feed
CTranslate2 the tokens the HF tokenizer produces (``tokenizer.convert_ids_to_tokens(tokenizer(text)
.input_ids)``), ``</s>`` included.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

import torch
from transformers import PreTrainedTokenizerBase

from hf_vanilla.data.tokenization import check_tokenizer_matches_config, load_tokenizer
from hf_vanilla.hub.folder import limit_tokenizer_length
from hf_vanilla.interop.options import ExportArguments, check_model_dir
from hf_vanilla.io.atomic import atomic_directory, refuse_to_replace
from hf_vanilla.io.checked_loading import load_pretrained_checked
from hf_vanilla.io.errors import CheckpointError
from hf_vanilla.io.manifest import CTRANSLATE2_ALIGNMENT, write_manifest
from hf_vanilla.models.vanilla_transformer.modeling_vanilla_transformer import (
    VanillaTransformerAttention,
    sinusoidal_position_encoding,
)
from hf_vanilla.speed.modeling import VanillaTransformerForConditionalGeneration

logger = logging.getLogger(__name__)

try:
    import ctranslate2
    from ctranslate2.converters import utils as ct2_utils
    from ctranslate2.converters.converter import Converter
    from ctranslate2.specs import TransformerDecoderSpec, TransformerEncoderSpec, TransformerSpec, common_spec
except ImportError:  # optional dependency: every entry point below says how to install it
    ctranslate2 = None
    Converter = object

_INSTALL_HINT = (
    "CTranslate2 is not installed: `pip install 'hf_vanilla[ct2]'` (or `pip install ctranslate2`)."
)


def _require_ctranslate2() -> None:
    if ctranslate2 is None:
        raise ImportError(_INSTALL_HINT)


def _activation(name: str) -> int:
    activations = {
        "relu": common_spec.Activation.RELU,
        "gelu": common_spec.Activation.GELU,
        "gelu_new": common_spec.Activation.GELUTanh,
        "swish": common_spec.Activation.SWISH,
        "silu": common_spec.Activation.SWISH,
    }
    return activations[name]


def _linear(spec: object, module: torch.nn.Linear) -> None:
    spec.weight = module.weight
    if module.bias is not None:
        spec.bias = module.bias


def _layer_norm(spec: object, module: torch.nn.LayerNorm) -> None:
    spec.gamma = module.weight
    spec.beta = module.bias


def _attention(spec: object, attention: VanillaTransformerAttention, self_attention: bool) -> None:
    """§3.2.2: self-attention has one fused QKV projection, encoder-decoder attention Q and fused KV."""
    projections = []
    for module in (attention.q_proj, attention.k_proj, attention.v_proj):
        projection = common_spec.LinearSpec()
        _linear(projection, module)
        projections.append(projection)
    if self_attention:
        ct2_utils.fuse_linear(spec.linear[0], projections)
    else:
        ct2_utils.fuse_linear(spec.linear[0], projections[:1])
        ct2_utils.fuse_linear(spec.linear[1], projections[1:])
    _linear(spec.linear[-1], attention.out_proj)


def decoder_positions(model: VanillaTransformerForConditionalGeneration) -> int:
    """Rows of the decoder's position table: the start token and the longest translation of the longest
    input, ``max_position_embeddings`` + the generation config's ``max_length_offset`` (§6.1: 50)."""
    offset = getattr(model.generation_config, "max_length_offset", None) or 0
    return model.config.max_position_embeddings + offset + 1


def _position_table(model: VanillaTransformerForConditionalGeneration, length: int) -> torch.Tensor:
    config = model.config
    offset = config.position_offset
    positions = torch.arange(offset, offset + length)
    return sinusoidal_position_encoding(
        positions,
        config.d_model,
        layout=config.position_encoding_layout,
        timescales=config.position_encoding_timescales,
    )  # (length, D)


def _stack(
    spec: object, stack: torch.nn.Module, model: VanillaTransformerForConditionalGeneration, positions: int
) -> None:
    """Embeddings, §3.4 scaling and §3.5 positions common to the encoder and decoder specs."""
    config = model.config
    spec.scale_embeddings = math.sqrt(config.d_model) if config.scale_embedding else 1.0
    spec.position_encodings.encodings = _position_table(model, positions)
    embeddings = spec.embeddings[0] if isinstance(spec.embeddings, list) else spec.embeddings
    embeddings.weight = stack.embed_tokens.weight


def transformer_spec(
    model: VanillaTransformerForConditionalGeneration,
    source_tokens: list[str],
    target_tokens: list[str],
    unk_token: str = "<unk>",
) -> object:
    """The ``ctranslate2.specs.TransformerSpec`` of ``model``, with vocabularies and special tokens."""
    _require_ctranslate2()
    config = model.config
    activation = _activation(config.activation_function)
    encoder = TransformerEncoderSpec(
        config.encoder_layers, config.encoder_attention_heads, pre_norm=False, activation=activation
    )
    decoder = TransformerDecoderSpec(
        config.decoder_layers,
        config.decoder_attention_heads,
        pre_norm=False,
        activation=activation,
        alignment_heads=config.decoder_attention_heads,  # return_attention: the last layer's, heads averaged
    )
    spec = TransformerSpec(encoder, decoder)

    _stack(spec.encoder, model.model.encoder, model, config.max_position_embeddings)
    for layer_spec, layer in zip(spec.encoder.layer, model.model.encoder.layers, strict=True):
        _attention(layer_spec.self_attention, layer.self_attn, self_attention=True)
        _layer_norm(layer_spec.self_attention.layer_norm, layer.self_attn_layer_norm)
        _linear(layer_spec.ffn.linear_0, layer.fc1)
        _linear(layer_spec.ffn.linear_1, layer.fc2)
        _layer_norm(layer_spec.ffn.layer_norm, layer.final_layer_norm)

    _stack(spec.decoder, model.model.decoder, model, decoder_positions(model))
    for layer_spec, layer in zip(spec.decoder.layer, model.model.decoder.layers, strict=True):
        _attention(layer_spec.self_attention, layer.self_attn, self_attention=True)
        _layer_norm(layer_spec.self_attention.layer_norm, layer.self_attn_layer_norm)
        _attention(layer_spec.attention, layer.encoder_attn, self_attention=False)
        _layer_norm(layer_spec.attention.layer_norm, layer.encoder_attn_layer_norm)
        _linear(layer_spec.ffn.linear_0, layer.fc1)
        _linear(layer_spec.ffn.linear_1, layer.fc2)
        _layer_norm(layer_spec.ffn.layer_norm, layer.final_layer_norm)
    _linear(spec.decoder.projection, model.lm_head)
    if config.final_logits_bias:
        spec.decoder.projection.bias = model.final_logits_bias.squeeze(0)

    spec.register_source_vocabulary(source_tokens)
    spec.register_target_vocabulary(target_tokens)
    spec.config.unk_token = unk_token
    spec.config.eos_token = target_tokens[config.eos_token_id]
    spec.config.bos_token = target_tokens[
        config.bos_token_id if config.bos_token_id is not None else config.eos_token_id
    ]
    spec.config.decoder_start_token = target_tokens[config.decoder_start_token_id]
    spec.config.layer_norm_epsilon = model.model.encoder.layers[0].final_layer_norm.eps
    for key, value in CTRANSLATE2_ALIGNMENT.items():
        spec.config.add_attribute(key, value)
    return spec


def _tokens(tokenizer: PreTrainedTokenizerBase, vocab: dict[str, int], size: int, side: str) -> list[str]:
    """Token strings by id for an embedding of ``size`` rows; rows the tokenizer never produces get
    placeholder names (CTranslate2 needs one unique string per row)."""
    if len(vocab) > size:
        raise ValueError(
            f"The tokenizer's {side} vocabulary has {len(vocab)} tokens but the model's embedding only {size}: "
            "this is not the tokenizer the model was trained with (or call `model.resize_token_embeddings`)."
        )
    tokens = [f"<unused{i}>" for i in range(size)]
    for token, index in vocab.items():
        tokens[index] = token
    return tokens


def vocabularies(
    tokenizer: PreTrainedTokenizerBase, model: VanillaTransformerForConditionalGeneration
) -> tuple[list[str], list[str]]:
    """Source and target token lists (one shared list when the model shares its vocabulary)."""
    config = model.config
    if config.share_encoder_decoder_embeddings:
        tokens = _tokens(tokenizer, tokenizer.get_vocab(), config.vocab_size, "shared")
        return tokens, tokens
    if not (hasattr(tokenizer, "get_src_vocab") and hasattr(tokenizer, "get_tgt_vocab")):
        raise ValueError(
            f"The model has separate source and target vocabularies but its {type(tokenizer).__name__} exposes "
            "only one (`get_src_vocab`/`get_tgt_vocab` are missing)."
        )
    return (
        _tokens(tokenizer, tokenizer.get_src_vocab(), config.vocab_size, "source"),
        _tokens(tokenizer, tokenizer.get_tgt_vocab(), config.target_vocab_size, "target"),
    )


class VanillaTransformerConverter(Converter):
    """``ctranslate2.converters.Converter`` for an hf_vanilla folder (model + tokenizer)."""

    def __init__(self, model_dir: str | Path) -> None:
        _require_ctranslate2()
        self.model_dir = Path(model_dir)

    def load(self) -> tuple[VanillaTransformerForConditionalGeneration, PreTrainedTokenizerBase]:
        """The model (float32) and its tokenizer, checked to belong together."""
        model = load_pretrained_checked(  # a damaged, unsafe, NaN or mismatched folder: one error naming it
            self.model_dir, VanillaTransformerForConditionalGeneration, dtype=torch.float32
        )
        try:
            tokenizer = load_tokenizer(self.model_dir)
        except CheckpointError:  # a damaged tokenizer file: named as such
            raise
        except (OSError, ValueError) as error:
            raise ValueError(
                f"No usable tokenizer in {self.model_dir} ({error}): CTranslate2 works on token strings, so "
                "save the model's tokenizer into the folder first (`tokenizer.save_pretrained(folder)`)."
            ) from error
        check_tokenizer_matches_config(tokenizer, model.config, f"both in {self.model_dir}")
        return model, tokenizer

    def _load(self) -> object:
        model, tokenizer = self.load()
        source_tokens, target_tokens = vocabularies(tokenizer, model)
        return transformer_spec(model, source_tokens, target_tokens, unk_token=tokenizer.unk_token or "<unk>")


def export_ctranslate2(
    model_dir: str | Path, output_dir: str | Path, quantization: str | None = None, overwrite: bool = False
) -> str:
    """Write the CTranslate2 model of the hf_vanilla folder ``model_dir`` to ``output_dir``.

    An existing ``output_dir`` (other than an empty folder) raises ``FileExistsError`` unless
    ``overwrite``; the model is written to a temporary folder and renamed into place when complete.
    The folder also holds the model's tokenizer (its ``model_max_length`` the longest input) and
    generation config.
    """
    _require_ctranslate2()
    check_model_dir(model_dir)
    refuse_to_replace(output_dir, overwrite, "--output_dir", inputs=[model_dir])
    converter = VanillaTransformerConverter(model_dir)
    with atomic_directory(output_dir) as staged:
        converter.convert(str(staged), quantization=quantization, force=True)
        model, tokenizer = converter.load()
        limit_tokenizer_length(tokenizer, model.config)
        tokenizer.save_pretrained(staged)  # the same tokenizer travels with the model
        model.generation_config.save_pretrained(staged)  # decoding defaults: max_length_offset
        write_manifest(staged)  # checked by the ctranslate2 backend
    logger.info("Wrote the CTranslate2 model %s", output_dir)
    return str(output_dir)


def export_from_args(args: ExportArguments) -> str:
    return export_ctranslate2(args.model_dir, args.output_dir, args.quantization, args.overwrite)
