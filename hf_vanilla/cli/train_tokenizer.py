"""Train the shared source+target byte-level BPE tokenizer (§5.1: ~37000 tokens for EN-DE).

    hf-vanilla-train-tokenizer --train_files data/multi30k/train \
        --source_lang en --target_lang de --vocab_size 8000 --output_dir runs/tokenizer-multi30k
    hf-vanilla-train-tokenizer --dataset_name wmt14 --dataset_config_name de-en --output_dir runs/tok
    hf-vanilla-train-tokenizer --demo --vocab_size 300 --output_dir runs/tokenizer-demo

The result loads with `AutoTokenizer.from_pretrained(output_dir)`.
"""

from __future__ import annotations

import logging
import sys

from hf_vanilla.cli import parse_arguments, run_cli
from hf_vanilla.data.options import DataArguments, TokenizerArguments
from hf_vanilla.io.atomic import refuse_to_replace, save_pretrained_atomic

logger = logging.getLogger(__name__)


def _run(argv: list[str]) -> None:
    _, (data_args, tok_args) = parse_arguments(argv, (DataArguments, TokenizerArguments), __doc__)
    from hf_vanilla.data.loading import load_from_args  # datasets and transformers, after --help
    from hf_vanilla.data.tokenization import train_tokenizer_from_dataset

    refuse_to_replace(  # before any work
        tok_args.output_dir, tok_args.overwrite, "--output_dir", inputs=data_args.input_paths()
    )
    data = load_from_args(data_args)
    tokenizer = train_tokenizer_from_dataset(
        data,
        data_args.source_lang,
        data_args.target_lang,
        vocab_size=tok_args.vocab_size,
        min_frequency=tok_args.min_frequency,
        split=tok_args.split,
        max_pairs=tok_args.max_pairs,
    )
    save_pretrained_atomic(tok_args.output_dir, tokenizer, checksums=True)  # load_tokenizer checks them
    logger.info("Saved a %d-token tokenizer to %s", len(tokenizer), tok_args.output_dir)


def main(argv: list[str] | None = None) -> int:
    return run_cli(_run, argv)


if __name__ == "__main__":
    sys.exit(main())
