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
* §5.1 batching: batches of about 25,000 source and 25,000 target tokens (``--max_tokens``,
  :mod:`hf_vanilla.batching`), optionally accumulated over several steps.
* §5.2 length: 100,000 steps for the base model (300,000 for big).
* §6.1: BLEU on the validation set during training, decoded with the model's generation config
  (beam 4, length penalty 0.6, max output length = source length + 50); averaging of the last
  checkpoints at the end (``--average_last_n_checkpoints``; the paper: 5 for base, 20 for big).
"""

from __future__ import annotations

import copy
import functools
import logging
import math
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import torch
import transformers
from accelerate.utils import broadcast_object_list
from transformers import (
    AutoModelForSeq2SeqLM,
    AutoTokenizer,
    DataCollatorForSeq2Seq,
    EvalPrediction,
    PreTrainedTokenizerBase,
    Seq2SeqTrainingArguments,
)
from transformers.integrations import is_tensorboard_available
from transformers.optimization import _get_inverse_sqrt_schedule_lr_lambda

from hf_vanilla.averaging import average_last_checkpoints, checkpoint_step
from hf_vanilla.batching import TokenBudgetSeq2SeqTrainer
from hf_vanilla.checkpointing import (
    ResilientTrainerMixin,
    SaveOnSignalCallback,
    last_complete_checkpoint,
    load_pretrained_checked,
    verify_checkpoint,
)
from hf_vanilla.configuration_vanilla_transformer import PRESETS, VanillaTransformerConfig
from hf_vanilla.data import DataArguments, load_from_args
from hf_vanilla.evaluation import compute_bleu_chrf
from hf_vanilla.launch_checks import check_fsdp_honoured, check_process_group
from hf_vanilla.modeling_vanilla_transformer import VanillaTransformerForConditionalGeneration
from hf_vanilla.tokenization import (
    check_tokenizer_matches_config,
    tokenize_translations,
    train_tokenizer_from_dataset,
)

logger = logging.getLogger(__name__)

__all__ = [
    "ModelArguments",
    "PaperLRLambda",
    "PaperSeq2SeqTrainer",
    "PaperTrainingArguments",
    "build_compute_metrics",
    "build_model",
    "create_paper_lr_scheduler",
    "paper_learning_rate",
    "paper_peak_learning_rate",
    "resolve_resume_checkpoint",
    "run_training",
    "setup_logging",
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

    preset: str = field(
        default="base",
        metadata={"help": f"Table 3 model size: one of {sorted(PRESETS)}. Explicit sizes below override it."},
    )
    model_name_or_path: str | None = field(
        default=None,
        metadata={"help": "Start from a saved model folder instead of a fresh one (its sizes are used)."},
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
        if self.preset not in PRESETS:
            raise ValueError(f"Unknown --preset {self.preset!r}: choose one of {sorted(PRESETS)}.")

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


_REPORT_TO = "tensorboard" if is_tensorboard_available() else "none"


@dataclass
class PaperTrainingArguments(Seq2SeqTrainingArguments):
    """``Seq2SeqTrainingArguments`` with the paper's recipe (§5.2–§5.4, §6.1) as defaults."""

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
    max_tokens: int | None = field(
        default=None,
        metadata={
            "help": "Token budget per batch and process: batch size × (longest source + longest target), "
            "padding included; replaces per_device_train_batch_size. The paper's ~25000 source + 25000 "
            "target tokens per step over 8 GPUs (§5.1) is about 6250 per process."
        },
    )

    def __post_init__(self) -> None:
        super().__post_init__()
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
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"--max_tokens must be a positive number of tokens, got {self.max_tokens}.")


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
      model's generation config with HF's global defaults (``max_length=20``, ...) after the
      first batch, which would cut every later translation at 20 tokens and replace the §6.1 bound
      of source length + 50 (and be saved with the model). The generation config is restored
      after every step.
    * A run that asked for FSDP but would not be sharded (accelerate on CPU) is refused with a
      :class:`~hf_vanilla.launch_checks.LaunchError` as soon as the Accelerator exists, before the
      output folder is created (:func:`~hf_vanilla.launch_checks.check_fsdp_honoured`).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
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
            return super().prediction_step(model, inputs, prediction_loss_only, ignore_keys, **gen_kwargs)
        finally:
            self.model.generation_config = saved

    def evaluation_loop(self, *args: Any, **kwargs: Any) -> Any:
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


