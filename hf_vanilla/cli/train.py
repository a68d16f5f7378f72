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

import argparse
import sys
from typing import Any

from hf_vanilla.cli import (
    HelpFormatter,
    dataclass_parser,
    parse_into_dataclasses,
    quiet_unused_torchao,
    refuse_non_finite,
    run_cli,
)
from hf_vanilla.data.options import DataArguments
from hf_vanilla.hub.options import DatasetCardArguments
from hf_vanilla.training.options import TrainingModelArguments

EPILOG = "An error ends in one line; --log_level debug shows its traceback."
#: How the parser of a run and that of ``--help`` present the options.
PARSER_KWARGS: dict[str, Any] = {"description": __doc__, "epilog": EPILOG, "formatter_class": HelpFormatter}


def parser() -> argparse.ArgumentParser:
    """The parser of a training run and of its ``--help`` (imports transformers and torch: transformers'
    ``Seq2SeqTrainingArguments`` are among the options)."""
    from hf_vanilla.training.arguments import PaperTrainingArguments

    return dataclass_parser(
        (TrainingModelArguments, DataArguments, DatasetCardArguments, PaperTrainingArguments), **PARSER_KWARGS
    )


def train_and_score(
    model_args: Any, data_args: Any, training_args: Any, card_args: DatasetCardArguments | None = None
) -> dict[str, float]:
    """The steps of ``hf-vanilla-train``, all while the run holds ``--output_dir``
    (:func:`~hf_vanilla.training.run.run_folder`): train
    (:func:`~hf_vanilla.training.run.run_training`); with ``--do_eval``, score the trained model on the
    validation and test splits; with ``--average_last_n_checkpoints``, average the last checkpoints and
    score the average (``averaged_*``); with ``--push_to_hub``, publish the model the scores describe
    (the average, if any) from the main process, its card naming the data as ``card_args`` does. Returns
    the scores."""
    from hf_vanilla.training.run import average_run, evaluate_model, publish_run, run_folder, run_training

    repo_id = training_args.hub_model_id if training_args.push_to_hub else None  # checked by run_training
    card_args = card_args or DatasetCardArguments()
    results: dict[str, float] = {}
    with run_folder(model_args, training_args):
        scored = run_training(model_args, data_args, training_args, card_args)
        if training_args.do_eval:
            results |= evaluate_model(scored, model_args, data_args, training_args)
        if training_args.do_train and training_args.average_last_n_checkpoints:
            scored = average_run(training_args)
            results |= evaluate_model(scored, model_args, data_args, training_args, prefix="averaged_")
        if repo_id is not None and training_args.process_index == 0:
            publish_run(scored, data_args, training_args, card_args, repo_id)
    return results


def _run(argv: list[str]) -> None:
    quiet_unused_torchao()  # training does not use torchao
    real = parser()
    refuse_non_finite(real, argv)
    model_args, data_args, card_args, training_args = parse_into_dataclasses(real, argv)
    from hf_vanilla.training.launch_checks import end_process_group  # torch
    from hf_vanilla.training.resilience import StoppedBySignal
    from hf_vanilla.training.run import setup_logging

    setup_logging(training_args)
    stopped: int | None = None
    try:
        train_and_score(model_args, data_args, training_args, card_args)
    except StoppedBySignal as stop:  # every process saved the step and passed the callback's barrier
        stopped = int(stop.code)
    # Here the Trainer is garbage (the traceback that held it is gone), as end_process_group needs.
    # This process started the group (through TrainingArguments); any other exception skips this.
    end_process_group()
    if stopped is not None:
        raise SystemExit(stopped)


def main(argv: list[str] | None = None) -> int:
    # --debug is TrainingArguments' own option here; SaveOnSignalCallback handles SIGTERM while training
    return run_cli(_run, argv, debug_flag=False, catch_sigterm=False)


if __name__ == "__main__":
    sys.exit(main())
