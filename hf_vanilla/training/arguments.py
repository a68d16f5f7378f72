"""The recipe's arguments: the model to build and the paper's training defaults."""

from __future__ import annotations

from dataclasses import dataclass

from transformers import Seq2SeqTrainingArguments

from hf_vanilla.analysis.evaluation import check_bleu_tokenize
from hf_vanilla.io.numbers import refuse_out_of_bounds
from hf_vanilla.training.options import (
    TRAINING_BOUNDS,
    PaperRecipeArguments,
)
from hf_vanilla.training.precision import choose_bf16, trains_on_cpu

__all__ = ["PaperTrainingArguments"]


# --------------------------------------------------------------------------------------------------
# Arguments
# --------------------------------------------------------------------------------------------------
@dataclass
class PaperTrainingArguments(PaperRecipeArguments, Seq2SeqTrainingArguments):
    """``Seq2SeqTrainingArguments`` with the paper's recipe (§5.2–§5.4, §6.1) as defaults
    (:class:`~hf_vanilla.training.options.PaperRecipeArguments`). The training data as the model card names
    it is a separate set of options (:class:`~hf_vanilla.hub.options.DatasetCardArguments`), which
    ``hf-vanilla-train`` parses beside these and the Trainer records in ``training_args.json``."""

    def __post_init__(self) -> None:
        refuse_out_of_bounds(self, TRAINING_BOUNDS)  # before transformers reads them
        self.bf16 = choose_bf16(
            self.bf16, self.use_cpu
        )  # "auto" and the CPU check, before transformers reads it
        if self.bf16 and trains_on_cpu(self.use_cpu):
            self.use_cpu = (
                True  # the run trains on the CPU anyway; transformers refuses bf16 there without it
            )
        super().__post_init__()
        check_bleu_tokenize(self.bleu_tokenize)
        if self.label_smoothing_factor:
            raise ValueError(
                f"--label_smoothing_factor {self.label_smoothing_factor} would apply HF's LabelSmoother, which "
                "normalises per micro-batch and is wrong under gradient accumulation. Use --label_smoothing "
                "(model loss, paper default 0.1) and leave --label_smoothing_factor at 0."
            )
        if (
            self.average_last_n_checkpoints
            and self.save_total_limit is not None
            and self.save_total_limit < self.average_last_n_checkpoints
        ):
            raise ValueError(
                f"--average_last_n_checkpoints {self.average_last_n_checkpoints} needs at least that many "
                f"checkpoints kept, but --save_total_limit is {self.save_total_limit}. Raise --save_total_limit."
            )
        if self.do_train and self.max_steps == 0:
            raise ValueError(
                "--max_steps 0 trains nothing (nothing was done): give the number of training steps, or "
                "--do_train false to only evaluate a model."
            )
        if self.lr_cooldown_fraction and not self.max_train_minutes:
            raise ValueError(
                f"--lr_cooldown_fraction {self.lr_cooldown_fraction} is a fraction of the time budget, and no "
                "--max_train_minutes was given; nothing was done. Give --max_train_minutes, or drop the cool-down."
            )
        if self.lr_cooldown_fraction and self.lr_scheduler_type != "inverse_sqrt":
            raise ValueError(
                f"--lr_cooldown_fraction cools Eq. (3)'s schedule (--lr_scheduler_type inverse_sqrt), not "
                f"{self.lr_scheduler_type!r}; nothing was done. Drop one of the two."
            )
        if self.max_tokens == 0:
            self.max_tokens = None  # sentence-count batches (per_device_train_batch_size)
        if self.device.type == "cpu" and self.fp16:
            raise ValueError(
                "--fp16: this run trains on the CPU (--use_cpu, or no GPU found), where accelerate has no float16 "
                "mixed precision and would train in float32 while training_args.json says fp16; nothing was "
                "done. Drop --fp16, or use --bf16 auto (bfloat16 where the CPU computes it natively), or train "
                "on a GPU."
            )
        if self.device.type == "cpu":
            # Pinned memory only speeds up copies to an accelerator; on the CPU the DataLoader warns about it.
            self.dataloader_pin_memory = False