def resolve_resume_checkpoint(resume_from_checkpoint: str | None, output_dir: str | Path) -> str | None:
    """The checkpoint to resume from, checked before any work is done.

    ``None`` starts afresh, but only into an ``output_dir`` without checkpoints (nothing is
    overwritten); ``"last"`` (or ``"true"``) picks the newest ``checkpoint-<step>`` in ``output_dir``;
    anything else must be a checkpoint folder written by the Trainer.
    """
    output_dir = Path(output_dir)
    if resume_from_checkpoint is None or str(resume_from_checkpoint).lower() in ("false", ""):
        if output_dir.is_dir() and any(checkpoint_step(p) is not None for p in output_dir.iterdir()):
            raise FileExistsError(
                f"{str(output_dir)!r} already holds checkpoints. Continue that run with "
                "--resume_from_checkpoint last, or choose a new --output_dir (nothing was overwritten)."
            )
        return None
    if str(resume_from_checkpoint).lower() in ("last", "true"):
        last = last_complete_checkpoint(output_dir) if output_dir.is_dir() else None  # whole ones only
        if last is None:
            raise FileNotFoundError(
                f"--resume_from_checkpoint {resume_from_checkpoint}: no checkpoint-<step> folder in "
                f"{str(output_dir)!r}. Check --output_dir, or drop --resume_from_checkpoint to start afresh."
            )
        return str(last)
    path = Path(resume_from_checkpoint)
    if not path.is_dir():
        raise FileNotFoundError(
            f"--resume_from_checkpoint {str(path)!r} does not exist. Give a checkpoint-<step> folder of an "
            "earlier run, or 'last' for the newest one in --output_dir."
        )
    if not (path / "trainer_state.json").is_file():
        raise FileNotFoundError(
            f"--resume_from_checkpoint {str(path)!r} is not a Trainer checkpoint (no trainer_state.json). To "
            "start from saved weights without the optimizer state, use --model_name_or_path instead."
        )
    verify_checkpoint(path)  # whole, and plain tensor data only: an error naming the file otherwise
    return str(path)


def load_or_train_tokenizer(
    model_args: ModelArguments,
    data: datasets.DatasetDict,
    data_args: DataArguments,
    resume_checkpoint: str | None,
    training_args: PaperTrainingArguments,
) -> PreTrainedTokenizerBase:
    """The tokenizer: given by path, else the one saved with the model or checkpoint, else a new
    shared BPE (§5.1) trained on both sides of the training split — by the main process only under
    data parallelism, which sends its files to the other ranks (no shared file system needed)."""
    source = model_args.tokenizer_name_or_path or resume_checkpoint or model_args.model_name_or_path
    if source is not None:
        logger.info("Loading the tokenizer from %s", source)
        return AutoTokenizer.from_pretrained(source)
    # Under data parallelism the main process trains it once and sends its files to every rank (no
    # shared file system needed); every rank, the main one included, loads the same files. A failure
    # on the main process is sent too, so that no rank waits for files that never come.
    processes = training_args.world_size
    message: list[dict[str, bytes] | str | None] = [None]
    if training_args.process_index == 0:
        logger.info(
            "Training a shared BPE tokenizer (%d tokens) on the training split, once for %d process(es)",
            model_args.tokenizer_vocab_size,
            processes,
        )
        try:
            tokenizer = train_tokenizer_from_dataset(
                data, data_args.source_lang, data_args.target_lang, vocab_size=model_args.tokenizer_vocab_size
            )
            if processes == 1:
                return tokenizer
            with tempfile.TemporaryDirectory() as folder:
                tokenizer.save_pretrained(folder)
                message = [{path.name: path.read_bytes() for path in Path(folder).iterdir()}]
        except Exception as error:
            if processes > 1:
                broadcast_object_list([f"{type(error).__name__}: {error}"], from_process=0)
            raise
    broadcast_object_list(message, from_process=0)
    files = message[0]
    if not isinstance(files, dict):
        raise RuntimeError(f"The main process failed to train the tokenizer ({files}); see its log.")
    with tempfile.TemporaryDirectory() as folder:
        for name, content in files.items():
            (Path(folder) / name).write_bytes(content)
        tokenizer = AutoTokenizer.from_pretrained(folder)
    logger.info("Loaded the tokenizer the main process trained (%d tokens)", len(tokenizer))
    return tokenizer


