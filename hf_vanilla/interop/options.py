"""The conversion and export commands' options, importable without torch so that a command's ``--help``
answers at once; :mod:`hf_vanilla.interop.convert` and :mod:`hf_vanilla.interop.export_ctranslate2` use
them (and export them under their old names)."""

from __future__ import annotations

from dataclasses import dataclass, field

from hf_vanilla.io.atomic import OVERWRITE_HELP

__all__ = ["ConversionArguments", "ExportArguments"]


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
