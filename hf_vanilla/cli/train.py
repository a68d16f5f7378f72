"""Train the Transformer with the paper's recipe (§5): Adam(0.9, 0.98, 1e-9), Eq. (3) learning rate with
4000 warmup steps, dropout 0.1, label smoothing 0.1, token-budget batches, BLEU during training (§6.1).

    hf-vanilla-train --demo --preset base --d_model 64 --layers 2 --max_steps 2000 --output_dir runs/demo
    hf-vanilla-train --train_files data/train --validation_files data/val --source_lang en \\
        --target_lang de --max_tokens 4096 --output_dir runs/base
    hf-vanilla-train ... --resume_from_checkpoint last   # continue the run in --output_dir

Ctrl-C (or SIGTERM) saves a checkpoint of the current step and exits; a second Ctrl-C exits at once.
A fresh run needs an empty or new --output_dir (--overwrite: a folder without checkpoints).

With --push_to_hub --hub_model_id USER/NAME and the data the card names (--dataset multi30k, or custom
with --dataset_id, --data_terms, --weights_license; checked before training, recorded in
training_args.json), the run scores its final model (the averaged one with --average_last_n_checkpoints)
on the validation split into OUTPUT_DIR/validation.results.json, writes OUTPUT_DIR/hub as
hf-vanilla-publish does and pushes it; a failed push ends in one line naming the command to retry:

    hf-vanilla-train ... --output_dir runs/base --push_to_hub --hub_model_id user/name --dataset multi30k

Every option and its paper default: `hf-vanilla-train --help`.
"""

from __future__ import annotations

import sys

from transformers import HfArgumentParser

from hf_vanilla.cli import refuse_non_finite, run_cli
from hf_vanilla.data.loading import DataArguments
from hf_vanilla.training.arguments import PaperTrainingArguments, TrainingModelArguments
from hf_vanilla.training.run import run_training, setup_logging


def _run(argv: list[str]) -> None:
    parser = HfArgumentParser(
        (TrainingModelArguments, DataArguments, PaperTrainingArguments),
        epilog="An error ends in one line; --log_level debug shows its traceback.",
    )
    refuse_non_finite(parser, argv)
    model_args, data_args, training_args = parser.parse_args_into_dataclasses(args=argv)
    setup_logging(training_args)
    run_training(model_args, data_args, training_args)


def main(argv: list[str] | None = None) -> int:
    # --debug is TrainingArguments' own option here; SaveOnSignalCallback handles SIGTERM while training
    return run_cli(_run, argv, debug_flag=False, catch_sigterm=False)


if __name__ == "__main__":
    sys.exit(main())
