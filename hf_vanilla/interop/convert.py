"""Import trained translation models into hf_vanilla: OPUS-MT (``MarianMTModel``) and fairseq's WMT
models (``FSMTForConditionalGeneration``).

Both are the post-LN encoder-decoder of the paper (§3.1) with small variations, each of which the
config represents with an option that is off by default (deviation 6 of the modeling file):

| checkpoint | variation                               | hf_vanilla option                              |
|------------|-----------------------------------------|------------------------------------------------|
| both       | biases in W^Q, W^K, W^V, W^O            | ``attention_bias=True``                        |
| both       | sin/cos in two halves (§3.5 interleaves) | ``position_encoding_layout="halves"``          |
| FSMT       | tensor2tensor frequencies 10000^(-i/(D/2-1)) | ``position_encoding_timescales="tensor2tensor"`` |
| FSMT       | positions start at pad_token_id + 1     | ``position_offset``                            |
| Marian     | swish or GELU feed-forward (§3.3: ReLU) | ``activation_function``                        |
| Marian     | no √d_model embedding scaling (most)    | ``scale_embedding=False``                      |
| Marian     | a fixed bias on the logits              | ``final_logits_bias=True``                     |
| both       | separate source/target vocabularies     | ``share_encoder_decoder_embeddings=False``     |
| both       | untied pre-softmax projection           | ``tie_word_embeddings=False``                  |

Anything else (pre-LN layers, a final or embedding LayerNorm, learned positions, an activation the
config lacks, a weight with no counterpart) makes :func:`convert_model` refuse with a message that
names it. Every conversion ends with a check that both models give the same logits on a probe input.

A converted model is a change of file format, not of terms: it keeps the original model's license
and attribution. :func:`convert` therefore copies the original ``README.md`` (as
``ORIGINAL_README.md``) and any license files next to the weights, and writes a short ``README.md``
saying where the weights come from and that their license applies.
"""

from __future__ import annotations

import copy
import logging
import re
import shutil
from pathlib import Path

import torch
from huggingface_hub import ModelCard, ModelCardData, snapshot_download
from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError, OfflineModeIsEnabled
from transformers import FSMTForConditionalGeneration, MarianMTModel, PreTrainedModel

from hf_vanilla.hub.folder import save_model_folder
from hf_vanilla.interop.options import ConversionArguments
from hf_vanilla.io.atomic import atomic_directory, refuse_to_replace
from hf_vanilla.io.checked_loading import load_pretrained_checked
from hf_vanilla.io.errors import CheckpointError
from hf_vanilla.io.json_files import read_json
from hf_vanilla.io.pickles import verify_pickle_file
from hf_vanilla.models.vanilla_transformer.configuration_vanilla_transformer import (
    ACTIVATIONS,
    VanillaTransformerConfig,
)
from hf_vanilla.models.vanilla_transformer.modeling_vanilla_transformer import sinusoidal_position_encoding
from hf_vanilla.speed.modeling import VanillaTransformerForConditionalGeneration

logger = logging.getLogger(__name__)

#: The source formats :func:`convert` reads, by ``model_type`` of their ``config.json``.
SOURCE_FORMATS = {"marian": MarianMTModel, "fsmt": FSMTForConditionalGeneration}

#: Config attributes that some checkpoints carry and that describe an architecture hf_vanilla (and the
#: transformers Marian/FSMT classes, which ignore them) cannot represent; value = the supported one.
_UNSUPPORTED_FLAGS = {
    "normalize_before": False,  # pre-LN layers
    "encoder_normalize_before": False,
    "decoder_normalize_before": False,
    "add_final_layer_norm": False,  # a LayerNorm after the last layer
    "normalize_embedding": False,  # a LayerNorm on the embeddings
    "layernorm_embedding": False,
    "static_position_embeddings": True,  # False: learned positional embeddings
    "encoder_learned_pos": False,
    "decoder_learned_pos": False,
    "add_bias_logits": False,
    "no_scale_embedding": False,
}