def build_model(
    model_args: ModelArguments, tokenizer: PreTrainedTokenizerBase, resume_checkpoint: str | None = None
) -> VanillaTransformerForConditionalGeneration:
    """A fresh model of the chosen size (vocabulary and special tokens from the tokenizer), or a saved
    one; ``config.label_smoothing`` is set to ``--label_smoothing`` either way."""
    saved = resume_checkpoint or model_args.model_name_or_path
    if saved is not None:
        model = load_pretrained_checked(saved)  # a damaged file: an error naming it
        model.config.label_smoothing = model_args.label_smoothing
    else:
        config = VanillaTransformerConfig.from_preset(
            model_args.preset,
            vocab_size=len(tokenizer),
            pad_token_id=tokenizer.pad_token_id,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            **model_args.config_overrides(),
        )
        model = VanillaTransformerForConditionalGeneration(config)
    check_tokenizer_matches_config(tokenizer, model.config)
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
        "Adam(β=(%g, %g), ε=%g), schedule %s with %s warmup steps",
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


def run_training(
    model_args: ModelArguments, data_args: DataArguments, training_args: PaperTrainingArguments
) -> dict[str, float]:
    """Train (or resume), save the final model, tokenizer and generation config in ``output_dir``,
    optionally average the last checkpoints, and evaluate on the validation and test splits.

    Returns all metrics (``train_*``, ``eval_*``, ``test_*``, ``averaged_eval_*``, ...). Processes a
    launcher started that form no process group are refused first
    (:func:`~hf_vanilla.launch_checks.check_process_group`).
    """
    check_process_group(training_args)
    resume = resolve_resume_checkpoint(training_args.resume_from_checkpoint, training_args.output_dir)
    if resume is not None:
        logger.info("Resuming from %s", resume)
    transformers.set_seed(training_args.seed)

    data = load_from_args(data_args)
    if training_args.do_train and "train" not in data:
        raise ValueError(
            f"No training split in the data (splits: {list(data)}); give --train_files or --demo."
        )
    tokenizer = load_or_train_tokenizer(model_args, data, data_args, resume, training_args)
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

    trainer = PaperSeq2SeqTrainer(
        model=model,
        args=training_args,
        train_dataset=train_set,
        eval_dataset=eval_set,
        processing_class=tokenizer,
        data_collator=DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=-100),
        compute_metrics=build_compute_metrics(tokenizer) if training_args.predict_with_generate else None,
    )
    if training_args.do_train:
        trainer.add_callback(SaveOnSignalCallback())  # preemption: save the current step, exit 143
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

    if training_args.average_last_n_checkpoints and training_args.do_train:
        averaged_dir = Path(training_args.output_dir) / "averaged"
        if trainer.is_world_process_zero():
            average_last_checkpoints(
                training_args.output_dir, training_args.average_last_n_checkpoints, averaged_dir
            )
        trainer.accelerator.wait_for_everyone()
        averaged = AutoModelForSeq2SeqLM.from_pretrained(averaged_dir)
        averaged_trainer = PaperSeq2SeqTrainer(
            model=averaged,
            args=training_args,
            eval_dataset=eval_set,
            processing_class=tokenizer,
            data_collator=DataCollatorForSeq2Seq(tokenizer, model=averaged, label_pad_token_id=-100),
            compute_metrics=build_compute_metrics(tokenizer) if training_args.predict_with_generate else None,
        )
        results.update(_evaluate_splits(averaged_trainer, eval_splits, prefix="averaged_"))
    return results
