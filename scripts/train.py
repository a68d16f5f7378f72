"""Train the Transformer with the paper's recipe (§5): Adam(0.9, 0.98, 1e-9), Eq. (3) learning rate with
4000 warmup steps, dropout 0.1, label smoothing 0.1, token-budget batches, BLEU during training (§6.1).

    python scripts/train.py --demo --preset base --d_model 64 --layers 2 --max_steps 2000 --output_dir runs/demo
    python scripts/train.py --train_files data/train --validation_files data/val --source_lang en \\
        --target_lang de --max_tokens 4096 --output_dir runs/base
    python scripts/train.py ... --resume_from_checkpoint last   # continue the run in --output_dir

Every option and its paper default: `python scripts/train.py --help`.
"""

from __future__ import annotations

from transformers import HfArgumentParser

from hf_vanilla.data import DataArguments
from hf_vanilla.launch_checks import LaunchError
from hf_vanilla.training import ModelArguments, PaperTrainingArguments, run_training, setup_logging


def main() -> None:
    parser = HfArgumentParser((ModelArguments, DataArguments, PaperTrainingArguments))
    model_args, data_args, training_args = parser.parse_args_into_dataclasses()
    setup_logging(training_args)
    try:
        run_training(model_args, data_args, training_args)
    except LaunchError as error:  # a launch that cannot be honoured: one line, nothing written
        raise SystemExit(f"train.py: error: {error}") from None


if __name__ == "__main__":
    main()
