r"""Translate a split with the paper's decoding (§6.1) and report corpus BLEU and chrF (sacreBLEU, offline).

    hf-vanilla-evaluate --model_name_or_path runs/base \
        --validation_files data/multi30k/val --source_lang en --target_lang de \
        --split validation --output_dir runs/base/eval

Without --output_dir the results go to <model>/eval, or for a training checkpoint RUN/checkpoint-<step>
to RUN/eval-checkpoint-<step> beside it: nothing is written into a checkpoint unless asked.

    hf-vanilla-evaluate --model_name_or_path runs/wmt --sacrebleu_test_set wmt14 --language_pair de-en \
        --bleu_tokenize intl --output_dir runs/wmt/eval

--sacrebleu_test_set takes a standard test set by its sacreBLEU name (sacreBLEU's own downloader and
cache; offline, only the cache). --bleu_tokenize is sacreBLEU's -tok (13a, intl, char, zh, none, ...);
the BLEU signature in the results names it. --tokenized_bleu 13a adds the paper's tokenized BLEU with
compound splitting (hf_vanilla.analysis.tokenized_bleu; docs/reproducing.md, "How the scores are computed"). Writes <output_dir>/<split>.hyp.<target_lang> (one hypothesis per line) and
<output_dir>/<split>.results.json (scores, sacreBLEU signatures, decoding settings and seconds), which
hf-vanilla-publish puts on the model card. Prints BLEU, chrF and the decoding time; compare stopping
rules with --early_stopping never|true|false. Existing result files are kept unless --overwrite is given.
With --ensemble B,C it scores the ensemble of --model_name_or_path, B and C (as hf-vanilla-translate
decodes it); its results name the members and have no weights fingerprint, so publish takes none.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from hf_vanilla.cli import parse_arguments, run_cli
from hf_vanilla.data.options import DataArguments
from hf_vanilla.inference.options import DecodingOptions, InferenceModelArguments
from hf_vanilla.io.atomic import OVERWRITE_HELP, refuse_to_replace


@dataclass
class EvalArguments:
    split: str = field(default="validation", metadata={"help": "Which split to translate and score."})
    output_dir: str | None = field(
        default=None,
        metadata={
            "help": "Where hypotheses and results go; default: <model>/eval, and for a training checkpoint "
            "RUN/checkpoint-<step> the folder RUN/eval-checkpoint-<step> beside it (nothing is written into a "
            "checkpoint unless you name a folder inside it)."
        },
    )
    dataset_display_name: str | None = field(
        default=None, metadata={"help": "Name of the data on the model card, e.g. 'Multi30k (Task 1)'."}
    )
    bleu_tokenize: str = field(
        default="auto",
        metadata={
            "help": "sacreBLEU's BLEU tokenizer: 13a (WMT's), intl, char, zh, none, ... (sacreBLEU's -tok), or "
            "'auto': char where every reference is one word (the numbers task), else 13a; the output names the one "
            "used."
        },
    )
    sacrebleu_test_set: str | None = field(
        default=None,
        metadata={
            "help": "Translate and score a sacreBLEU test set by name (e.g. wmt14) instead of the data arguments; "
            "the split is named after it."
        },
    )
    language_pair: str | None = field(
        default=None,
        metadata={
            "help": "With --sacrebleu_test_set: SRC-TGT, e.g. de-en (default: --source_lang-target_lang)."
        },
    )
    tokenized_bleu: str | None = field(
        default=None,
        metadata={
            "help": "Also report the paper's tokenized BLEU with compound splitting (after tensor2tensor's "
            "get_ende_bleu.sh; Table 2's scores) with this sacreBLEU tokenizer in place of Moses': 13a or intl."
        },
    )
    overwrite: bool = field(default=False, metadata={"help": OVERWRITE_HELP})


def default_output_dir(model: str | Path) -> Path:
    """``<model>/eval``; for a Trainer checkpoint ``RUN/checkpoint-<step>``, ``RUN/eval-checkpoint-<step>``
    (beside it: a checkpoint's folder holds what the run wrote, nothing else)."""
    from hf_vanilla.io.checkpoints import checkpoint_step  # torch, after --help

    model = Path(model)
    if checkpoint_step(model) is not None:
        return model.parent / f"eval-{model.name}"
    return model / "eval"


def _run(argv: list[str]) -> None:
    _, (model_args, data_args, decoding, eval_args) = parse_arguments(
        argv, (InferenceModelArguments, DataArguments, DecodingOptions, EvalArguments), __doc__
    )
    from hf_vanilla.analysis.evaluation import (  # sacreBLEU, evaluate and torch, after --help
        check_bleu_tokenize,
        check_tokenized_bleu,
        choose_bleu_tokenize,
        evaluate_split_into,
        load_sacrebleu_test_set,
        parallel_columns,
        result_files,
    )
    from hf_vanilla.data.loading import load_from_args, pair_location
    from hf_vanilla.inference.loading import load_for_translation
    from hf_vanilla.inference.translation import InputTooLongError, check_batching

    if eval_args.bleu_tokenize != "auto":
        check_bleu_tokenize(eval_args.bleu_tokenize)
    check_tokenized_bleu(eval_args.tokenized_bleu)
    check_batching(model_args.batch_size, model_args.max_tokens)
    if data_args.max_eval_samples is not None and data_args.max_eval_samples < 1:
        raise ValueError(
            f"--max_eval_samples {data_args.max_eval_samples}: evaluation scores at least 1 segment; give 1 or "
            "more, or leave it out to score the whole split."
        )
    test_set = eval_args.sacrebleu_test_set
    if test_set and eval_args.language_pair:
        if eval_args.language_pair.count("-") != 1:
            raise ValueError(f"--language_pair {eval_args.language_pair!r}: give SRC-TGT, e.g. de-en.")
        data_args.source_lang, data_args.target_lang = eval_args.language_pair.split("-")
    src, tgt = data_args.source_lang, data_args.target_lang
    split = test_set or eval_args.split
    output_dir = Path(eval_args.output_dir or default_output_dir(model_args.model_name_or_path))
    for path in result_files(output_dir, split, tgt):  # before any work
        refuse_to_replace(
            path, eval_args.overwrite, "The evaluation output", kind="file", inputs=data_args.input_paths()
        )
    if test_set:
        sources, references = load_sacrebleu_test_set(test_set, f"{src}-{tgt}")
        dataset_name = f"sacreBLEU {test_set} {src}-{tgt}"
    else:
        data = load_from_args(data_args)
        if split not in data:
            raise ValueError(f"Split {split!r} not loaded; available: {sorted(data)}. Pass it with --split.")
        sources, references = parallel_columns(data[split], src, tgt)
        dataset_name = data_args.dataset_name or "local files"
    bleu_tokenize, bleu_note = choose_bleu_tokenize(eval_args.bleu_tokenize, references)
    model, tokenizer = load_for_translation(model_args)
    try:
        results, path = evaluate_split_into(
            output_dir,
            model,
            tokenizer,
            sources,
            references,
            split=split,
            source_lang=src,
            target_lang=tgt,
            model_name=model_args.model_name_or_path
            if model_args.ensemble is None
            else f"ensemble of {model_args.model_name_or_path},{model_args.ensemble}",
            dataset_name=eval_args.dataset_display_name or dataset_name,
            options=decoding,
            batch_size=model_args.batch_size,
            max_tokens=model_args.max_tokens,
            device=model_args.device,
            bleu_tokenize=bleu_tokenize,
            tokenized_bleu_tokenizer=eval_args.tokenized_bleu,
        )
    except InputTooLongError as err:  # name the file and line, not "sentence N"
        files = data_args.local_files().get(split)
        if test_set:
            where = f"sacreBLEU {test_set} {src}-{tgt} source, line {err.index + 1}"
        elif files:
            where = pair_location(files, src, tgt, err.index)
        else:
            where = f"{dataset_name}, {split} example {err.index + 1}"
        raise InputTooLongError(err.index, err.length, err.limit, where) from None
    keys = ("bleu", "chrf", "decoding_seconds", "bleu_signature", "chrf_signature", "num_segments")
    keys += ("tokenized_bleu", "tokenized_bleu_method") if eval_args.tokenized_bleu else ()
    summary = {key: results[key] for key in keys}
    summary["bleu_tokenize"] = bleu_note
    described = results["decoding"]["description"]
    print(json.dumps({**summary, "decoding": described, "results_file": str(path)}, indent=2))


def main(argv: list[str] | None = None) -> int:
    return run_cli(_run, argv)


if __name__ == "__main__":
    sys.exit(main())
