r"""Translate a split with the paper's decoding (§6.1) and report corpus BLEU and chrF (sacreBLEU, offline).

    hf-vanilla-evaluate --model_name_or_path runs/base \
        --validation_files /work/shared/data/multi30k/val --source_lang en --target_lang de \
        --split validation --output_dir runs/base/eval

Writes <output_dir>/<split>.hyp.<target_lang> (one hypothesis per line) and
<output_dir>/<split>.results.json (scores, sacreBLEU signatures, decoding settings), which
hf-vanilla-publish puts on the model card.
"""

from __future__ import annotations

import argparse
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

from transformers import HfArgumentParser

from hf_vanilla.data import DataArguments, load_from_args
from hf_vanilla.evaluation import evaluate_dataset, write_results
from hf_vanilla.translate import DecodingOptions, ModelArguments, load_model_and_tokenizer


@dataclass
class EvalArguments:
    split: str = field(default="validation", metadata={"help": "Which split to translate and score."})
    output_dir: str | None = field(
        default=None, metadata={"help": "Where hypotheses and results go; default: <model>/eval."}
    )
    dataset_display_name: str | None = field(
        default=None, metadata={"help": "Name of the data on the model card, e.g. 'Multi30k (Task 1)'."}
    )


class _Formatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    pass


def main() -> None:
    parser = HfArgumentParser(
        (ModelArguments, DataArguments, DecodingOptions, EvalArguments), description=__doc__
    )
    model_args, data_args, decoding, eval_args = parser.parse_args_into_dataclasses()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    data = load_from_args(data_args)
    if eval_args.split not in data:
        raise SystemExit(
            f"Split {eval_args.split!r} not loaded; available: {sorted(data)}. Pass it with --split."
        )
    model, tokenizer = load_model_and_tokenizer(model_args)
    output_dir = Path(eval_args.output_dir or Path(model_args.model_name_or_path) / "eval")
    split, tgt = eval_args.split, data_args.target_lang
    results = evaluate_dataset(
        model,
        tokenizer,
        data[split],
        data_args.source_lang,
        tgt,
        options=decoding,
        batch_size=model_args.batch_size,
        device=model_args.device,
        hypotheses_file=output_dir / f"{split}.hyp.{tgt}",
    )
    results.update(
        split=split,
        source_lang=data_args.source_lang,
        target_lang=tgt,
        model=model_args.model_name_or_path,
        dataset_name=eval_args.dataset_display_name or data_args.dataset_name or "local files",
    )
    path = write_results(results, output_dir / f"{split}.results.json")
    summary = {
        key: results[key] for key in ("bleu", "chrf", "bleu_signature", "chrf_signature", "num_segments")
    }
    print(json.dumps({**summary, "decoding": decoding.describe(), "results_file": str(path)}, indent=2))


if __name__ == "__main__":
    main()
