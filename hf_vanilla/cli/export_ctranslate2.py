"""Write a CTranslate2 model from an hf_vanilla model folder (needs `pip install 'hf_vanilla[ct2]'`).

    hf-vanilla-export-ct2 --model_dir runs/opus-mt-de-en --output_dir runs/opus-mt-de-en-ct2
    hf-vanilla-export-ct2 --model_dir runs/base --output_dir runs/base-ct2 --quantization int8

Translate with `ctranslate2.Translator(output_dir).translate_batch(tokens, beam_size=4)`, where `tokens`
are the tokenizer's token strings (`tokenizer.convert_ids_to_tokens(tokenizer(text).input_ids)`).
"""

from __future__ import annotations

import logging
import sys

from hf_vanilla.cli import parse_arguments, run_cli
from hf_vanilla.interop.options import ExportArguments

logger = logging.getLogger(__name__)


def _run(argv: list[str]) -> None:
    _, (args,) = parse_arguments(argv, ExportArguments, __doc__)
    from hf_vanilla.interop.export_ctranslate2 import export_from_args  # torch, after --help

    export_from_args(args)
    logger.info("Exported %s to %s", args.model_dir, args.output_dir)


def main(argv: list[str] | None = None) -> int:
    return run_cli(_run, argv)


if __name__ == "__main__":
    sys.exit(main())
