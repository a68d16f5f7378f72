"""The paper's training recipe (Vaswani et al., 2017, §5) on the Hugging Face ``Seq2SeqTrainer``.

Defaults are the paper's, all overridable on the command line (``scripts/train.py --help``):

* §5.3 optimizer: Adam with β1 = 0.9, β2 = 0.98, ε = 1e-9 (``AdamW`` with ``weight_decay=0`` is Adam).
* §5.3 Eq. (3) learning rate: lrate = d_model^-0.5 · min(step^-0.5, step · warmup_steps^-1.5), with
  warmup_steps = 4000. This is HF's ``inverse_sqrt`` schedule with peak learning rate
  d_model^-0.5 · warmup_steps^-0.5, evaluated one step later (see :class:`PaperLRLambda`).
* §5.4 regularisation: dropout P_drop = 0.1 (the model config's ``dropout``; 0.3 for the big model)
  and label smoothing ε_ls = 0.1. Smoothing lives in the model's loss (``config.label_smoothing``),
  not in ``TrainingArguments.label_smoothing_factor``: HF's ``LabelSmoother`` averages per batch
  and so weighs micro-batches wrongly under gradient accumulation; the model divides the summed
  loss by the Trainer's ``num_items_in_batch`` instead.
* §5.3 no gradient clipping (tensor2tensor's ``clip_grad_norm = 0``): ``max_grad_norm = 0``
  (HF's default is 1.0).
* §5.1 batching: token-budget batches (``--max_tokens``, :mod:`hf_vanilla.batching`) of at most
  6,250 padded source + target tokens per process and micro-step: the paper's ≈ 25,000 source +
  25,000 target tokens per step were spread over 8 GPUs. One optimizer step sees
  ``max_tokens × processes × gradient_accumulation_steps`` tokens, so on one device
  ``--gradient_accumulation_steps 8`` gives the paper's step. ``--max_tokens 0`` goes back to
  sentence-count batches (``--per_device_train_batch_size``).
* §5.2 length: 100,000 steps for the base model (300,000 for big).
* §6.1: BLEU on the validation set during training, decoded with the model's generation config
  (beam 4; length penalty α = 0.6 applied as HF's log P / |Y|^α, not the GNMT formula
  ((5 + |Y|) / 6)^α the paper cites, which ``scripts/evaluate_bleu.py --length_penalty_type gnmt``
  applies; max output length = source length + 50; stop when no better hypothesis can appear);
  averaging of the last checkpoints at the end (``--average_last_n_checkpoints``; the paper: 5 for
  base, 20 for big).
* Evaluation logs ``eval_loss`` (label-smoothed, what is trained) and beside it ``eval_nll_loss``,
  the unsmoothed negative log-likelihood per target token, and ``eval_ppl`` = exp(eval_nll_loss).
"""

from __future__ import annotations

import copy
import functools
import logging
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import torch
import transformers
from transformers import (
    AutoConfig,
    AutoModelForSeq2SeqLM,
    DataCollatorForSeq2Seq,
    EvalPrediction,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    Seq2SeqTrainingArguments,
)
from transformers.integrations import is_tensorboard_available
from transformers.optimization import _get_inverse_sqrt_schedule_lr_lambda
from transformers.trainer import TRAINING_ARGS_NAME
from transformers.trainer_utils import EvalLoopOutput, HubStrategy

from hf_vanilla.averaging import average_last_checkpoints
from hf_vanilla.batching import TokenBudgetSeq2SeqTrainer
from hf_vanilla.configuration_vanilla_transformer import PRESETS, VanillaTransformerConfig
from hf_vanilla.data import DataArguments, load_from_args
from hf_vanilla.durability import (
    ResilientTrainerMixin,
    SaveOnSignalCallback,
    find_complete_checkpoints,
    hold_run_dir,
    refuse_to_replace,
    resolve_resume_checkpoint,
)
from hf_vanilla.evaluation import (
    check_bleu_tokenize,
    compute_bleu_chrf,
    evaluate_split_into,
    parallel_columns,
)
from hf_vanilla.hub import (
    TRAINING_ARGS_JSON,
    DatasetCardArguments,
    PublishArguments,
    card_data_recorded_in,
    dataset_card_from_args,
    finish_model_folder,
    limit_tokenizer_length,
    publish,
    push_to_hub,
    registered_for_remote_code,
    summarize_training,
)
from hf_vanilla.launch_checks import check_fsdp_honoured, check_process_group
from hf_vanilla.modeling_vanilla_transformer import VanillaTransformerForConditionalGeneration
from hf_vanilla.safe_loading import checkpoint_step, load_pretrained_checked, verify_model_folder
from hf_vanilla.tokenization import (
    check_tokenizer_matches_config,
    load_or_train_tokenizer,
    tokenize_translations,
)
from hf_vanilla.translate import DecodingOptions

logger = logging.getLogger(__name__)

#: ``--push_to_hub``: the folder in ``output_dir`` that is written with :func:`hf_vanilla.hub.publish` and pushed.
HUB_FOLDER = "hub"

__all__ = [
    "HUB_FOLDER",
    "ModelArguments",
    "PaperLRLambda",
    "PaperSeq2SeqTrainer",
    "PaperTrainingArguments",
    "TargetNLL",
    "build_compute_metrics",
    "build_model",
    "check_averaging_is_possible",
    "create_paper_lr_scheduler",
    "paper_learning_rate",
    "paper_peak_learning_rate",
    "planned_checkpoints",
    "publish_run",
    "run_training",
    "setup_logging",
    "take_hub_push",
]


# --------------------------------------------------------------------------------------------------
# §5.3 Eq. (3): the learning rate schedule
# --------------------------------------------------------------------------------------------------
def paper_learning_rate(step: int, d_model: int, warmup_steps: int = 4000) -> float:
    """§5.3 Eq. (3): lrate = d_model^-0.5 · min(step^-0.5, step · warmup_steps^-1.5), for step ≥ 1."""
    if step < 1:
        raise ValueError(f"Eq. (3) counts training steps from 1, got step={step}.")
    return d_model**-0.5 * min(step**-0.5, step * warmup_steps**-1.5)