#: Files of a source folder that are replaced by the converted model's own.
_MODEL_FILE = re.compile(
    r"^(config\.json|generation_config\.json|.*\.(safetensors|bin|h5|msgpack|ot|onnx|ckpt|pt|pth)"
    r"|.*\.index\.json|\..*)$"
)
_HUB_WEIGHT_PATTERNS = [
    "*.h5",
    "*.msgpack",
    "*.ot",
    "*.onnx",
    "*.ckpt",
    "*.pt",
    "*.pth",
    "tf_model*",
    "flax*",
]


class ConversionError(ValueError):
    """The checkpoint uses something hf_vanilla cannot represent; the message names it."""


# --------------------------------------------------------------------------------------------------
# Config
# --------------------------------------------------------------------------------------------------
def _check_flags(config: object) -> None:
    for name, supported in _UNSUPPORTED_FLAGS.items():
        value = getattr(config, name, supported)
        if value is not None and bool(value) != supported:
            raise ConversionError(
                f"The checkpoint sets `{name}={value!r}`, which hf_vanilla cannot represent (it is the paper's "
                f"post-LN Transformer with fixed sinusoidal positions); it supports only `{name}={supported}`."
            )
    activation = config.activation_function
    if activation not in ACTIVATIONS:
        raise ConversionError(
            f"The checkpoint's activation function {activation!r} is not one hf_vanilla supports {ACTIVATIONS}."
        )
    for name in ("encoder_layerdrop", "decoder_layerdrop"):
        if getattr(config, name, 0.0):
            logger.warning(
                "%s=%s is a training-time regulariser that hf_vanilla does not implement: inference is "
                "unaffected, fine-tuning the converted model runs without it.",
                name,
                getattr(config, name),
            )


def _common_fields(config: object) -> dict[str, object]:
    return {
        "d_model": config.d_model,
        "encoder_layers": config.encoder_layers,
        "decoder_layers": config.decoder_layers,
        "encoder_attention_heads": config.encoder_attention_heads,
        "decoder_attention_heads": config.decoder_attention_heads,
        "encoder_ffn_dim": config.encoder_ffn_dim,
        "decoder_ffn_dim": config.decoder_ffn_dim,
        "activation_function": config.activation_function,
        "dropout": config.dropout,
        "attention_dropout": config.attention_dropout,
        "activation_dropout": config.activation_dropout,
        "max_position_embeddings": config.max_position_embeddings,
        "scale_embedding": config.scale_embedding,
        "attention_bias": True,
        "pad_token_id": config.pad_token_id,
        "bos_token_id": config.bos_token_id,
        "eos_token_id": config.eos_token_id,
        "decoder_start_token_id": config.decoder_start_token_id,
        "position_encoding_layout": "halves",
    }


#: Where each format keeps its source embedding, target embedding and pre-softmax projection.
_EMBEDDING_KEYS = {
    "marian": ("model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight", "lm_head.weight"),
    "fsmt": (
        "model.encoder.embed_tokens.weight",
        "model.decoder.embed_tokens.weight",
        "model.decoder.output_projection.weight",
    ),
}


def _sharing(model: PreTrainedModel, source_format: str) -> tuple[bool, bool]:
    """(shared source/target embedding, tied output projection), read off the weights: equal source
    and target embeddings are shared, an output projection equal to the target embedding is tied.
    (Config flags are not enough: transformers 5 Marian with ``tie_word_embeddings=False`` keeps
    three separate matrices even when ``share_encoder_decoder_embeddings=True``.)"""
    state = model.state_dict()
    source, target, output = (state[key] for key in _EMBEDDING_KEYS[source_format])
    share = source.shape == target.shape and torch.equal(source, target)
    return share, torch.equal(output, target)


