"""Convert a trained OPUS-MT (Marian) or fairseq WMT (FSMT) model into an hf_vanilla model folder.

    hf-vanilla-convert --source Helsinki-NLP/opus-mt-de-en --output_dir runs/opus-mt-de-en
    hf-vanilla-convert --source facebook/wmt19-de-en --source_format fsmt --output_dir runs/wmt19-de-en
    hf-vanilla-convert --source path/to/marian_folder --output_dir runs/converted

The result loads with `AutoModelForSeq2SeqLM.from_pretrained(output_dir)` after `import hf_vanilla`, or
with `trust_remote_code=True` where hf_vanilla is not installed (the folder carries the code),
gives the original's logits and translations, and keeps the original model's license.
"""

from __future__ import annotations

import logging
import sys

from hf_vanilla.cli import parse_arguments, run_cli
from hf_vanilla.interop.options import ConversionArguments

logger = logging.getLogger(__name__)


def _run(argv: list[str]) -> None:
    _, (args,) = parse_arguments(argv, ConversionArguments, __doc__)
    from hf_vanilla.interop.convert import convert_from_args  # torch, after --help

    convert_from_args(args)
    logger.info("Converted %s into %s", args.source, args.output_dir)


def main(argv: list[str] | None = None) -> int:
    return run_cli(_run, argv)


if __name__ == "__main__":
    sys.exit(main())