def paper_peak_learning_rate(d_model: int, warmup_steps: int = 4000) -> float:
    """The maximum of Eq. (3), reached at step = warmup_steps: d_model^-0.5 · warmup_steps^-0.5
    (7.0e-4 for the base model, d_model = 512; 4.9e-4 for big, d_model = 1024)."""
    return d_model**-0.5 * warmup_steps**-0.5


class PaperLRLambda:
    """The multiplier of the peak learning rate for the update after ``completed`` updates.

    HF's ``inverse_sqrt`` schedule (``transformers.optimization``, with ``timescale`` =
    ``num_warmup_steps`` = w) is f(s) = s / w for s < w and (s / w)^-0.5 afterwards, so
    peak · f(s) equals Eq. (3) at step s exactly. The Trainer, however, evaluates the schedule at
    s = the number of *completed* updates: the first update would use f(0) = 0 and the k-th update
    the paper's rate for step k - 1. The paper's step count starts at 1 (tensor2tensor's "noam"
    schedule uses ``global_step + 1``), so this lambda evaluates HF's function at ``completed + 1``:
    the k-th update uses exactly Eq. (3) at step k, and the peak falls on update w.
    """

    def __init__(self, warmup_steps: int) -> None:
        if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int) or warmup_steps < 1:
            raise ValueError(
                f"The inverse square-root schedule of Eq. (3) needs warmup_steps >= 1, got {warmup_steps!r}."
            )
        self.warmup_steps = warmup_steps

    def __call__(self, completed: int) -> float:
        return _get_inverse_sqrt_schedule_lr_lambda(
            completed + 1, num_warmup_steps=self.warmup_steps, timescale=self.warmup_steps
        )


