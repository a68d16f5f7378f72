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

Many processes: `torchrun --nproc_per_node N` or `accelerate launch --num_processes N` (also over several
machines sharing a file system) split --input_file into contiguous parts written into OUTPUT.parts/, and
rank 0 joins them into --output_file; a job array runs --num_shards K --shard_id I per task, then the
same command with --merge. A relaunch skips the parts that were finished (docs/scaling.md).
"""

from __future__ import annotations

import functools
import logging
import sys
from dataclasses import asdict, dataclass, field

from hf_vanilla.cli import parse_arguments, run_cli
from hf_vanilla.inference.options import (
    DecodingOptions,
    InferenceModelArguments,
    ShardingArguments,
    check_nbest,
)
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


def _run(argv: list[str]) -> None:
    _, (model_args, decoding, io, sharding) = parse_arguments(
        argv, (InferenceModelArguments, DecodingOptions, IOArguments, ShardingArguments), __doc__
    )
    # After --help; torch only for the transformers backend (a CTranslate2 export starts in about a second).
    from hf_vanilla.inference import sharding as parts
    from hf_vanilla.inference.ctranslate2 import load_ctranslate2_and_tokenizer, resolve_backend
    from hf_vanilla.inference.streaming import (
        check_alignment_file,
        check_input_file,
        check_prefix_file,
        translate_stream,
    )

    shard = parts.resolve_shard(sharding)
    split = shard is not None or sharding.merge
    if split:
        _check_split_files(io)
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
    if split:  # the input checked whole, the parts' plan: before loading anything
        settings = parts.output_settings({**asdict(model_args), **asdict(decoding), **asdict(io)})
        plan = parts.plan_parts(
            io.input_file,
            io.output_file,
            settings,
            io.buffer_size,
            shard[1] if shard else 1,
            not sharding.merge,
        )
        if sharding.merge:
            parts.merge_parts(plan, io.output_file, io.alignment_file, sharding.num_shards)
            return
        model_args.device = parts.rank_device(model_args.device)
    if model_args.ensemble is None and resolve_backend(model_args) == "ctranslate2":
        model, tokenizer = load_ctranslate2_and_tokenizer(model_args)  # without importing torch
        described = model.describe(decoding)
    else:
        from hf_vanilla.inference.ensemble import EnsembleModel
        from hf_vanilla.inference.loading import load_for_translation

        model, tokenizer = load_for_translation(model_args)
        described = decoding.describe()
        if isinstance(model, EnsembleModel):
            described = f"ensemble of {len(model.members)} models, {described}"
    logging.getLogger(__name__).info("Decoding: %s", described)
    stream = functools.partial(
        translate_stream,
        model,
        tokenizer,
        io.input_file,
        options=decoding,
        batch_size=model_args.batch_size,
        device=model_args.device,
        chunk_lines=io.buffer_size,
        generate_kwargs={} if io.max_length is None else {"max_new_tokens": io.max_length},
        nbest=io.nbest,
        max_tokens=model_args.max_tokens,
        prefix_file=io.target_prefix_file,
        split_sentences=io.split_sentences,
    )
    if shard is None:
        stream(io.output_file, overwrite=io.overwrite, alignment_file=io.alignment_file)
        return
    parts.translate_shard(
        plan,
        io.output_file,
        *shard,
        lambda span, text, alignment: stream(text, overwrite=True, alignment_file=alignment, span=span),
        io.input_file,
        io.target_prefix_file,
    )
    if parts.launched() is None:
        logging.getLogger(__name__).info(
            "Shard %d of %d is translated; once every shard is, run the same command with --merge "
            "(in place of --shard_id) to write %s.",
            *shard,
            io.output_file,
        )
        return
    parts.wait_for_all_ranks()
    if shard[0] == 0:
        parts.merge_parts(plan, io.output_file, io.alignment_file)


def _check_split_files(io: IOArguments) -> None:
    """Refuse stdin, stdout or a pipe where a corpus is split between processes: each reads the input file
    by itself, and the output is joined from parts in a folder beside it."""
    from hf_vanilla.inference.streaming import check_input_file

    if io.input_file == "-" or io.output_file == "-":
        raise ValueError(
            "Splitting a corpus between processes (a launcher, --num_shards or --merge) needs --input_file FILE "
            "and --output_file FILE: each process reads the input itself, and the output is joined from parts "
            "beside it."
        )
    if not check_input_file(io.input_file):
        raise ValueError(
            f"--input_file {io.input_file!r} is a pipe, which only one process can read, once: write it to a file "
            "first to split it between processes."
        )


def main(argv: list[str] | None = None) -> int:
    return run_cli(_run, argv)


if __name__ == "__main__":
    sys.exit(main())
