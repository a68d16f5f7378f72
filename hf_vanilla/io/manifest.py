"""What a model folder written by hf_vanilla records about itself, and the checks of it on load.

Every model folder hf_vanilla writes (:func:`hf_vanilla.hub.folder.finish_model_folder`: a training run's
final model and checkpoints, an averaged, converted, published or demo folder) carries:

* ``architecture.json``: the config values that decide what the weights compute
  (:func:`architecture_of`: every field of the config class but :data:`ADJUSTABLE_FIELDS`, and
  ``model_type``), as they were when the weights were written;
* ``checksums.sha256`` (``sha256sum -c checksums.sha256`` checks it too): the sha256 of the files that
  make the model, :data:`MANIFEST_PATTERNS` — weights, tokenizer, code and ``architecture.json``. Not
  listed, so free to edit: ``config.json`` (checked field by field against ``architecture.json``
  instead), ``generation_config.json``, the card (``README.md``) and the records beside the model.

A Trainer checkpoint's ``checksums.sha256`` lists every file of the checkpoint instead
(:func:`hf_vanilla.io.checksums.write_checksums`). A CTranslate2 export carries the checksums without
``architecture.json`` (its ``config.json`` is CTranslate2's). A folder without these files (a stock
``save_pretrained``, a Hub download, a folder written before) loads unchecked, as before.

It also tells an export of hf_vanilla's (CTranslate2, ONNX) from a model folder
(:func:`is_ctranslate2_folder`, :func:`export_kind`), for the commands that load either.
"""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hf_vanilla.io.checksums import CHECKSUMS_NAME, verify_checksums, write_checksums
from hf_vanilla.io.errors import ConfigMismatchError
from hf_vanilla.io.json_files import read_json

__all__ = [
    "ADJUSTABLE_FIELDS",
    "ARCHITECTURE_NAME",
    "CTRANSLATE2_ALIGNMENT",
    "CTRANSLATE2_WEIGHTS",
    "MANIFEST_PATTERNS",
    "TOKENIZER_PATTERNS",
    "architecture_of",
    "export_kind",
    "is_ctranslate2_folder",
    "verify_config",
    "verify_tokenizer_files",
    "write_manifest",
]

#: The record of the config values the weights were written with.
ARCHITECTURE_NAME = "architecture.json"

#: The weights file of a CTranslate2 export (hf-vanilla-export-ct2).
CTRANSLATE2_WEIGHTS = "model.bin"

#: What a CTranslate2 export's config.json says when its attention (``return_attention``) is the last decoder
#: layer's averaged over all heads, the attention hf-vanilla-translate aligns with. CTranslate2's default,
#: which exports written without it have, is the first head alone.
CTRANSLATE2_ALIGNMENT = {"alignment_attention": "last decoder layer, all heads averaged"}

#: The files of a tokenizer (``save_pretrained``'s, and those of converted Marian and FSMT models).
TOKENIZER_PATTERNS = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab*.json",
    "vocab*.txt",
    "merges.txt",
    "*.spm",
    "*.model",
)

#: The files of a model folder that ``checksums.sha256`` lists: weights (a CTranslate2 export's too),
#: tokenizer, code, architecture.
MANIFEST_PATTERNS = (
    "model.safetensors",
    "model-*.safetensors",
    "model.safetensors.index.json",
    CTRANSLATE2_WEIGHTS,
    "*_vocabulary.json",
    *TOKENIZER_PATTERNS,
    "*.py",
    ARCHITECTURE_NAME,
)

#: Config fields that may differ from the recorded ones: they change training or the accepted input
#: length, not what the weights compute. Dropout and label smoothing act only in training (fine-tuning
#: may set them); ``init_std`` only initialises new weights; ``use_cache`` speeds decoding up without
#: changing it; ``max_position_embeddings`` is the longest input accepted (the sinusoidal encoding is
#: defined for any length). The attention implementation and the dtype are not config fields.
ADJUSTABLE_FIELDS = frozenset(
    {
        "dropout",
        "attention_dropout",
        "activation_dropout",
        "label_smoothing",
        "init_std",
        "use_cache",
        "max_position_embeddings",
    }
)


