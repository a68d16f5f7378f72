"""The model folder: the one writer of every folder hf_vanilla saves (weights, config with ``auto_map``,
the travelling code files, tokenizer), and its check."""

from __future__ import annotations

import ast
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from huggingface_hub import ModelCard
from transformers.dynamic_module_utils import get_relative_imports

from hf_vanilla.io.manifest import write_manifest
from hf_vanilla.io.pickles import PICKLE_SUFFIXES
from hf_vanilla.models.vanilla_transformer.saving_vanilla_transformer import (
    folder_auto_map,
    folder_custom_pipelines,
)

__all__ = [
    "TRAINING_ARGS_JSON",
    "finish_model_folder",
    "limit_tokenizer_length",
    "save_for_hub",
    "save_model_folder",
]

#: The training arguments, as JSON, in every model folder the Trainer writes (instead of a pickle); they
#: include the model card's data (:class:`DatasetCardArguments`).
TRAINING_ARGS_JSON = "training_args.json"


#: ``config.json``'s ``auto_map`` and ``custom_pipelines`` in every folder hf_vanilla writes, as the
#: model's saving file writes them.
AUTO_MAP = folder_auto_map()
CUSTOM_PIPELINES = folder_custom_pipelines()


def limit_tokenizer_length(tokenizer: Any, config: Any) -> None:
    """Set ``tokenizer.model_max_length`` (unset: 1e30) to the model's ``max_position_embeddings``, the
    longest input the model is meant for, so that ``truncation=True`` and the length warning use it."""
    if tokenizer.model_max_length > config.max_position_embeddings:
        tokenizer.model_max_length = config.max_position_embeddings


def finish_model_folder(folder: str | Path) -> None:
    """Check a folder written by the model's ``save_pretrained`` (which makes it self-contained, see
    ``saving_vanilla_transformer``): weights in safetensors, ``auto_map`` and ``custom_pipelines`` with
    their code files, no pickle; then write its manifest (:func:`hf_vanilla.io.manifest.write_manifest`:
    ``architecture.json`` and the checksums of its weights, tokenizer and code), which the loaders check."""
    _check_folder(Path(folder))
    write_manifest(folder)


def save_model_folder(model: Any, tokenizer: Any | None, folder: str | Path) -> Path:
    """The one writer of hf_vanilla model folders (demo, training output, averaged and converted models,
    the Hub folder): ``model.safetensors``, ``config.json`` with ``auto_map`` and ``custom_pipelines``,
    the modeling, configuration, fast-path and pipeline code, ``generation_config.json``, the tokenizer
    (its ``model_max_length`` set by :func:`limit_tokenizer_length`) and the manifest
    (:func:`finish_model_folder`). It loads with
    ``AutoModelForSeq2SeqLM`` / ``AutoTokenizer`` ``.from_pretrained(folder, trust_remote_code=True)``
    and ``pipeline("vanilla-translation", model=folder, trust_remote_code=True)`` where hf_vanilla is
    not installed; with hf_vanilla imported, its own classes are used instead. Tokenizer files copied into
    ``folder`` from elsewhere must be there before it is called, for the manifest to list them.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    if tokenizer is not None:
        limit_tokenizer_length(tokenizer, model.config)
        tokenizer.save_pretrained(folder)
    finish_model_folder(folder)
    return folder


def save_for_hub(
    model: Any,
    tokenizer: Any,
    folder: str | Path,
    card: ModelCard,
    metadata: dict[str, Any] | None = None,
) -> Path:
    """Write everything that would be pushed into ``folder`` and return it: the model folder of
    :func:`save_model_folder`, the card as ``README.md`` and ``metadata`` (e.g. scores and decoding
    settings) as ``hub_metadata.json``.

    """
    folder = save_model_folder(model, tokenizer, folder)
    card.save(folder / "README.md")
    if metadata is not None:
        (folder / "hub_metadata.json").write_text(
            json.dumps(metadata, indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
        )
    _check_folder(folder, needed=("README.md", "tokenizer_config.json"))
    return folder


def _check_folder(folder: Path, needed: Sequence[str] = ()) -> None:
    """Fail loudly if the folder lacks a piece a user of the model needs, holds a pickle, or maps an Auto
    class to anything but hf_vanilla's class (:data:`AUTO_MAP`) defined in a code file of the folder whose
    relative imports are there too."""
    needed = ["model.safetensors", "config.json", "generation_config.json", *needed]
    missing = [name for name in needed if not (folder / name).is_file()]
    pickles = sorted(path.name for path in folder.iterdir() if path.suffix in PICKLE_SUFFIXES)
    if pickles:
        raise RuntimeError(
            f"The model folder {folder} holds pickled files {pickles}: write them as safetensors/JSON."
        )
    config = json.loads((folder / "config.json").read_text())
    auto_map = config.get("auto_map", {})
    missing += [f"auto_map[{key}]" for key in AUTO_MAP if key not in auto_map]
    if config.get("custom_pipelines") != CUSTOM_PIPELINES:
        missing.append(f"custom_pipelines {CUSTOM_PIPELINES}")
    foreign = [f"{key} -> {value!r}" for key, value in auto_map.items() if AUTO_MAP.get(key) != value]
    if foreign:
        raise RuntimeError(
            f"The model folder {folder} maps Auto classes to code that is not hf_vanilla's "
            f"({', '.join(foreign)}; expected {AUTO_MAP}): it would not load where hf_vanilla is not installed."
        )
    undefined = []
    for entry in [*auto_map.values(), *(task["impl"] for task in CUSTOM_PIPELINES.values())]:
        module, name = entry.rsplit(".", 1)
        code = folder / f"{module}.py"
        if not code.is_file():
            missing.append(code.name)
            continue
        missing += [
            f"{imported}.py"
            for imported in get_relative_imports(code)
            if not (folder / f"{imported}.py").is_file()
        ]
        if name not in _defined_classes(code):
            undefined.append(f"{name} in {code.name}")
    if missing:
        raise RuntimeError(
            f"The model folder {folder} is incomplete, missing: {list(dict.fromkeys(missing))}."
        )
    if undefined:
        raise RuntimeError(
            f"The model folder {folder}'s code does not define the classes config.json names: {undefined}."
        )


def _defined_classes(code: Path) -> set[str]:
    """The names of the classes a Python file defines at its top level."""
    tree = ast.parse(code.read_text(encoding="utf-8"), filename=str(code))
    return {node.name for node in tree.body if isinstance(node, ast.ClassDef)}
