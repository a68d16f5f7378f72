"""Translate text, one sentence per line, with the paper's decoding (§6.1: beam 4, α = 0.6, input length + 50).

hf-vanilla-translate --model_name_or_path runs/base < source.txt > hypotheses.txt
hf-vanilla-translate --model_name_or_path runs/base --input_file val.en --output_file val.hyp.de
hf-vanilla-translate --model_name_or_path runs/base-ct2 --nbest 4 --dtype float32   # a CTranslate2 export

Interactive: lines typed or piped into stdin are translated as they arrive (when --buffer_size lines wait,
when the input pauses for 0.1 s, or at its end). Blank lines give blank lines. With --nbest N each input
line gives N lines "INDEX<TAB>SCORE<TAB>TRANSLATION", best first (INDEX: the input line, from 0; SCORE:
log P / |Y|^α, or the GNMT penalty's with --length_penalty_type gnmt; CTranslate2: its own); a blank line gives
"INDEX<TAB><TAB>". With --do_sample (back-translation), --nbest N gives N samples per line. With
--target_prefix_file, each translation starts with its line's prefix. With --ensemble B,C the models of
--model_name_or_path, B and C translate together (their next-token probabilities averaged at each step).
An existing --output_file is kept unless --overwrite is given.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, field

from hf_vanilla.cli import parse_arguments, run_cli
from hf_vanilla.inference.options import DecodingOptions, InferenceModelArguments, check_nbest
from hf_vanilla.io.atomic import OVERWRITE_HELP, refuse_to_replace


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
    buffer_size: int = field(
        default=10_000,
        metadata={
            "help": "Translate when this many lines wait (stdin also when the input pauses, and at its end)."
        },
    )
    nbest: int | None = field(
        default=None,
        metadata={
            "help": "Write the N best translations per line with scores (N <= --num_beams); see above."
        },
    )
    max_length: int | None = field(
        default=None,
        metadata={
            "help": "At most this many output tokens (</s> included), below the input length + 50 bound."
        },
    )
    alignment_file: str | None = field(
        default=None,
        metadata={
            "aliases": ["--print_alignment", "--print-alignment"],
            "help": "Also write each translation's hard alignment here, one line per input line: SRC-TGT token "
            "indices from 0 (e.g. '0-0 2-1'), from the last decoder layer's cross-attention averaged over heads. "
            "--print_alignment FILE is the same option (fairseq's name). Not with --nbest.",
        },
    )
    split_sentences: str | None = field(
        default=None,
        metadata={
            "help": "A language code (en, de, fr, ...): split each line into its sentences with pysbd (pip install "
            "'hf_vanilla[split]'), translate them, and join them back with the whitespace between them."
        },
    )
    target_prefix_file: str | None = field(
        default=None,
        metadata={
            "help": "Target prefixes, UTF-8, one per input line (a blank line: none): each translation starts "
            "with its prefix's tokens and the rest is decoded (forced decoding; the prefix counts in the length "
            "bound)."
        },
    )
    ensemble: str | None = field(
        default=None,
        metadata={
            "help": "More model folders, separated by commas (e.g. runs/b,runs/c): translate with the ensemble of "
            "--model_name_or_path and these, their next-token distributions averaged at every step of the search. "
            "Same vocabulary; transformers backend."
        },
    )


def _run(argv: list[str]) -> None:
    _, (model_args, decoding, io) = parse_arguments(
        argv, (InferenceModelArguments, DecodingOptions, IOArguments), __doc__
    )
    # After --help; torch only for the transformers backend (a CTranslate2 export starts in about a second).
    from hf_vanilla.inference.ctranslate2 import load_ctranslate2_and_tokenizer, resolve_backend
    from hf_vanilla.inference.streaming import (
        check_alignment_file,
        check_input_file,
        check_prefix_file,
        translate_stream,
    )

    if io.output_file != "-":
        refuse_to_replace(  # before loading anything
            io.output_file, io.overwrite, "--output_file", kind="file", inputs=[io.input_file]
        )
    if io.input_file != "-":
        check_input_file(io.input_file)  # before loading anything
    if io.alignment_file is not None:  # before loading anything
        check_alignment_file(
            io.alignment_file, io.overwrite, io.nbest, [io.input_file, io.output_file, io.target_prefix_file]
        )
    if io.split_sentences is not None:  # pysbd installed, the language known: before loading anything
        from hf_vanilla.inference.translation import sentence_splitter

        sentence_splitter(io.split_sentences)
    if io.target_prefix_file is not None:
        check_prefix_file(io.target_prefix_file, io.input_file)  # before loading anything
    check_nbest(io.nbest, decoding.num_beams, decoding.do_sample)
    if io.max_length is not None and io.max_length < 1:
        raise ValueError(f"--max_length must be a positive number of tokens, got {io.max_length}.")
    if io.ensemble is not None:
        from hf_vanilla.inference.ensemble import load_ensemble, parse_ensemble

        folders = parse_ensemble(io.ensemble)
        model, tokenizer = load_ensemble(model_args, folders)
        described = f"ensemble of {len(folders) + 1} models, {decoding.describe()}"
    elif resolve_backend(model_args) == "ctranslate2":
        model, tokenizer = load_ctranslate2_and_tokenizer(model_args)
        described = model.describe(decoding)
    else:
        from hf_vanilla.inference.loading import load_model_and_tokenizer

        model, tokenizer = load_model_and_tokenizer(model_args)
        described = decoding.describe()
    logging.getLogger(__name__).info("Decoding: %s", described)
    translate_stream(
        model,
        tokenizer,
        io.input_file,
        io.output_file,
        decoding,
        model_args.batch_size,
        model_args.device,
        chunk_lines=io.buffer_size,
        generate_kwargs={} if io.max_length is None else {"max_new_tokens": io.max_length},
        overwrite=io.overwrite,
        nbest=io.nbest,
        max_tokens=model_args.max_tokens,
        prefix_file=io.target_prefix_file,
        alignment_file=io.alignment_file,
        split_sentences=io.split_sentences,
    )


def main(argv: list[str] | None = None) -> int:
    return run_cli(_run, argv)


if __name__ == "__main__":
    sys.exit(main())