def _matches(name: str, patterns: Sequence[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)


def architecture_of(config: Any) -> dict[str, Any]:
    """The values of ``config`` that decide what its weights compute, as JSON values: ``model_type`` and
    every field the config class declares itself, but :data:`ADJUSTABLE_FIELDS`."""
    fields = [name for name in vars(type(config)).get("__annotations__", {}) if name not in ADJUSTABLE_FIELDS]
    values = {"model_type": config.model_type, **{name: getattr(config, name, None) for name in fields}}
    return json.loads(json.dumps(values))


def _load_config(folder: Path) -> Any:
    """The folder's config, as ``AutoConfig`` reads it (no remote code); a value of the wrong type or
    that its class refuses raises :class:`ConfigMismatchError` naming ``config.json``."""
    from huggingface_hub.errors import StrictDataclassError
    from transformers import AutoConfig  # not at import: loading a tokenizer needs no transformers models

    try:
        return AutoConfig.from_pretrained(str(folder), trust_remote_code=False)
    except (ValueError, TypeError, KeyError, StrictDataclassError) as err:
        detail = " ".join(str(err).split()) or type(err).__name__
        raise ConfigMismatchError(
            f"{str(folder / 'config.json')!r} does not describe a valid model ({detail}). Restore the "
            "config.json saved with these weights."
        ) from err


def write_manifest(folder: str | Path) -> Path:
    """Write ``architecture.json`` (from the folder's ``config.json``, when that is a transformers config)
    and ``checksums.sha256`` over the folder's :data:`MANIFEST_PATTERNS` files into ``folder``, which holds
    the saved model or export; returns the manifest's path."""
    folder = Path(folder)
    if "model_type" in read_json(folder / "config.json"):  # not in a CTranslate2 export's config
        record = architecture_of(_load_config(folder))
        (folder / ARCHITECTURE_NAME).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    listed = [path for path in folder.iterdir() if path.is_file() and _matches(path.name, MANIFEST_PATTERNS)]
    return write_checksums(folder, listed)


def verify_config(folder: str | Path) -> None:
    """Refuse a folder whose ``config.json`` its config class refuses (a value of the wrong type, heads that
    do not divide ``d_model``, ...), or that sets a value of ``architecture.json`` otherwise (the weights
    would compute something else than they were trained for), naming each such field with its current and
    its recorded value. A ``model_type`` transformers does not know is left to ``from_pretrained`` (a model
    whose code the folder holds) unless ``architecture.json`` records another. Raises
    :class:`ConfigMismatchError`."""
    from transformers import CONFIG_MAPPING

    folder = Path(folder)
    model_type = read_json(folder / "config.json").get("model_type")
    path = folder / ARCHITECTURE_NAME
    recorded = read_json(path) if path.is_file() else None
    if recorded is not None and model_type != recorded.get("model_type"):
        current = {"model_type": model_type}
    elif model_type in CONFIG_MAPPING:
        current = architecture_of(_load_config(folder))
    else:
        return
    changed = [
        f"{name} is {json.dumps(current.get(name))}, recorded {json.dumps(value)}"
        for name, value in (recorded or {}).items()
        if name in current and current[name] != value
    ]
    if changed:
        raise ConfigMismatchError(
            f"{str(folder / 'config.json')!r} contradicts the weights it was saved with ({'; '.join(changed)} in "
            f"{ARCHITECTURE_NAME}): the model would compute something else than it was trained for. Set "
            f"{'this value' if len(changed) == 1 else 'these values'} back in config.json."
        )


def verify_tokenizer_files(folder: str | Path) -> None:
    """Check the tokenizer files a folder's ``checksums.sha256`` lists (nothing when it has none); raises
    :class:`CorruptCheckpointError` naming a damaged file."""
    folder = Path(folder)
    if (folder / CHECKSUMS_NAME).is_file():
        verify_checksums(folder, TOKENIZER_PATTERNS)


def is_ctranslate2_folder(folder: str | Path) -> bool:
    """A CTranslate2 export: ``model.bin`` and no transformers weights beside it."""
    folder = Path(folder)
    return (folder / CTRANSLATE2_WEIGHTS).is_file() and not (folder / "model.safetensors").exists()


def export_kind(folder: str | Path) -> tuple[str, str] | None:
    """What ``folder`` holds when it is an export of hf_vanilla's rather than a transformers model folder
    (what it is, and how to run it), so that it is not taken for a damaged save; ``None`` otherwise."""
    folder = Path(folder)
    if is_ctranslate2_folder(folder):
        return (
            f"a CTranslate2 export ({CTRANSLATE2_WEIGHTS})",
            "To translate with the export itself: hf-vanilla-translate --backend ctranslate2.",
        )
    if any(folder.glob("*.onnx")):
        return (
            "an ONNX export (*.onnx)",
            "To translate with the export itself: hf_vanilla.interop.onnx_generation (docs/interop.md).",
        )
    return None