def create_paper_lr_scheduler(
    optimizer: torch.optim.Optimizer, warmup_steps: int
) -> torch.optim.lr_scheduler.LambdaLR:
    """Eq. (3) as a ``LambdaLR`` over the optimizer's learning rate (which must be the peak,
    :func:`paper_peak_learning_rate`, for the exact formula)."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, PaperLRLambda(warmup_steps))


# --------------------------------------------------------------------------------------------------
# Arguments
# --------------------------------------------------------------------------------------------------
@dataclass
class ModelArguments:
    """The model and its tokenizer. Sizes default to a Table 3 preset; explicit values override it."""

    preset: str | None = field(
        default=None,
        metadata={
            "help": f"Table 3 model size: one of {sorted(PRESETS)} (default: base). Explicit sizes below "
            "override it."
        },
    )
    model_name_or_path: str | None = field(
        default=None,
        metadata={
            "help": "Fine-tune a saved model folder instead of a fresh one. Its sizes are used: size flags that "
            "differ are refused; --dropout is applied."
        },
    )
    d_model: int | None = field(default=None, metadata={"help": "d_model (base 512, big 1024)."})
    layers: int | None = field(default=None, metadata={"help": "N, for encoder and decoder (paper: 6)."})
    attention_heads: int | None = field(default=None, metadata={"help": "h (base 8, big 16)."})
    ffn_dim: int | None = field(default=None, metadata={"help": "d_ff (base 2048, big 4096)."})
    dropout: float | None = field(default=None, metadata={"help": "P_drop, §5.4 (base 0.1, big 0.3)."})
    label_smoothing: float = field(
        default=0.1, metadata={"help": "ε_ls of §5.4, applied in the model's loss (paper: 0.1)."}
    )
    init_std: float | None = field(
        default=None,
        metadata={"help": "Standard deviation of the embedding initialisation (default: d_model^-0.5)."},
    )
    tokenizer_name_or_path: str | None = field(
        default=None,
        metadata={
            "help": "A saved tokenizer folder (e.g. from scripts/train_tokenizer.py); default: train one."
        },
    )
    tokenizer_vocab_size: int = field(
        default=37000,
        metadata={
            "help": "Size of the shared BPE vocabulary to train when no tokenizer is given (§5.1: ~37000)."
        },
    )
    max_source_length: int | None = field(
        default=None, metadata={"help": "Truncate source sentences to this many tokens (default: no limit)."}
    )
    max_target_length: int | None = field(
        default=None, metadata={"help": "Truncate target sentences to this many tokens (default: no limit)."}
    )

    def __post_init__(self) -> None:
        if self.preset is not None and self.preset not in PRESETS:
            raise ValueError(f"Unknown --preset {self.preset!r}: choose one of {sorted(PRESETS)}.")

    def requested_sizes(self) -> dict[str, tuple[str, Any]]:
        """Config field -> (flag, value) for the sizes asked for explicitly (``--preset`` and the size
        flags; an explicit size wins over the preset's), ``--init_std`` included: what a saved model
        must already have, since loading cannot change it."""
        requested: dict[str, tuple[str, Any]] = {}
        if self.preset is not None:
            for name, value in PRESETS[self.preset].items():
                if name != "dropout":
                    requested[name] = (f"--preset {self.preset}", value)
        for name, value in self.config_overrides().items():
            if name not in ("dropout", "label_smoothing"):
                flag = _SIZE_FLAGS.get(name, name)
                requested[name] = (f"--{flag} {value}", value)
        return requested

    def config_overrides(self) -> dict[str, Any]:
        """Config fields set explicitly by these arguments."""
        overrides: dict[str, Any] = {"label_smoothing": self.label_smoothing}
        if self.d_model is not None:
            overrides["d_model"] = self.d_model
        if self.layers is not None:
            overrides["encoder_layers"] = overrides["decoder_layers"] = self.layers
        if self.attention_heads is not None:
            overrides["encoder_attention_heads"] = overrides["decoder_attention_heads"] = self.attention_heads
        if self.ffn_dim is not None:
            overrides["encoder_ffn_dim"] = overrides["decoder_ffn_dim"] = self.ffn_dim
        if self.dropout is not None:
            overrides["dropout"] = self.dropout
        if self.init_std is not None:
            overrides["init_std"] = self.init_std
        return overrides


_SIZE_FLAGS = {
    "encoder_layers": "layers",
    "decoder_layers": "layers",
    "encoder_attention_heads": "attention_heads",
    "decoder_attention_heads": "attention_heads",
    "encoder_ffn_dim": "ffn_dim",
    "decoder_ffn_dim": "ffn_dim",
}
_REPORT_TO = "tensorboard" if is_tensorboard_available() else "none"

#: §5.1: "approximately 25000 source tokens and 25000 target tokens" per step, on 8 GPUs.
PAPER_MAX_TOKENS_PER_PROCESS = (25_000 + 25_000) // 8


@dataclass
class PaperTrainingArguments(DatasetCardArguments, Seq2SeqTrainingArguments):
    """``Seq2SeqTrainingArguments`` with the paper's recipe (§5.2–§5.4, §6.1) as defaults, and the training
    data as the model card names it (:class:`~hf_vanilla.hub.DatasetCardArguments`, required with
    ``--push_to_hub``; recorded in ``training_args.json``)."""

    learning_rate: float | None = field(
        default=None,
        metadata={
            "help": "Peak learning rate. Default: d_model^-0.5 · warmup_steps^-0.5, the maximum of Eq. (3) "
            "(7.0e-4 for base with 4000 warmup steps)."
        },
    )
    lr_scheduler_type: str = field(
        default="inverse_sqrt",
        metadata={
            "help": "'inverse_sqrt' is Eq. (3) of §5.3 exactly (see PaperLRLambda); any HF schedule works."
        },
    )
    warmup_steps: float = field(default=4000, metadata={"help": "warmup_steps of Eq. (3) (paper: 4000)."})
    adam_beta1: float = field(default=0.9, metadata={"help": "Adam β1 (§5.3: 0.9)."})
    adam_beta2: float = field(default=0.98, metadata={"help": "Adam β2 (§5.3: 0.98)."})
    adam_epsilon: float = field(default=1e-9, metadata={"help": "Adam ε (§5.3: 1e-9)."})
    weight_decay: float = field(default=0.0, metadata={"help": "0 makes AdamW the paper's Adam."})
    do_train: bool = field(default=True, metadata={"help": "Train (pass --do_train false to only evaluate)."})
    do_eval: bool = field(
        default=True, metadata={"help": "Evaluate on the validation and test splits after training."}
    )
    max_steps: int = field(default=100_000, metadata={"help": "Training steps (§5.2: base 100k, big 300k)."})
    label_smoothing_factor: float = field(
        default=0.0,
        metadata={"help": "Must stay 0: label smoothing is --label_smoothing (in the model's loss)."},
    )
    predict_with_generate: bool = field(
        default=True, metadata={"help": "Evaluate BLEU on generated translations (beam 4, α = 0.6, §6.1)."}
    )
    bleu_tokenize: str = field(
        default="13a",
        metadata={
            "help": "sacreBLEU's BLEU tokenizer for evaluation: 13a (WMT's), intl, char, zh, none, ..."
        },
    )
    eval_strategy: str = field(
        default="steps", metadata={"help": "When to evaluate: 'no', 'steps', 'epoch'."}
    )
    eval_steps: float | None = field(default=1000, metadata={"help": "Evaluate every N steps."})
    save_steps: float = field(
        default=1000, metadata={"help": "Checkpoint every N steps (the paper: every 10 minutes)."}
    )
    logging_steps: float = field(default=100, metadata={"help": "Log the loss every N steps."})
    report_to: None | str | list[str] = field(  # noqa: RUF036 (the order HfArgumentParser parses)
        default=_REPORT_TO,
        metadata={"help": "Where to log: 'tensorboard' (default when installed), 'none', ..."},
    )
    ddp_find_unused_parameters: bool | None = field(
        default=False, metadata={"help": "Every parameter is used in every step, so DDP need not search."}
    )
    average_last_n_checkpoints: int = field(
        default=0,
        metadata={
            "help": "After training, average the last N checkpoints into <output_dir>/averaged and evaluate "
            "it (§6.1: 5 for base, 20 for big; 0 = off)."
        },
    )
    max_grad_norm: float = field(
        default=0.0,
        metadata={
            "help": "Gradient clipping norm; 0 = none, as the paper (tensor2tensor: clip_grad_norm = 0)."
        },
    )
    max_tokens: int | None = field(
        default=PAPER_MAX_TOKENS_PER_PROCESS,
        metadata={
            "help": "Token budget per batch, process and micro-step: batch size × (longest source + longest "
            "target), padding included; replaces per_device_train_batch_size. The default is the paper's "
            "~25000 source + 25000 target tokens per step over its 8 GPUs (§5.1); one step sees max_tokens × "
            "processes × gradient_accumulation_steps. 0 = batches of per_device_train_batch_size sentences."
        },
    )
    overwrite: bool = field(
        default=False,
        metadata={
            "help": "Start a run in an --output_dir that is not empty (its files of the same name are replaced). "
            "Without it such a folder is refused; a folder with checkpoints of another run always is."
        },
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        check_bleu_tokenize(self.bleu_tokenize)
        if self.label_smoothing_factor:
            raise ValueError(
                f"--label_smoothing_factor {self.label_smoothing_factor} would apply HF's LabelSmoother, which "
                "normalises per micro-batch and is wrong under gradient accumulation. Use --label_smoothing "
                "(model loss, paper default 0.1) and leave --label_smoothing_factor at 0."
            )
        if self.average_last_n_checkpoints < 0:
            raise ValueError(
                f"--average_last_n_checkpoints must be >= 0, got {self.average_last_n_checkpoints}."
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
        if self.learning_rate is not None and self.learning_rate < 0:
            raise ValueError(f"--learning_rate must be >= 0, got {self.learning_rate}.")
        if self.max_tokens is not None and self.max_tokens < 0:
            raise ValueError(
                f"--max_tokens must be a number of tokens, or 0 for sentence-count batches; got {self.max_tokens}."
            )
        if self.max_tokens == 0:
            self.max_tokens = None  # sentence-count batches (per_device_train_batch_size)
        if self.device.type == "cpu":
            # Pinned memory only speeds up copies to an accelerator; on the CPU the DataLoader warns about it.
            self.dataloader_pin_memory = False


# --------------------------------------------------------------------------------------------------
# Evaluation: the unsmoothed NLL beside the label-smoothed loss
# --------------------------------------------------------------------------------------------------
class TargetNLL:
    """A forward hook (``register_forward_hook(..., with_kwargs=True)``) that reads, from a forward
    pass given ``labels``, the unsmoothed negative log-likelihood of the labels and their count, per
    sentence (-100 = ignored); :meth:`gather` collects them over processes after each batch."""

    def __init__(self) -> None:
        self.batch: tuple[torch.Tensor, torch.Tensor] | None = None  # (B,) NLL sums, (B,) token counts
        self.nll = 0.0
        self.tokens = 0

    def __call__(self, module: torch.nn.Module, args: tuple, kwargs: dict[str, Any], output: Any) -> None:
        labels, logits = kwargs.get("labels"), getattr(output, "logits", None)
        if labels is None or logits is None:  # e.g. generate()'s decoding steps
            return
        labels = labels.to(logits.device)
        with torch.no_grad():
            nll = torch.nn.functional.cross_entropy(
                logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1), reduction="none"
            )  # (B·T,), 0 where ignored
            self.batch = (nll.view(labels.shape).sum(dim=-1), (labels != -100).sum(dim=-1))

    def gather(self, accelerator: Any) -> None:
        """Add this batch's sums from every process (``gather_for_metrics``: the repeated sentences
        that even out the last batch are dropped)."""
        if self.batch is None:
            return
        nll, tokens = accelerator.gather_for_metrics(self.batch)
        self.nll += float(nll.double().sum())
        self.tokens += int(tokens.sum())
        self.batch = None

    def per_token(self) -> float | None:
        """The NLL per target token so far; ``None`` before any labelled batch."""
        return self.nll / self.tokens if self.tokens else None


# --------------------------------------------------------------------------------------------------
# The Trainer
# --------------------------------------------------------------------------------------------------
class PaperSeq2SeqTrainer(ResilientTrainerMixin, TokenBudgetSeq2SeqTrainer):
    """``Seq2SeqTrainer`` with token-budget batches (``args.max_tokens``, §5.1, see
    :mod:`hf_vanilla.batching`), Eq. (3) exactly, and the model's generation defaults kept intact.

    * ``learning_rate=None`` in the arguments means the peak of Eq. (3) for this model's d_model.
    * ``lr_scheduler_type="inverse_sqrt"`` uses :class:`PaperLRLambda` (HF's schedule, one step
      later), so that update k gets Eq. (3) at step k.
    * Evaluation with ``predict_with_generate``: ``Seq2SeqTrainer.prediction_step`` fills the
      model's generation config with HF's global defaults (``max_length=20``, ``top_k=50``, ...)
      after the first batch, which would then be saved with the model. The model's ``generate()``
      keeps the §6.1 bound despite them (see its docstring); the generation config is restored
      after every step anyway, so that the saved one holds only the model's own settings.
    * Evaluation reports ``<prefix>_nll_loss``, the unsmoothed negative log-likelihood per target
      token over the whole evaluation set, and ``<prefix>_ppl`` = exp of it, beside the
      label-smoothed ``<prefix>_loss``. They are read from the logits of the forward pass that
      computes the loss (no second pass), and gathered over processes without the sentences
      Accelerate repeats to even out the last batch.
    * A run that asked for FSDP but would not be sharded (accelerate on CPU) is refused with a
      :class:`~hf_vanilla.launch_checks.LaunchError` as soon as the Accelerator exists, before the
      output folder is created (:func:`~hf_vanilla.launch_checks.check_fsdp_honoured`).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._target_nll: TargetNLL | None = None  # during evaluation only
        if self.args.learning_rate is None:
            d_model = self.model.config.d_model
            warmup = self._warmup_steps_for_peak()
            self.args.learning_rate = paper_peak_learning_rate(d_model, warmup)
            logger.info(
                "Peak learning rate d_model^-0.5 · warmup^-0.5 = %d^-0.5 · %d^-0.5 = %.3g (§5.3 Eq. 3).",
                d_model,
                warmup,
                self.args.learning_rate,
            )
        if self.args.learning_rate == 0 and self.args.do_train:
            logger.warning(
                "--learning_rate is 0: training will not change the weights (the schedule multiplies the peak "
                "rate). Leave it out for the peak of Eq. (3), or give the rate you meant."
            )

    def create_accelerator_and_postprocess(self) -> None:
        super().create_accelerator_and_postprocess()
        check_fsdp_honoured(self.accelerator, self.args)

    def _warmup_steps_for_peak(self) -> int:
        warmup = self.args.warmup_steps
        if 0 < warmup < 1:
            if self.args.max_steps <= 0:
                raise ValueError(
                    "A warmup ratio (--warmup_steps < 1) needs --max_steps to compute the peak rate."
                )
            warmup = math.ceil(self.args.max_steps * warmup)
        if warmup < 1:
            raise ValueError(
                "--learning_rate defaults to the peak of Eq. (3), d_model^-0.5 · warmup_steps^-0.5, which needs "
                "--warmup_steps >= 1; set --learning_rate explicitly otherwise."
            )
        return int(warmup)

    def create_scheduler(
        self, num_training_steps: int, optimizer: torch.optim.Optimizer | None = None
    ) -> torch.optim.lr_scheduler.LRScheduler:
        if self.lr_scheduler is None and self.args.lr_scheduler_type == "inverse_sqrt":
            if self.args.lr_scheduler_kwargs:
                raise ValueError(
                    "--lr_scheduler_kwargs is not used by the Eq. (3) schedule (inverse_sqrt with timescale = "
                    "warmup_steps); remove it or choose another --lr_scheduler_type."
                )
            warmup = self.args.get_warmup_steps(num_training_steps)
            self.lr_scheduler = create_paper_lr_scheduler(optimizer or self.optimizer, warmup)
            self._created_lr_scheduler = True
            return self.lr_scheduler
        return super().create_scheduler(num_training_steps, optimizer)

    def prediction_step(
        self,
        model: torch.nn.Module,
        inputs: dict[str, torch.Tensor | Any],
        prediction_loss_only: bool,
        ignore_keys: list[str] | None = None,
        **gen_kwargs: Any,
    ) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
        saved = copy.deepcopy(self.model.generation_config)
        try:
            step = super().prediction_step(model, inputs, prediction_loss_only, ignore_keys, **gen_kwargs)
        finally:
            self.model.generation_config = saved
        if self._target_nll is not None:
            self._target_nll.gather(self.accelerator)
        return step

    def evaluation_loop(
        self,
        dataloader: torch.utils.data.DataLoader,
        description: str,
        prediction_loss_only: bool | None = None,
        ignore_keys: list[str] | None = None,
        metric_key_prefix: str = "eval",
    ) -> EvalLoopOutput:
        """:meth:`_evaluation_loop_once`, plus ``<prefix>_nll_loss`` and ``<prefix>_ppl`` (see the class
        docstring) when the evaluation set has labels."""
        self._target_nll = TargetNLL()
        handle = self.model.register_forward_hook(self._target_nll, with_kwargs=True)
        try:
            output = self._evaluation_loop_once(
                dataloader, description, prediction_loss_only, ignore_keys, metric_key_prefix
            )
            nll = self._target_nll.per_token()
        finally:
            handle.remove()
            self._target_nll = None
        if nll is not None:
            output.metrics[f"{metric_key_prefix}_nll_loss"] = nll
            output.metrics[f"{metric_key_prefix}_ppl"] = math.exp(min(nll, 700.0))  # no float overflow
        return output

    def _evaluation_loop_once(self, *args: Any, **kwargs: Any) -> EvalLoopOutput:
        """Score every evaluation sentence exactly once under data parallelism.

        ``Seq2SeqTrainer.evaluate``/``predict`` (transformers 5.24) gather with ``accelerator.gather``,
        which keeps the examples Accelerate repeats to even out the last batch over the processes: with
        N processes and an evaluation set that is not a multiple of N × batch size, the first sentences
        would count twice in BLEU. ``gather_for_metrics`` drops the repeats; it is wrong only with
        ``num_return_sequences > 1``, which BLEU evaluation does not use.
        """
        returns = getattr(self, "_gen_kwargs", {}).get(
            "num_return_sequences", self.model.generation_config.num_return_sequences
        )
        if returns not in (None, 1):
            return super().evaluation_loop(*args, **kwargs)
        trainer_gather = self.gather_function
        self.gather_function = functools.partial(
            self.accelerator.gather_for_metrics, use_gather_object=self.args.eval_use_gather_object
        )
        try:
            return super().evaluation_loop(*args, **kwargs)
        finally:
            self.gather_function = trainer_gather  # this evaluation only

    def _save(self, output_dir: str | None = None, state_dict: dict | None = None) -> None:
        """Every model folder the Trainer writes (checkpoints, the final model) is self-contained, as
        :func:`hf_vanilla.hub.save_model_folder` writes it: the modeling and pipeline code with an
        ``auto_map``, the tokenizer's ``model_max_length`` from the model, and the training arguments as
        ``training_args.json`` instead of the Trainer's pickled ``training_args.bin``."""
        model = self.accelerator.unwrap_model(self.model, keep_torch_compile=False)
        if self.processing_class is not None:
            limit_tokenizer_length(self.processing_class, model.config)
        with registered_for_remote_code(model):
            super()._save(output_dir, state_dict)
        if self.args.should_save:
            folder = Path(output_dir if output_dir is not None else self.args.output_dir)
            (folder / TRAINING_ARGS_NAME).unlink(missing_ok=True)
            (folder / TRAINING_ARGS_JSON).write_text(self.args.to_json_string() + "\n", encoding="utf-8")
            finish_model_folder(folder)


