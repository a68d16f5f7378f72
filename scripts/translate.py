"""Translate text, one sentence per line, with the paper's decoding (§6.1: beam 4, α = 0.6, input length + 50).

python scripts/translate.py --model_name_or_path runs/base < source.txt > hypotheses.txt
python scripts/translate.py --model_name_or_path runs/base --input_file val.en --output_file val.hyp.de
"""

from __future__ import annotations

import argparse
import logging
from dataclasses import dataclass, field

from transformers import HfArgumentParser

from hf_vanilla.translate import DecodingOptions, ModelArguments, load_model_and_tokenizer, translate_stream


@dataclass
class IOArguments:
    input_file: str = field(
        default="-", metadata={"help": "Source text, one sentence per line; '-' = stdin."}
    )
    output_file: str = field(
        default="-", metadata={"help": "Where translations go, one per line; '-' = stdout."}
    )


class _Formatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    pass


def main() -> None:
    parser = HfArgumentParser(
        (ModelArguments, DecodingOptions, IOArguments), description=__doc__, formatter_class=_Formatter
    )
    model_args, decoding, io = parser.parse_args_into_dataclasses()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    model, tokenizer = load_model_and_tokenizer(model_args)
    logging.getLogger("translate").info("Decoding: %s", decoding.describe())
    translate_stream(
        model, tokenizer, io.input_file, io.output_file, decoding, model_args.batch_size, model_args.device
    )


if __name__ == "__main__":
    main()