def marian_config(model: MarianMTModel) -> VanillaTransformerConfig:
    """The hf_vanilla config of a ``MarianMTModel``: halves PE from position 0, paper frequencies."""
    config = model.config
    _check_flags(config)
    share, tie = _sharing(model, "marian")
    return VanillaTransformerConfig(
        **_common_fields(config),
        vocab_size=config.vocab_size,
        share_encoder_decoder_embeddings=share,
        decoder_vocab_size=None if share else config.decoder_vocab_size,
        tie_word_embeddings=tie,
        final_logits_bias=bool(model.final_logits_bias.any()),  # all-zero bias: leave it out
    )


def fsmt_config(model: FSMTForConditionalGeneration) -> VanillaTransformerConfig:
    """The hf_vanilla config of an ``FSMTForConditionalGeneration``: fairseq's sinusoid (halves,
    tensor2tensor frequencies, positions from pad + 1); sharing as fairseq's
    ``--share-all-embeddings`` / ``--share-decoder-input-output-embed`` left the weights."""
    config = model.config
    _check_flags(config)
    share, tie = _sharing(model, "fsmt")
    return VanillaTransformerConfig(
        **_common_fields(config),
        vocab_size=config.src_vocab_size,
        share_encoder_decoder_embeddings=share,
        decoder_vocab_size=None if share else config.tgt_vocab_size,
        tie_word_embeddings=tie,
        position_encoding_timescales="tensor2tensor",
        position_offset=config.pad_token_id + 1,
    )


# --------------------------------------------------------------------------------------------------
# Weights
# --------------------------------------------------------------------------------------------------
_LAYER_KEY = re.compile(r"^model\.(encoder|decoder)\.layers\.\d+\.")


def _check_position_table(table: torch.Tensor, config: VanillaTransformerConfig, name: str) -> None:
    """The source's stored sinusoid table (rows from ``position_offset`` on) must be ours, or the
    checkpoint has learned (or otherwise different) positional embeddings."""
    rows = table[config.position_offset :].float()
    positions = torch.arange(config.position_offset, config.position_offset + rows.shape[0])
    expected = sinusoidal_position_encoding(
        positions,
        config.d_model,
        layout=config.position_encoding_layout,
        timescales=config.position_encoding_timescales,
    )
    # Tables built in float64 differ from ours (float32) by < 1e-4 at position 1024.
    if rows.shape != expected.shape or not torch.allclose(rows, expected, atol=1e-3):
        raise ConversionError(
            f"`{name}` is not the fixed sinusoid of the model class (learned positional embeddings?); "
            "hf_vanilla supports only sinusoidal positional encodings (§3.5)."
        )


def _map_state_dict(
    model: PreTrainedModel, source_format: str, config: VanillaTransformerConfig
) -> dict[str, torch.Tensor]:
    """Rename the source's tensors to hf_vanilla's; refuse any tensor that has no counterpart."""
    source_key, target_key, output_key = _EMBEDDING_KEYS[source_format]
    embeddings = {
        source_key: "model.shared.weight",
        target_key: "model.shared.weight"
        if config.share_encoder_decoder_embeddings
        else "model.decoder.embed_tokens.weight",
        output_key: "lm_head.weight",
    }
    ignored = set()
    if source_format == "marian":
        # Marian's forward never reads `model.shared` (the encoder and decoder hold their own
        # embeddings, tied to it or not); its logits bias is left out when it is all zero.
        ignored = {"model.shared.weight", "final_logits_bias"}
        if config.final_logits_bias:
            embeddings["final_logits_bias"] = "final_logits_bias"
    mapped: dict[str, torch.Tensor] = {}
    unsupported = []
    for key, tensor in model.state_dict().items():
        if key.endswith("embed_positions.weight"):
            _check_position_table(tensor, config, key)
        elif key in embeddings:
            mapped[embeddings[key]] = tensor
        elif _LAYER_KEY.match(key):  # same attribute names as Marian's (and fairseq's)
            mapped[key] = tensor
        elif key not in ignored:
            unsupported.append(key)
    if unsupported:
        raise ConversionError(
            f"The checkpoint has weights with no counterpart in hf_vanilla: {unsupported[:8]}"
            f"{' ...' if len(unsupported) > 8 else ''}. These belong to a feature hf_vanilla cannot represent."
        )
    return mapped