# --------------------------------------------------------------------------------------------------
# Metrics
# --------------------------------------------------------------------------------------------------
def build_compute_metrics(
    tokenizer: PreTrainedTokenizerBase, bleu_tokenize: str = "13a"
) -> Callable[[EvalPrediction], dict[str, float]]:
    """``compute_metrics`` for generated translations: sacreBLEU BLEU and chrF (§6.1), exact-match
    accuracy and ``gen_len``, the mean length of the translations in tokens (special tokens not
    counted). Token ids are decoded with ``skip_special_tokens``. ``bleu_tokenize``: as in
    :func:`hf_vanilla.evaluation.compute_bleu_chrf`."""
    pad_id = tokenizer.pad_token_id
    special_ids = np.array(tokenizer.all_special_ids)

    def decode(ids: np.ndarray) -> list[str]:
        ids = np.where(ids < 0, pad_id, ids)  # -100 marks padding added by the Trainer
        return [text.strip() for text in tokenizer.batch_decode(ids, skip_special_tokens=True)]

    def compute_metrics(prediction: EvalPrediction) -> dict[str, float]:
        predictions = prediction.predictions
        if isinstance(predictions, tuple):
            predictions = predictions[0]
        if predictions.ndim != 2:
            raise ValueError(
                f"compute_metrics expects generated token ids (batch, length), got shape {predictions.shape}; "
                "evaluate with --predict_with_generate."
            )
        hypotheses = decode(predictions)
        references = decode(prediction.label_ids)
        scores = compute_bleu_chrf(hypotheses, references, bleu_tokenize=bleu_tokenize)
        # Beam search pads finished rows with </s> when the pad id is 0 (transformers treats 0 as
        # unset there), so the length is counted over non-special tokens.
        content = (predictions >= 0) & ~np.isin(predictions, special_ids)
        lengths = content.sum(axis=1)
        return {
            "bleu": scores["bleu"],
            "chrf": scores["chrf"],
            "exact_match": float(np.mean([h == r for h, r in zip(hypotheses, references, strict=True)])),
            "gen_len": float(np.mean(lengths)),
        }

    return compute_metrics


