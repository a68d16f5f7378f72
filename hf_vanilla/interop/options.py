"""The conversion and export commands' options, importable without torch so that a command's ``--help``
needs no torch; :mod:`hf_vanilla.interop.convert` and :mod:`hf_vanilla.interop.export_ctranslate2` use
them."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from hf_vanilla.io.atomic import OVERWRITE_HELP

__all__ = ["ConversionArguments", "ExportArguments", "check_model_dir"]


def check_model_dir(model_dir: str | Path) -> None:
    """Refuse an exporter's ``--model_dir`` that is not a folder, naming the flag (the exporters read a
    local hf_vanilla folder, never the Hub)."""
    path = Path(model_dir)
    if not path.is_dir():
        what = "a file, not a folder" if path.exists() else "no such folder"
        raise FileNotFoundError(
            f"--model_dir {str(model_dir)!r}: {what}. Give the hf_vanilla model folder to export: a training "
            "run's --output_dir, one of its checkpoint-<step> folders, or an averaged or converted model."
        )


@dataclass
class ConversionArguments:
    """Convert a Marian (OPUS-MT) or FSMT (fairseq WMT) model into an hf_vanilla model folder."""

    source: str = field(
        metadata={"help": "A local model folder or a Hugging Face Hub id (e.g. Helsinki-NLP/opus-mt-de-en)."}
    )
    output_dir: str = field(metadata={"help": "Where to write the hf_vanilla model folder."})
    source_format: str = field(
        default="auto",
        metadata={
            "help": "The source model class: 'marian', 'fsmt', or 'auto' (read config.json).",
            "aliases": ["--from"],
        },
    )
    revision: str | None = field(default=None, metadata={"help": "Hub revision (branch, tag or commit)."})
    overwrite: bool = field(default=False, metadata={"help": OVERWRITE_HELP})


@dataclass
class ExportArguments:
    """Write a CTranslate2 model from an hf_vanilla model folder (with its tokenizer)."""

    model_dir: str = field(metadata={"help": "The hf_vanilla model folder (model, config and tokenizer)."})
    output_dir: str = field(metadata={"help": "Where to write the CTranslate2 model."})
    quantization: str | None = field(
        default=None,
        metadata={
            "help": "CTranslate2 weight type, e.g. int8, int8_float32, float16 (default: keep float32)."
        },
    )
    overwrite: bool = field(
        default=False,
        metadata={
            "help": "Replace an existing output_dir (written to a temporary folder, then renamed into place).",
            "aliases": ["--force"],
        },
    )