def convert_model(model: PreTrainedModel) -> VanillaTransformerForConditionalGeneration:
    """Convert a loaded ``MarianMTModel`` or ``FSMTForConditionalGeneration`` (in memory).

    The result computes the same function: same logits (checked on a probe input before returning)
    and, with the source's generation config copied, the same ``generate()`` outputs.
    """
    source_format = next((name for name, cls in SOURCE_FORMATS.items() if isinstance(model, cls)), None)
    if source_format is None:
        raise ConversionError(
            f"Cannot convert a {type(model).__name__}: hf_vanilla converts MarianMTModel (OPUS-MT) and "
            "FSMTForConditionalGeneration (fairseq WMT) models."
        )
    config = marian_config(model) if source_format == "marian" else fsmt_config(model)
    mapped = _map_state_dict(model, source_format, config)

    converted = VanillaTransformerForConditionalGeneration(config)
    target_state = converted.state_dict()
    for key, tensor in mapped.items():
        if key not in target_state or target_state[key].shape != tensor.shape:
            raise ConversionError(
                f"The checkpoint's `{key}` of shape {tuple(tensor.shape)} does not fit hf_vanilla's "
                f"{tuple(target_state[key].shape) if key in target_state else 'model (no such weight)'}."
            )
    with torch.no_grad():
        for key, tensor in mapped.items():
            target_state[key].copy_(tensor)
    loaded = {target_state[key].data_ptr() for key in mapped}
    unset = [key for key, tensor in target_state.items() if tensor.data_ptr() not in loaded]
    if unset:
        raise ConversionError(f"No weight of the checkpoint maps to hf_vanilla's {unset}.")
    converted.generation_config = copy.deepcopy(model.generation_config)
    converted.eval()
    _check_same_logits(model, converted)
    return converted


@torch.no_grad()
def _check_same_logits(
    source: PreTrainedModel, converted: VanillaTransformerForConditionalGeneration
) -> None:
    """Run both models on one random probe (source padded on the right) and compare the logits."""
    config = converted.config
    generator = torch.Generator().manual_seed(0)
    special = {config.pad_token_id, config.eos_token_id, config.decoder_start_token_id}
    low = 0 if max(special) >= 8 else max(special) + 1  # avoid special ids where cheaply possible
    source_ids = torch.randint(low, config.vocab_size, (2, 8), generator=generator)
    decoder_ids = torch.randint(low, config.target_vocab_size, (2, 6), generator=generator)
    source_ids[source_ids == config.pad_token_id] = low
    decoder_ids[decoder_ids == config.pad_token_id] = low
    attention_mask = torch.ones_like(source_ids)
    source_ids[1, 5:], attention_mask[1, 5:] = config.pad_token_id, 0
    was_training = source.training
    source.eval()
    inputs = {"input_ids": source_ids, "attention_mask": attention_mask, "decoder_input_ids": decoder_ids}
    expected = source(**inputs, use_cache=False).logits.float()
    source.train(was_training)
    actual = converted(**inputs, use_cache=False).logits.float()
    difference = (expected - actual).abs().max().item()
    tolerance = 1e-4 * max(1.0, expected.abs().max().item())
    if difference > tolerance:
        raise ConversionError(
            f"The converted model's logits differ from the original's by {difference:.3g} (> {tolerance:.3g}): "
            "the checkpoint uses a feature the converter does not detect. Please report it with the model id."
        )
    logger.info("Converted model matches the original: max |Δ logits| = %.3g", difference)