# --------------------------------------------------------------------------------------------------
# Setup
# --------------------------------------------------------------------------------------------------
def setup_logging(training_args: Seq2SeqTrainingArguments) -> None:
    """INFO-level logs on the main process (``--log_level`` overrides), ``--log_level_replica``
    (warnings by default) on the others, for Python, transformers and datasets."""
    logging.basicConfig(
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
        handlers=[logging.StreamHandler(sys.stdout)],
    )
    if training_args.should_log and training_args.log_level == "passive":
        level = logging.INFO
    else:
        level = training_args.get_process_log_level()
    logging.getLogger("hf_vanilla").setLevel(level)
    transformers.utils.logging.set_verbosity(
        level if training_args.log_level != "passive" else logging.WARNING
    )
    datasets.utils.logging.set_verbosity(logging.WARNING)


def planned_checkpoints(
    training_args: PaperTrainingArguments, resume_checkpoint: str | None = None
) -> int | None:
    """How many checkpoints the run will have when it ends: those it keeps from before the resumed step
    plus those it saves (``save_strategy="steps"``: every ``save_steps`` and at ``max_steps``).
    ``None`` when that is not known before training (epochs, ``"best"``, no ``max_steps``)."""
    strategy = str(getattr(training_args.save_strategy, "value", training_args.save_strategy))
    if strategy == "no":
        return 0
    if strategy != "steps" or training_args.max_steps <= 0 or not training_args.save_steps:
        return None
    max_steps, every = training_args.max_steps, training_args.save_steps
    every = math.ceil(max_steps * every) if every < 1 else int(every)
    start, kept = 0, 0
    if resume_checkpoint is not None:
        start = checkpoint_step(resume_checkpoint) or 0
        run_dir = Path(training_args.output_dir)
        kept = sum(1 for p in find_complete_checkpoints(run_dir) if (checkpoint_step(p) or 0) <= start)
    saved = max_steps // every - start // every + (1 if max_steps % every and max_steps > start else 0)
    return kept + max(saved, 0)


