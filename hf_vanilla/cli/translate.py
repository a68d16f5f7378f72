"""Translate text, one sentence per line, with the paper's decoding (§6.1: beam 4, α = 0.6, input length + 50).

hf-vanilla-translate --model_name_or_path runs/base < source.txt > hypotheses.txt
hf-vanilla-translate --model_name_or_path runs/base --input_file val.en --output_file val.hyp.de

Blank lines give blank lines. An existing --output_file is kept unless --overwrite is given.
"""

from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import dataclass, field

from transformers import HfArgumentParser

from hf_vanilla.cli import DEBUG_EPILOG, OVERWRITE_HELP, run_cli
from hf_vanilla.durability import refuse_to_replace
from hf_vanilla.translate import DecodingOptions, ModelArguments, load_model_and_tokenizer, translate_stream


@dataclass
class IOArguments:
    input_file: str = field(
        default="-", metadata={"help": "Source text, UTF-8, one sentence per line; '-' = stdin."}
    )
    output_file: str = field(
        default="-",
        metadata={"help": "Where translations go, one per line ('-' = stdout); written whole or not at all."},
    )
    overwrite: bool = field(default=False, metadata={"help": OVERWRITE_HELP})


class _Formatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    pass


def _run(argv: list[str]) -> None:
    parser = HfArgumentParser(
        (ModelArguments, DecodingOptions, IOArguments),
        description=__doc__,
        epilog=DEBUG_EPILOG,
        formatter_class=_Formatter,
    )
    model_args, decoding, io = parser.parse_args_into_dataclasses(args=argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    if io.output_file != "-":
        refuse_to_replace(io.output_file, io.overwrite, "--output_file")  # before loading anything
    model, tokenizer = load_model_and_tokenizer(model_args)
    logging.getLogger("translate").info("Decoding: %s", decoding.describe())
    translate_stream(
        model,
        tokenizer,
        io.input_file,
        io.output_file,
        decoding,
        model_args.batch_size,
        model_args.device,
        overwrite=io.overwrite,
    )


def main(argv: list[str] | None = None) -> int:
    return run_cli(_run, argv)


if __name__ == "__main__":
    sys.exit(main())