# --------------------------------------------------------------------------------------------------
# Folders
# --------------------------------------------------------------------------------------------------
def _local_folder(source: str, revision: str | None) -> Path:
    """A local folder as it is; a Hub id downloaded (all files but the non-PyTorch weights)."""
    path = Path(source)
    if path.is_dir():
        return path
    if path.exists():
        raise ConversionError(f"{source!r} is a file: give a model folder or a Hugging Face Hub id.")
    try:
        return Path(snapshot_download(source, revision=revision, ignore_patterns=_HUB_WEIGHT_PATTERNS))
    except (LocalEntryNotFoundError, OfflineModeIsEnabled, HfHubHTTPError, OSError) as error:
        raise ConversionError(
            f"{source!r} is not a local folder and could not be fetched from the Hugging Face Hub ({error}). "
            "Where the Hub is reachable, download it with `hf download "
            f"{source} --local-dir DIR` and pass DIR; with HF_HUB_OFFLINE=1 only cached models load."
        ) from error


def load_source_model(folder: str | Path, source_format: str = "auto") -> tuple[PreTrainedModel, str]:
    """Load the Marian or FSMT model in ``folder``; ``source_format`` ``"auto"`` reads ``config.json``."""
    if source_format not in ("auto", *SOURCE_FORMATS):
        raise ConversionError(f"Unknown source format {source_format!r}: choose 'auto', 'marian' or 'fsmt'.")
    config = Path(folder) / "config.json"
    if not config.is_file():
        raise ConversionError(
            f"{str(folder)!r} has no config.json: give the folder of a Marian or FSMT model."
        )
    model_type = read_json(config).get("model_type")
    if model_type is None:
        raise ConversionError(
            f"{str(config)!r} has no model_type, so the model it describes is unknown: it was damaged or written "
            'by hand. Restore the config.json of the original model ("model_type": "marian" or "fsmt").'
        )
    if model_type not in SOURCE_FORMATS:
        raise ConversionError(
            f"{str(folder)!r} holds a {model_type!r} model: hf_vanilla converts 'marian' (OPUS-MT) and "
            "'fsmt' (fairseq WMT) models."
        )
    if source_format not in ("auto", model_type):
        raise ConversionError(
            f"--from {source_format} was given, but {str(folder)!r} holds a {model_type!r} model."
        )
    _check_pickled_weights(Path(folder))
    model = load_pretrained_checked(folder, SOURCE_FORMATS[model_type], dtype=torch.float32)
    return model.eval(), model_type


def _check_pickled_weights(folder: Path) -> None:
    """A folder whose weights are pickled (``pytorch_model*.bin``, no ``model*.safetensors``) is read only
    if each file is plain tensor data (:func:`hf_vanilla.io.pickles.verify_pickle_file`, which runs
    nothing); otherwise one line says to use safetensors weights."""
    if any(folder.glob("model*.safetensors")):
        return
    for path in sorted(folder.glob("pytorch_model*.bin")):
        try:
            verify_pickle_file(path, check_contents=False)
        except CheckpointError as err:
            raise ConversionError(
                f"{err} To convert this model, use a copy with model.safetensors weights (most OPUS-MT models on "
                "the Hub have one), or convert this file to safetensors where you trust its origin."
            ) from None


def _copy_side_files(source: Path, output_dir: Path) -> list[str]:
    """Copy tokenizer, vocabulary and license files; the original model card becomes ORIGINAL_README.md."""
    copied = []
    for path in sorted(source.iterdir()):
        if not path.is_file() or _MODEL_FILE.match(path.name):
            continue
        name = "ORIGINAL_README.md" if path.name == "README.md" else path.name
        shutil.copyfile(path, output_dir / name)
        copied.append(name)
    return copied