def check_averaging_is_possible(
    training_args: PaperTrainingArguments, resume_checkpoint: str | None = None
) -> None:
    """Refuse ``--average_last_n_checkpoints N`` before training when the run cannot have N checkpoints."""
    wanted = training_args.average_last_n_checkpoints
    if not wanted or not training_args.do_train:
        return
    planned = planned_checkpoints(training_args, resume_checkpoint)
    if planned is not None and planned < wanted:
        raise ValueError(
            f"--average_last_n_checkpoints {wanted} cannot be met: with --max_steps {training_args.max_steps}, "
            f"--save_strategy {getattr(training_args.save_strategy, 'value', training_args.save_strategy)} and "
            f"--save_steps {training_args.save_steps} the run will have {planned} checkpoint(s). Save more often "
            "(lower --save_steps), train longer, or average fewer."
        )


def _saved_model(model_args: ModelArguments, saved: str, resumed: bool) -> PreTrainedModel:
    """Load ``saved`` after checking the flags against its config: sizes (and ``--init_std``) that differ
    are refused, since loading cannot change them; ``--dropout`` is applied when fine-tuning and refused
    when resuming (a resumed run continues the one it was)."""
    verify_model_folder(saved)  # a damaged or unsafe file: an error naming it
    config = AutoConfig.from_pretrained(saved)
    what = f"the resumed checkpoint {saved}" if resumed else f"the model {saved}"
    differs: dict[str, list[str]] = {}
    for name, (flag, value) in model_args.requested_sizes().items():
        if getattr(config, name, None) != value:
            differs.setdefault(flag, []).append(f"{name} {getattr(config, name, None)}")
    dropout = model_args.dropout
    if dropout is not None and dropout != config.dropout and resumed:
        differs.setdefault(f"--dropout {dropout}", []).append(f"dropout {config.dropout}")
    if differs:
        found = "; ".join(f"{flag} (it has {', '.join(have)})" for flag, have in differs.items())
        hint = (
            "A resumed run continues with the settings it was started with: drop these flags, or fine-tune "
            "from the checkpoint with --model_name_or_path (where --dropout applies) into a new --output_dir."
            if resumed
            else "A loaded model keeps its sizes: drop these flags, or train a new model without "
            "--model_name_or_path."
        )
        raise ValueError(f"Flags that disagree with {what}: {found}. {hint}")
    kwargs: dict[str, Any] = {}
    if dropout is not None and dropout != config.dropout:
        logger.warning(
            "Fine-tuning %s with --dropout %g instead of its dropout %g.", saved, dropout, config.dropout
        )
        kwargs["dropout"] = dropout
    return load_pretrained_checked(saved, **kwargs)  # NaN weights or a config that disagrees: refused


def build_model(
    model_args: ModelArguments, tokenizer: PreTrainedTokenizerBase, resume_checkpoint: str | None = None
) -> VanillaTransformerForConditionalGeneration:
    """A fresh model of the chosen size (vocabulary and special tokens from the tokenizer), or a saved
    one (see :func:`_saved_model` for the flags); ``config.label_smoothing`` is set to
    ``--label_smoothing`` either way. The tokenizer must match the model's vocabulary and special
    tokens exactly (:func:`hf_vanilla.tokenization.check_tokenizer_matches_config`)."""
    saved = resume_checkpoint or model_args.model_name_or_path
    if saved is not None:
        model = _saved_model(model_args, saved, resumed=resume_checkpoint is not None)
        model.config.label_smoothing = model_args.label_smoothing
    else:
        config = VanillaTransformerConfig.from_preset(
            model_args.preset or "base",
            vocab_size=len(tokenizer),
            pad_token_id=tokenizer.pad_token_id,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            **model_args.config_overrides(),
        )
        model = VanillaTransformerForConditionalGeneration(config)
    sources = f"tokenizer {model_args.tokenizer_name_or_path}, model {saved}" if saved else None
    check_tokenizer_matches_config(tokenizer, model.config, sources)
    return model


def _describe(model: torch.nn.Module, training_args: PaperTrainingArguments, train_size: int) -> None:
    c = model.config
    n_params = sum(p.numel() for p in model.parameters())
    logger.info(
        "Model: d_model=%d, N=%d+%d layers, h=%d, d_ff=%d, P_drop=%.2f, ε_ls=%.2f, vocab=%d — %.2fM parameters",
        c.d_model,
        c.encoder_layers,
        c.decoder_layers,
        c.encoder_attention_heads,
        c.encoder_ffn_dim,
        c.dropout,
        c.label_smoothing,
        c.vocab_size,
        n_params / 1e6,
    )
    batch = (
        f"{training_args.max_tokens} tokens"
        if training_args.max_tokens
        else f"{training_args.per_device_train_batch_size} pairs"
    )
    logger.info(
        "Training on %d pairs: batches of %s per device × %d accumulation steps × %d processes, %d steps; "
        "Adam(β=(%g, %g), ε=%g), schedule %s with %s warmup steps, %s",
        train_size,
        batch,
        training_args.gradient_accumulation_steps,
        training_args.world_size,
        training_args.max_steps,
        training_args.adam_beta1,
        training_args.adam_beta2,
        training_args.adam_epsilon,
        training_args.lr_scheduler_type,
        training_args.warmup_steps,
        f"gradients clipped at norm {training_args.max_grad_norm:g}"
        if training_args.max_grad_norm
        else "no gradient clipping",
    )


def _evaluate_splits(
    trainer: PaperSeq2SeqTrainer, splits: dict[str, datasets.Dataset], prefix: str = ""
) -> dict[str, float]:
    results: dict[str, float] = {}
    for name, dataset in splits.items():
        key = f"{prefix}{'eval' if name == 'validation' else name}"
        metrics = trainer.evaluate(dataset, metric_key_prefix=key)
        trainer.log_metrics(key, metrics)
        trainer.save_metrics(key, metrics)
        results.update(metrics)
    return results


def _paper_trainer(
    model: PreTrainedModel,
    training_args: PaperTrainingArguments,
    tokenizer: PreTrainedTokenizerBase,
    train_set: datasets.Dataset | None,
    eval_set: datasets.Dataset | None,
) -> PaperSeq2SeqTrainer:
    """The trainer of ``run_training``: labels padded with -100 by the collator, BLEU/chrF from
    generation when ``--predict_with_generate``."""
    return PaperSeq2SeqTrainer(
        model=model,
        args=training_args,
        train_dataset=train_set,
        eval_dataset=eval_set,
        processing_class=tokenizer,
        data_collator=DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=-100),
        compute_metrics=build_compute_metrics(tokenizer, training_args.bleu_tokenize)
        if training_args.predict_with_generate
        else None,
    )


def _has_validation_split(data_args: DataArguments) -> bool:
    """Whether the data arguments give a validation split (a Hub dataset's is known once loaded)."""
    if data_args.max_eval_samples == 0:
        return False
    if data_args.demo:
        return data_args.demo_validation_size > 0
    return bool(data_args.validation_files) or not data_args.local_files()


_NO_VALIDATION_TO_PUBLISH = (
    "--push_to_hub puts the trained model's validation BLEU on the model card, and this run has no validation "
    "split: give --validation_files (or a dataset with a validation split), and no --max_eval_samples 0."
)


def take_hub_push(training_args: PaperTrainingArguments, data_args: DataArguments) -> str | None:
    """The Hub repo that ``--push_to_hub`` asks for, checked before any work, or ``None``.

    The run then pushes through :func:`publish_run` (the folder and card of ``hf-vanilla-publish``), so the
    Trainer's own push, which would upload ``output_dir`` without the code files and card (and create the
    repo when the Trainer is built), is turned off here. Refused in one line: no ``--hub_model_id``, no or
    incomplete card data (``--dataset``, as ``hf-vanilla-publish`` refuses it), a ``--hub_strategy`` that
    asks for checkpoint pushes, no training, no validation split to score, and an existing
    ``<output_dir>/hub`` without ``--overwrite``. ``--hub_revision`` names the branch pushed to.
    """
    if not training_args.push_to_hub:
        return None
    if not training_args.hub_model_id:
        raise ValueError("--push_to_hub needs --hub_model_id (e.g. 'user/transformer-base-en-de').")
    dataset_card_from_args(training_args)
    if training_args.hub_strategy in (HubStrategy.CHECKPOINT, HubStrategy.ALL_CHECKPOINTS):
        raise ValueError(
            f"--hub_strategy {training_args.hub_strategy.value}: hf-vanilla-train pushes once, when training ends "
            "(the scored model with its card), never checkpoints; leave --hub_strategy out, and to share a "
            "checkpoint upload its folder with `hf upload`."
        )
    if not training_args.do_train:
        raise ValueError(
            "--push_to_hub publishes the model this run trains, and --do_train is false: publish a saved model "
            "with hf-vanilla-evaluate and hf-vanilla-publish."
        )
    if not _has_validation_split(data_args):
        raise ValueError(_NO_VALIDATION_TO_PUBLISH)
    refuse_to_replace(Path(training_args.output_dir) / HUB_FOLDER, training_args.overwrite, "The Hub folder")
    training_args.push_to_hub = False
    return training_args.hub_model_id


def publish_run(
    model_dir: str | Path,
    tokenizer: PreTrainedTokenizerBase,
    validation: datasets.Dataset,
    data_args: DataArguments,
    training_args: PaperTrainingArguments,
    repo_id: str,
) -> Path:
    """Score the saved model ``model_dir`` on ``validation`` as ``hf-vanilla-evaluate`` does (the paper's
    decoding; ``<output_dir>/validation.results.json`` and ``validation.hyp.<target_lang>``), write
    ``<output_dir>/hub`` with :func:`hf_vanilla.hub.publish` from those results and the run's card data,
    and push it to ``repo_id``. Returns the folder; raises :class:`~hf_vanilla.hub.HubPushError` (one line
    naming the command to retry; the folder and the training output are kept) when the push fails."""
    output_dir = Path(training_args.output_dir)
    card_args = {f.name: getattr(training_args, f.name) for f in fields(DatasetCardArguments)}
    model = AutoModelForSeq2SeqLM.from_pretrained(model_dir)
    sources, references = parallel_columns(validation, data_args.source_lang, data_args.target_lang)
    _, results_file = evaluate_split_into(
        output_dir,
        model,
        tokenizer,
        sources,
        references,
        split="validation",
        source_lang=data_args.source_lang,
        target_lang=data_args.target_lang,
        model_name=str(model_dir),
        dataset_name=dataset_card_from_args(training_args).name,
        options=DecodingOptions(),
        batch_size=training_args.per_device_eval_batch_size,
        device=str(training_args.device),
        bleu_tokenize=training_args.bleu_tokenize,
    )
    summary = summarize_training(output_dir)
    if summary and training_args.average_last_n_checkpoints:
        summary += f" The weights are the average of its last {training_args.average_last_n_checkpoints} checkpoints."
    args = PublishArguments(
        output_dir=str(output_dir / HUB_FOLDER),
        results_files=[str(results_file)],
        hub_model_id=repo_id,
        overwrite=training_args.overwrite,
        training_summary=summary,
        **card_args,
    )
    folder = publish(model, tokenizer, args, model_dir=model_dir)
    push_to_hub(
        folder,
        repo_id,
        private=training_args.hub_private_repo,
        token=training_args.hub_token,
        revision=training_args.hub_revision,
    )
    return folder