_USAGE = """
## Usage

The folder carries the hf_vanilla modeling code (`trust_remote_code=True`), so hf_vanilla need not be
installed; with `import hf_vanilla`, its own classes are used instead.

```python
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

model = AutoModelForSeq2SeqLM.from_pretrained("{folder}", trust_remote_code=True)
tokenizer = AutoTokenizer.from_pretrained("{folder}", trust_remote_code=True)
batch = tokenizer(["{example}"], return_tensors="pt")
print(tokenizer.batch_decode(model.generate(**batch, max_new_tokens=64), skip_special_tokens=True))
```

The pipeline: `pipeline("vanilla-translation", model="{folder}", trust_remote_code=True)` (transformers 5
removed its own `translation` pipeline).
"""


def _write_model_card(
    source: str, source_format: str, output_dir: Path, final_dir: Path, from_hub: bool
) -> None:
    """The card, written into ``output_dir`` (its usage example loads ``final_dir``, where the folder ends
    up): the original's license and languages, ``base_model`` (a Hub source), ``pipeline_tag``."""
    original = output_dir / "ORIGINAL_README.md"
    original_data = ModelCard.load(original).data if original.is_file() else ModelCardData()
    license_name = original_data.license
    data = ModelCardData(
        license=license_name,
        license_name=original_data.get("license_name"),
        license_link=original_data.get("license_link"),
        language=original_data.language,
        base_model=source if from_hub else None,
        base_model_relation="finetune" if from_hub else None,
        library_name="transformers",
        pipeline_tag="translation",
        tags=["hf_vanilla", "translation"],
    )
    card = ModelCard(
        f"---\n{data.to_yaml()}\n---\n" + f"# {source}, converted to hf_vanilla\n\n"
        f"These are the weights of `{source}` ({SOURCE_FORMATS[source_format].__name__}), converted by "
        "hf_vanilla into a `VanillaTransformerForConditionalGeneration` (same logits, same translations). "
        "Conversion changes the file format, not the terms: the model keeps the original model's license"
        f"{f' ({license_name})' if license_name else ''} and attribution, and the original model card applies "
        "(see `ORIGINAL_README.md`"
        + (" and the license files" if any(output_dir.glob("LICENSE*")) else "")
        + ").\n"
        + _USAGE.format(folder=final_dir, example="Hello world.")
    )
    card.save(output_dir / "README.md")


def convert(
    source: str,
    output_dir: str | Path,
    source_format: str = "auto",
    revision: str | None = None,
    overwrite: bool = False,
) -> VanillaTransformerForConditionalGeneration:
    """Convert the Marian or FSMT model at ``source`` (folder or Hub id) into an hf_vanilla folder
    with the model, the original generation config, the tokenizer files and a provenance/license card.

    An existing ``output_dir`` (other than an empty folder) raises ``FileExistsError`` unless
    ``overwrite``; the folder is written under a temporary name and renamed into place when complete.
    """
    output_dir = Path(output_dir)
    refuse_to_replace(output_dir, overwrite, "--output_dir", inputs=[source])
    folder = _local_folder(source, revision)
    model, model_type = load_source_model(folder, source_format)
    converted = convert_model(model)
    with atomic_directory(output_dir) as staged:
        copied = _copy_side_files(folder, staged)  # first: the folder's manifest lists the tokenizer files
        save_model_folder(converted, None, staged)
        _write_model_card(source, model_type, staged, output_dir, from_hub=not Path(source).is_dir())
    if not any(name.startswith(("tokenizer", "vocab", "source.spm", "spiece")) for name in copied):
        logger.warning(
            "No tokenizer files found in %s: add the tokenizer to %s yourself.", folder, output_dir
        )
    logger.info("Wrote %s (copied %s).", output_dir, ", ".join(copied) or "no other files")
    return converted


def convert_from_args(args: ConversionArguments) -> VanillaTransformerForConditionalGeneration:
    return convert(args.source, args.output_dir, args.source_format, args.revision, args.overwrite)