def run_training(
    model_args: ModelArguments, data_args: DataArguments, training_args: PaperTrainingArguments
) -> dict[str, float]:
    """Train (or resume), save the final model, tokenizer and generation config in ``output_dir``,
    optionally average the last checkpoints, evaluate on the validation and test splits, and with
    ``--push_to_hub`` publish the model the scores describe (the averaged one, if any) through
    :func:`publish_run` on the main process.

    Returns all metrics (``train_*``, ``eval_*``, ``test_*``, ``averaged_eval_*``, ...). Processes a
    launcher started that form no process group are refused first
    (:func:`~hf_vanilla.launch_checks.check_process_group`), then everything
    :func:`take_hub_push` checks. The run holds ``output_dir`` (:func:`~hf_vanilla.durability.hold_run_dir`):
    a second run into it while this one lives is refused with
    :class:`~hf_vanilla.durability.RunInUseError`. A step with a non-finite loss or gradient norm, or
    non-finite weights at a save, stops the run with :class:`~hf_vanilla.durability.NonFiniteTrainingError`
    before anything is saved.
    """
    check_process_group(training_args)
    if training_args.resume_from_checkpoint in (None, "", "false", "False"):  # the kind, and no input in it
        refuse_to_replace(
            training_args.output_dir, True, "--output_dir", inputs=[model_args.model_name_or_path]
        )
    # One launch per output folder: its main process holds a lock on it until the run ends.
    with hold_run_dir(training_args.output_dir, hold=training_args.process_index == 0):
        return _run_training(model_args, data_args, training_args)


def _run_training(
    model_args: ModelArguments, data_args: DataArguments, training_args: PaperTrainingArguments
) -> dict[str, float]:
    resume = resolve_resume_checkpoint(
        training_args.resume_from_checkpoint, training_args.output_dir, training_args.overwrite
    )
    if resume is not None:
        logger.info("Resuming from %s", resume)
        card_data_recorded_in(resume, training_args)  # unless given again
    check_averaging_is_possible(training_args, resume)
    hub_repo = take_hub_push(training_args, data_args)  # before the Trainer exists: its own push stays off
    transformers.set_seed(training_args.seed)

    data = load_from_args(data_args)
    if training_args.do_train and "train" not in data:
        raise ValueError(
            f"No training split in the data (splits: {list(data)}); give --train_files or --demo."
        )
    if hub_repo is not None and len(data.get("validation", ())) == 0:
        raise ValueError(_NO_VALIDATION_TO_PUBLISH)
    tokenizer = load_or_train_tokenizer(  # given by path, else saved with the checkpoint or model, else new
        (model_args.tokenizer_name_or_path, resume, model_args.model_name_or_path),
        data,
        data_args,
        model_args.tokenizer_vocab_size,
        training_args,
    )
    model = build_model(model_args, tokenizer, resume)
    tokenized = tokenize_translations(
        data,
        tokenizer,
        data_args.source_lang,
        data_args.target_lang,
        max_source_length=model_args.max_source_length,
        max_target_length=model_args.max_target_length,
        desc="Tokenizing",
    )
    train_set = tokenized.get("train")
    eval_set = tokenized.get("validation")
    if training_args.eval_strategy != "no" and eval_set is None:
        raise ValueError(
            "Evaluation during training needs a validation split; give one or pass --eval_strategy no."
        )
    _describe(model, training_args, len(train_set) if train_set is not None else 0)

    trainer = _paper_trainer(model, training_args, tokenizer, train_set, eval_set)
    if training_args.do_train:
        trainer.add_callback(SaveOnSignalCallback())  # SIGTERM/Ctrl-C: save the current step, exit 143/130
    results: dict[str, float] = {}
    if training_args.do_train:
        train_result = trainer.train(resume_from_checkpoint=resume)
        trainer.save_model()  # model, tokenizer and generation config in output_dir
        trainer.log_metrics("train", train_result.metrics)
        trainer.save_metrics("train", train_result.metrics)
        trainer.save_state()
        results.update(train_result.metrics)

    eval_splits = {name: tokenized[name] for name in ("validation", "test") if name in tokenized}
    if training_args.do_eval:
        results.update(_evaluate_splits(trainer, eval_splits))

    scored_dir = Path(training_args.output_dir)  # the model the final scores describe
    if training_args.average_last_n_checkpoints and training_args.do_train:
        averaged_dir = scored_dir = Path(training_args.output_dir) / "averaged"
        if trainer.is_world_process_zero():
            average_last_checkpoints(  # this run's own folder: replaced when a resumed run ends again
                training_args.output_dir,
                training_args.average_last_n_checkpoints,
                averaged_dir,
                overwrite=True,
            )
        trainer.accelerator.wait_for_everyone()
        averaged = AutoModelForSeq2SeqLM.from_pretrained(averaged_dir)
        averaged_trainer = _paper_trainer(averaged, training_args, tokenizer, None, eval_set)
        results.update(_evaluate_splits(averaged_trainer, eval_splits, prefix="averaged_"))

    if hub_repo is not None and trainer.is_world_process_zero():
        publish_run(scored_dir, tokenizer, data["validation"], data_args, training_args, hub_repo)
    return results
