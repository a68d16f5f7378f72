"""The paper's Trainer (:class:`PaperSeq2SeqTrainer`, the one ``Trainer`` subclass): token-budget
batches (§5.1), label-smoothed loss, checkpoints that stay whole and resume, and the metrics computed at
evaluation."""

from __future__ import annotations

import contextlib
import copy
import functools
import json
import logging
import math
import os
import shutil
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import torch
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor
from torch.utils.data import DataLoader
from transformers import EvalPrediction, PreTrainedTokenizerBase, Seq2SeqTrainer
from transformers.trainer import OPTIMIZER_NAME, SCHEDULER_NAME, TRAINING_ARGS_NAME
from transformers.trainer_utils import EvalLoopOutput, has_length, seed_worker

from hf_vanilla.analysis.evaluation import compute_bleu_chrf
from hf_vanilla.data.batching import TokenBudgetBatchSampler, sequence_lengths
from hf_vanilla.hub.folder import (
    TRAINING_ARGS_JSON,
    finish_model_folder,
    limit_tokenizer_length,
)
from hf_vanilla.hub.record import MAX_EXAMPLES, write_training_record
from hf_vanilla.io.atomic import publish_directory
from hf_vanilla.io.checked_loading import untied_missing_keys
from hf_vanilla.io.checkpoints import (
    TRAINER_STATE_NAME,
    checkpoint_name,
    last_complete_checkpoint,
    verify_checkpoint,
)
from hf_vanilla.io.checksums import write_checksums
from hf_vanilla.training.checkpoints import (
    STAGING_DIR_NAME,
    _no_complete_checkpoint,
    check_optimizer_state,
    check_scheduler_state,
    rotate_checkpoints_by_step,
)
from hf_vanilla.training.launch_checks import check_fsdp_honoured
from hf_vanilla.training.resilience import (
    NonFiniteTrainingError,
    SaveOnSignalCallback,
    removed_when_the_disk_is_full,
)
from hf_vanilla.training.schedule import create_paper_lr_scheduler, paper_peak_learning_rate
from hf_vanilla.training.sharded_loading import load_full_state_dict_into_sharded, tie_state_dict
from hf_vanilla.training.time_budget import TrainingTimeBudget

logger = logging.getLogger(__name__)


__all__ = ["PaperSeq2SeqTrainer", "TargetNLL", "build_compute_metrics"]


# ----------------------------------------------------------------------------------------------------
# Trainer integration
# ----------------------------------------------------------------------------------------------------


def unshard_prepared_dataloader(dataloader: DataLoader, sampler: TokenBudgetBatchSampler) -> DataLoader:
    """Undo Accelerate's per-process re-sharding of an already rank-aware batch sampler (see module docstring)."""
    from accelerate.data_loader import BatchSamplerShard

    wrapper = getattr(dataloader, "batch_sampler", None)
    if isinstance(wrapper, BatchSamplerShard):
        if wrapper.batch_sampler is not sampler:
            raise RuntimeError(
                "Accelerate wrapped an unexpected batch sampler; token-budget batching cannot proceed."
            )
        wrapper.num_processes, wrapper.process_index = 1, 0
        # Forward set_epoch so that wrappers around this one (skip_first_batches on resume) reach the sampler.
        wrapper.set_epoch = sampler.set_epoch
    elif wrapper is not sampler:
        raise RuntimeError(
            f"Expected the prepared DataLoader to use the token-budget sampler, found {type(wrapper).__name__}."
        )
    return dataloader


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
class PaperSeq2SeqTrainer(Seq2SeqTrainer):
    """The paper's Trainer, the one ``Seq2SeqTrainer`` subclass of hf_vanilla: token-budget batches (§5.1),
    Eq. (3) exactly, the model's generation defaults kept intact, and checkpoints that stay whole.

    **Batches.** Training batches hold up to ``max_tokens`` padded tokens (:mod:`hf_vanilla.data.batching`).
    `max_tokens=None` takes `args.max_tokens` if the training arguments have that field; if that is None
    too, batching is the normal `per_device_train_batch_size` one. Lengths come from the
    train dataset's `input_ids` and `labels` columns, once per dataset. Works with one process and with
    N-process DDP (each rank gets its own batches, equally many), with gradient accumulation, and with
    `dataloader_drop_last` (see `TokenBudgetBatchSampler`). The shuffling seed is `data_seed`, else `seed`.
    Evaluation keeps sentence-count batches. `max_tokens` is checked once, by the sampler that
    consumes it (`--max_tokens` on the command line by `PaperTrainingArguments`).

    **The recipe.**
    * ``learning_rate=None`` in the arguments means the peak of Eq. (3) for this model's d_model.
    * ``lr_scheduler_type="inverse_sqrt"`` uses :class:`PaperLRLambda` (HF's schedule, one step
      later), so that update k gets Eq. (3) at step k.
    * ``max_train_minutes`` in the arguments adds a :class:`~hf_vanilla.training.time_budget.TrainingTimeBudget`
      callback (stop by the clock, with a checkpoint); with ``lr_cooldown_fraction`` the Eq. (3) rate is
      multiplied by its cool-down factor at each step (:class:`~hf_vanilla.training.schedule.ScaledLambdaLR`).
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
    * Evaluation with ``predict_with_generate`` of a model sharded with FSDP2 for evaluation only runs
      one forward pass of the first batch before generating, so that the model, not its first module
      ``generate()`` calls, becomes FSDP2's root (:meth:`_initialise_fsdp2_root`).
    * A run that asked for FSDP but would not be sharded (accelerate on CPU) is refused with a
      :class:`~hf_vanilla.training.launch_checks.LaunchError` as soon as the Accelerator exists, before the
      output folder is created (:func:`~hf_vanilla.training.launch_checks.check_fsdp_honoured`).

    **Checkpoints** (written, then renamed; checked before resuming; ``resume_from_checkpoint=True`` means
    the newest *whole* checkpoint):

    * ``checkpoint-<step>`` is written by all processes into ``<output_dir>/.incomplete-checkpoints/``;
      after a barrier the saving process adds ``checksums.sha256`` (``checkpoint_checksums``), renames
      the folder into ``output_dir`` (replacing a stale one of the same step left by an earlier,
      killed run) and only then deletes old checkpoints (``save_total_limit``).
    * Inside a checkpoint, the model folder is written and checked (no pickle in it) before any Trainer
      state: every process waits after the model is saved, so the others add their
      ``rng_state_<rank>.pth`` only then, as one process adds ``rng_state.pth`` and ``optimizer.pt``.
    * Old checkpoints are deleted by step (:func:`rotate_checkpoints_by_step`), not by the file times
      the Trainer's ``rotate_checkpoints(use_mtime=True)`` goes by.
    * The loss of every micro-step and the gradient norm of every step are checked for inf and nan
      where they are (no host synchronisation per step); the first bad step is read before anything
      is logged, evaluated or saved and when the run stops, and every save (checkpoints, the final
      model, the save on SIGTERM) first checks the weights: :class:`NonFiniteTrainingError` then
      stops the run with nothing written.
    * ``save_model()`` into a folder (the final model) writes to a temporary folder and moves each
      file into place with an atomic ``os.replace``.
    * ``train(resume_from_checkpoint=...)`` runs :func:`verify_checkpoint` first, so a damaged or
      unsafe checkpoint fails at once with the file's name; ``True`` picks
      :func:`last_complete_checkpoint`. DeepSpeed's own files (``global_step*/``) are trusted, with
      a warning: DeepSpeed loads them with full unpickling.
    * The checkpoint's optimizer and scheduler states are checked against this run's optimizer, model
      and scheduler as they are loaded, before the first step (:func:`check_optimizer_state`,
      :func:`check_scheduler_state`): one of another run is refused, naming the file.

    With ``push_to_hub`` the Trainer uploads from the checkpoint folder in the background, so
    checkpoints are then written in place, as the plain Trainer does.

    **Private Trainer methods it overrides** (docs/internals.md lists them with their guards):
    ``_get_output_dir``, ``_save_checkpoint``, ``_save``, ``_maybe_log_save_evaluate``,
    ``_load_from_checkpoint``, ``_load_optimizer_and_scheduler`` and ``_issue_warnings_after_load``; it
    calls ``_remove_unused_columns`` and ``_get_collator_with_removed_columns`` to prepare the
    token-budget loader's dataset.
    """

    checkpoint_checksums: bool = True
    _staging_run_dir: str | None = None
    #: The first step with a non-finite loss or gradient norm, kept where the values are (no host
    #: synchronisation per step) and read only before a log, evaluation, save or stop.
    _first_nonfinite: torch.Tensor | None = None
    _first_nonfinite_host: float = math.inf

    def __init__(
        self,
        *args: Any,
        max_tokens: int | None = None,
        sort_pool_size: int | None = None,
        max_sentences: int | None = None,
        recorded: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.recorded = dict(recorded or {})
        if max_tokens is None:
            max_tokens = getattr(self.args, "max_tokens", None)
        self.max_tokens, self.sort_pool_size, self.max_sentences = max_tokens, sort_pool_size, max_sentences
        self._length_cache: tuple[str, np.ndarray, np.ndarray] | None = None
        self._target_nll: TargetNLL | None = None  # during evaluation only
        self._fsdp2_roots: set[int] = set()  # models whose FSDP2 root is initialised
        minutes = getattr(self.args, "max_train_minutes", 0)
        if minutes:
            self.add_callback(TrainingTimeBudget(minutes, getattr(self.args, "lr_cooldown_fraction", 0)))
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

    def _train_lengths(self, dataset: Any) -> tuple[np.ndarray, np.ndarray]:
        key = getattr(dataset, "_fingerprint", None) or str(id(dataset))
        if self._length_cache is None or self._length_cache[0] != key:
            self._length_cache = (
                key,
                sequence_lengths(dataset, "input_ids"),
                sequence_lengths(dataset, "labels"),
            )
        return self._length_cache[1], self._length_cache[2]

    def token_budget_sampler(self) -> TokenBudgetBatchSampler:
        """This rank's sampler over the train dataset."""
        source, target = self._train_lengths(self.train_dataset)
        return TokenBudgetBatchSampler(
            source,
            target,
            self.max_tokens,
            num_replicas=max(1, self.args.world_size),
            rank=self.args.process_index,
            seed=self.args.data_seed if self.args.data_seed is not None else self.args.seed,
            sort_pool_size=self.sort_pool_size,
            max_sentences=self.max_sentences,
            drop_last=self.args.dataloader_drop_last,
        )

    def get_train_dataloader(self) -> DataLoader:
        if self.max_tokens is None:
            return super().get_train_dataloader()
        if self.train_dataset is None:
            raise ValueError("Trainer: training requires a train_dataset.")
        if isinstance(self.train_dataset, torch.utils.data.IterableDataset) or not has_length(
            self.train_dataset
        ):
            raise ValueError(
                "Token-budget batching needs a map-style train dataset with a length (lengths are read up front); "
                "got an iterable dataset. Pass a datasets.Dataset, or set max_tokens=None."
            )
        dataloader_config = self.accelerator.dataloader_config
        if dataloader_config.split_batches or dataloader_config.dispatch_batches:
            raise ValueError(
                "Token-budget batching cannot be combined with Accelerate's split_batches or dispatch_batches "
                "(they cut or re-deal batches by sentence count). Unset them in accelerator_config."
            )
        if self.args.train_sampling_strategy not in ("random", "sequential"):
            logger.warning(
                "train_sampling_strategy=%r is ignored: max_tokens=%d batches by length already.",
                self.args.train_sampling_strategy,
                self.max_tokens,
            )
        sampler = self.token_budget_sampler()
        dataset, collator = self.train_dataset, self.data_collator
        if isinstance(dataset, datasets.Dataset):
            dataset = self._remove_unused_columns(dataset, description="Training")
        else:
            collator = self._get_collator_with_removed_columns(collator, description="Training")
        dataloader = DataLoader(
            dataset,
            batch_sampler=sampler,
            collate_fn=collator,
            num_workers=self.args.dataloader_num_workers,
            pin_memory=self.args.dataloader_pin_memory,
            persistent_workers=self.args.dataloader_persistent_workers,
            multiprocessing_context=self.args.dataloader_multiprocessing_context,
            prefetch_factor=self.args.dataloader_prefetch_factor,
            in_order=self.args.dataloader_in_order,
            worker_init_fn=partial(
                seed_worker, num_workers=self.args.dataloader_num_workers, rank=self.args.process_index
            ),
        )
        logger.info(
            "Token-budget batching: max_tokens=%d, %d batches per rank per epoch (%d ranks).",
            self.max_tokens,
            len(sampler),
            sampler.num_replicas,
        )
        return unshard_prepared_dataloader(self.accelerator.prepare(dataloader), sampler)

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
            scale = self._learning_rate_scale if getattr(self.args, "lr_cooldown_fraction", 0) else None
            self.lr_scheduler = create_paper_lr_scheduler(optimizer or self.optimizer, warmup, scale)
            self._created_lr_scheduler = True
            return self.lr_scheduler
        return super().create_scheduler(num_training_steps, optimizer)

    def _time_budget(self) -> TrainingTimeBudget | None:
        """The run's :class:`TrainingTimeBudget` callback (``--max_train_minutes``), if it has one."""
        return next(
            (cb for cb in self.callback_handler.callbacks if isinstance(cb, TrainingTimeBudget)), None
        )

    def _learning_rate_scale(self) -> float:
        """The time budget's cool-down factor, looked up at each step: transformers' callback-state restore
        (``restore_callback_states_from_checkpoint``) replaces the callback object on resume."""
        budget = self._time_budget()
        return 1.0 if budget is None else budget.learning_rate_scale()

    def prediction_step(
        self,
        model: torch.nn.Module,
        inputs: dict[str, torch.Tensor | Any],
        prediction_loss_only: bool,
        ignore_keys: list[str] | None = None,
        **gen_kwargs: Any,
    ) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
        if self.args.predict_with_generate and not prediction_loss_only:
            self._initialise_fsdp2_root(model, inputs)
        saved = copy.deepcopy(self.model.generation_config)
        try:
            step = super().prediction_step(model, inputs, prediction_loss_only, ignore_keys, **gen_kwargs)
        finally:
            self.model.generation_config = saved
        if self._target_nll is not None:
            self._target_nll.gather(self.accelerator)
        return step

    def _initialise_fsdp2_root(self, model: torch.nn.Module, inputs: dict[str, Any]) -> None:
        """FSDP2 (``fully_shard``) makes a module the root of its sharded modules on the root's first
        forward call; ``generate()`` calls the encoder first, so a model sharded for evaluation only
        (nothing trained it in this Trainer) would make the shared embedding its root and fail. One
        forward of the first batch first, once per model (its outputs are recomputed by the step)."""
        if not isinstance(model, FSDPModule) or id(model) in self._fsdp2_roots:
            return
        with torch.no_grad():
            model(**inputs)
        self._fsdp2_roots.add(id(model))

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

    def _save(self, output_dir: str | None = None, state_dict: dict[str, Any] | None = None) -> None:
        """Every model folder the Trainer writes (checkpoints, the final model) is self-contained, as
        :func:`hf_vanilla.hub.folder.save_model_folder` writes it: the modeling and pipeline code with an
        ``auto_map``, the tokenizer's ``model_max_length`` from the model, and the training arguments (with
        ``recorded``: the model card's data) as ``training_args.json`` instead of the Trainer's pickled
        ``training_args.bin``, and
        ``training_record.json`` (:mod:`hf_vanilla.hub.record`: this recipe, a few training sources)."""
        model = self.accelerator.unwrap_model(self.model, keep_torch_compile=False)
        if self.processing_class is not None:
            limit_tokenizer_length(self.processing_class, model.config)
        if state_dict is not None:  # gathered from shards: one copy per name of the shared matrix
            state_dict = tie_state_dict(model, state_dict)
        super()._save(output_dir, state_dict)  # the model's save_pretrained writes the code and auto_map
        if self.args.should_save:
            folder = Path(output_dir if output_dir is not None else self.args.output_dir)
            (folder / TRAINING_ARGS_NAME).unlink(missing_ok=True)
            recorded = {**json.loads(self.args.to_json_string()), **self.recorded}
            (folder / TRAINING_ARGS_JSON).write_text(json.dumps(recorded, indent=2) + "\n", encoding="utf-8")
            write_training_record(
                folder,
                trained_with="hf_vanilla's Trainer recipe (§5)",
                example_sources=self._example_sources(),
            )
            finish_model_folder(folder)

    def _example_sources(self) -> list[str]:
        """The first few training sources, decoded from the tokenized training set (none when it cannot be
        indexed, e.g. a streamed one, or there is no tokenizer)."""
        data = self.train_dataset
        if self.processing_class is None or not isinstance(data, datasets.Dataset):
            return []
        if "input_ids" not in data.column_names:
            return []
        rows = data.select(range(min(MAX_EXAMPLES, len(data))))["input_ids"]
        return [self.processing_class.decode(ids, skip_special_tokens=True) for ids in rows]

    def _note_nonfinite(self, value: torch.Tensor | float | None, step: int) -> None:
        if isinstance(value, DTensor):  # FSDP2: each process checks its own part; the stop all-reduces
            value = value.to_local()
        if isinstance(value, torch.Tensor):
            bad = ~torch.isfinite(value.detach()).all()
            at = torch.where(bad, float(step), math.inf).to(value.device)
            first = self._first_nonfinite
            self._first_nonfinite = at if first is None else torch.minimum(first, at)
        elif value is not None and not math.isfinite(value):
            self._first_nonfinite_host = min(self._first_nonfinite_host, step)

    def _last_good_checkpoint(self) -> str:
        """What is left to continue from, and how (the end of a :class:`NonFiniteTrainingError`)."""
        last = last_complete_checkpoint(self.args.output_dir, checksums=False)
        if last is None:
            return "No checkpoint was saved before it: start again with a lower --learning_rate."
        return (
            f"The last checkpoint, {str(last)!r}, is kept: continue from it with --resume_from_checkpoint "
            "last and a lower --learning_rate."
        )

    def _stop_if_nonfinite(self) -> None:
        """Raise :class:`NonFiniteTrainingError` if a step so far gave a non-finite loss or gradient norm
        on any process (one all-reduce under distribution)."""
        first = torch.tensor([self._first_nonfinite_host], dtype=torch.float64)
        if self._first_nonfinite is not None:
            first = torch.minimum(first, self._first_nonfinite.detach().double().cpu().reshape(1))
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            from accelerate import PartialState

            first = first.to(PartialState().device)
            torch.distributed.all_reduce(first, op=torch.distributed.ReduceOp.MIN)
        step = float(first.item())
        if math.isfinite(step):
            raise NonFiniteTrainingError(
                f"Training step {int(step)} gave a non-finite loss or gradient norm (inf or nan); the run stopped at "
                f"step {self.state.global_step} without saving (the learning rate is probably too high, "
                f"--learning_rate {self.args.learning_rate:g}). {self._last_good_checkpoint()}"
            )

    def _stop_if_weights_nonfinite(self) -> None:
        """Raise :class:`NonFiniteTrainingError` if any weight is inf or nan (before anything is saved)."""
        model = self.model
        count = torch.zeros((), dtype=torch.int64)
        for param in model.parameters():
            local = param.to_local() if hasattr(param, "to_local") else param
            count = count.to(local.device) + (~torch.isfinite(local.detach())).sum()
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            from accelerate import PartialState

            count = count.to(PartialState().device)
            torch.distributed.all_reduce(count)
        bad = int(count.item())
        if bad:
            raise NonFiniteTrainingError(
                f"After training step {self.state.global_step} the weights hold {bad} non-finite values (inf or "
                f"nan): they were not saved (the learning rate is probably too high, --learning_rate "
                f"{self.args.learning_rate:g}). {self._last_good_checkpoint()}"
            )

    def training_step(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        loss = super().training_step(*args, **kwargs)
        self._note_nonfinite(loss, self.state.global_step + 1)
        return loss

    def _maybe_log_save_evaluate(self, tr_loss: Any, grad_norm: Any, *args: Any, **kwargs: Any) -> None:
        """Before anything is logged, evaluated or saved, and when the run stops (``max_steps``, a
        signal), stop with :class:`NonFiniteTrainingError` if a step gave a non-finite loss or
        gradient norm. The Trainer's own ``logging_nan_inf_filter`` would otherwise log the average
        of earlier losses in place of ``nan``, and the checkpoint would hold the damaged weights."""
        self._note_nonfinite(grad_norm, self.state.global_step)
        control = self.control
        if (
            control.should_log
            or control.should_evaluate
            or control.should_save
            or control.should_training_stop
        ):
            self._stop_if_nonfinite()
        super()._maybe_log_save_evaluate(tr_loss, grad_norm, *args, **kwargs)

    def _trusted_patterns(self) -> tuple[str, ...]:
        if getattr(self, "is_deepspeed_enabled", False):
            logger.warning(
                "DeepSpeed checkpoint files (global_step*/) are loaded by DeepSpeed with full unpickling and "
                "are not checked; resume only from DeepSpeed checkpoints you wrote yourself."
            )
            return ("global_step*/*",)
        return ()

    def _get_output_dir(self, trial: Any) -> str:
        if self._staging_run_dir is not None:
            return self._staging_run_dir
        return super()._get_output_dir(trial)

    def _save_checkpoint(self, model: torch.nn.Module, trial: Any) -> None:
        self._stop_if_nonfinite()
        self._stop_if_weights_nonfinite()
        args = self.args
        if args.push_to_hub:
            super()._save_checkpoint(model, trial)
            return
        state = self.state
        accelerator = self.accelerator
        run_dir = Path(super()._get_output_dir(trial))
        name = checkpoint_name(state.global_step)
        staging_root = run_dir / STAGING_DIR_NAME
        staged, final = staging_root / name, run_dir / name
        if args.should_save:
            if staged.exists():
                shutil.rmtree(staged)  # left by a run killed while saving this step
            staging_root.mkdir(parents=True, exist_ok=True)
        accelerator.wait_for_everyone()
        self._staging_run_dir = str(staging_root)
        try:
            with removed_when_the_disk_is_full(staged, final):
                super()._save_checkpoint(model, trial)
        finally:
            self._staging_run_dir = None
        accelerator.wait_for_everyone()
        if args.should_save:
            best = state.best_model_checkpoint
            with removed_when_the_disk_is_full(staged, final):
                if best is not None and Path(best).parent == staging_root:
                    state.best_model_checkpoint = str(run_dir / Path(best).name)
                    state.save_to_json(str(staged / TRAINER_STATE_NAME))
                if self.checkpoint_checksums:
                    write_checksums(staged)
            publish_directory(staged, final)
            with contextlib.suppress(OSError):  # not empty: another save is staged; left for later
                staging_root.rmdir()
            rotate_checkpoints_by_step(run_dir, args.save_total_limit, state.best_model_checkpoint)
        accelerator.wait_for_everyone()

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        args = self.args
        if _internal_call or args.push_to_hub:  # a checkpoint (staged whole), or uploaded from output_dir
            super().save_model(output_dir, _internal_call=_internal_call)
            if _internal_call:
                # The Trainer's _save_checkpoint goes on to the optimizer, scheduler and RNG states; under
                # DDP a process other than the main one reaches _save_rng_state at once and would write
                # rng_state_<rank>.pth into the folder while the main process still writes and checks
                # the model there (hf_vanilla.training's _save refuses a model folder holding a pickle).
                self.accelerator.wait_for_everyone()
            return
        self._stop_if_nonfinite()
        self._stop_if_weights_nonfinite()
        target = Path(output_dir if output_dir is not None else args.output_dir)
        staged = target / f".save-{self.state.global_step}.tmp"
        if args.should_save and staged.exists():
            shutil.rmtree(staged)
        self.accelerator.wait_for_everyone()
        with removed_when_the_disk_is_full(staged, target, "the files already in it are untouched"):
            super().save_model(str(staged), _internal_call=False)
        self.accelerator.wait_for_everyone()
        if args.should_save:
            for path in sorted(staged.rglob("*"), key=lambda p: len(p.parts), reverse=True):
                if path.is_file():
                    destination = target / path.relative_to(staged)
                    destination.parent.mkdir(parents=True, exist_ok=True)
                    os.replace(path, destination)  # each file replaced whole, never half-written
            shutil.rmtree(staged)
        self.accelerator.wait_for_everyone()

    def _fsdp2_full_state_dict(self) -> bool:
        accelerator = self.accelerator
        return (
            getattr(self, "is_fsdp_enabled", False)
            and accelerator.is_fsdp2
            and "FULL_STATE_DICT" in str(accelerator.state.fsdp_plugin.state_dict_type)
        )

    def _load_from_checkpoint(
        self, resume_from_checkpoint: str, model: torch.nn.Module | None = None
    ) -> None:
        """Under FSDP2 with ``FULL_STATE_DICT``, the weights are read from the checkpoint's
        ``model.safetensors`` (:func:`load_full_state_dict_into_sharded`) instead of the pickled
        ``pytorch_model_fsdp.bin``; the optimizer state is loaded by the Trainer as usual."""
        if not self._fsdp2_full_state_dict():
            super()._load_from_checkpoint(resume_from_checkpoint, model)
            return
        logger.info("Loading the sharded model from %s/model.safetensors", resume_from_checkpoint)
        target = model if model is not None else self.model
        load_full_state_dict_into_sharded(target, Path(resume_from_checkpoint) / "model.safetensors")

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        """Check the checkpoint's optimizer and scheduler states against this run's optimizer and
        scheduler (:func:`check_optimizer_state`, :func:`check_scheduler_state`) as the Trainer loads
        them, before the first step; DeepSpeed and FSDP load their own states their own way."""
        plain = not (getattr(self, "is_deepspeed_enabled", False) or getattr(self, "is_fsdp_enabled", False))
        folder = Path(checkpoint) if checkpoint is not None else None
        if folder is None or not plain or not (folder / OPTIMIZER_NAME).is_file():
            super()._load_optimizer_and_scheduler(checkpoint)
            return
        if (folder / SCHEDULER_NAME).is_file():
            saved = torch.load(folder / SCHEDULER_NAME, map_location="cpu", weights_only=True)
            check_scheduler_state(saved, self.lr_scheduler, folder / SCHEDULER_NAME)
        optimizer = self.optimizer
        optimizer = getattr(optimizer, "optimizer", optimizer)  # Accelerate's wrapper loads into this one
        model = self.accelerator.unwrap_model(self.model)
        names = {id(param): name for name, param in model.named_parameters()}
        handle = optimizer.register_load_state_dict_pre_hook(
            lambda opt, state_dict: check_optimizer_state(state_dict, opt, folder / OPTIMIZER_NAME, names)
        )
        try:
            super()._load_optimizer_and_scheduler(checkpoint)
        finally:
            handle.remove()

    def _issue_warnings_after_load(self, load_result: Any) -> None:
        """The Trainer's warning about missing keys after it loads a checkpoint's weights, without the
        weights tied to a loaded one (:func:`untied_missing_keys`): every resume reported the shared
        embedding's other names as missing, though they are saved once and restored exactly. Keys that
        are really missing, and unexpected ones, are still reported."""
        model = self.accelerator.unwrap_model(self.model)
        load_result = load_result._replace(missing_keys=untied_missing_keys(model, load_result.missing_keys))
        super()._issue_warnings_after_load(load_result)

    def train(self, resume_from_checkpoint: str | bool | None = None, *args: Any, **kwargs: Any) -> Any:
        output_dir = self.args.output_dir
        if resume_from_checkpoint is True:
            found = last_complete_checkpoint(output_dir, trusted_patterns=self._trusted_patterns())
            if found is None:
                raise FileNotFoundError(
                    _no_complete_checkpoint("resume_from_checkpoint=True", Path(output_dir))
                )
            resume_from_checkpoint = str(found)
        elif isinstance(resume_from_checkpoint, str | os.PathLike):
            verify_checkpoint(resume_from_checkpoint, trusted_patterns=self._trusted_patterns())
        try:
            return super().train(resume_from_checkpoint, *args, **kwargs)
        finally:  # also after an exception: no signal handler of a finished run stays installed
            for callback in self.callback_handler.callbacks:
                if isinstance(callback, SaveOnSignalCallback):
                    callback.restore_handlers()


# --------------------------------------------------------------------------------------------------
# Metrics
# --------------------------------------------------------------------------------------------------
def build_compute_metrics(
    tokenizer: PreTrainedTokenizerBase, bleu_tokenize: str = "13a"
) -> Callable[[EvalPrediction], dict[str, float]]:
    """``compute_metrics`` for generated translations: sacreBLEU BLEU and chrF (§6.1), exact-match
    accuracy and ``gen_len``, the mean length of the translations in tokens (special tokens not
    counted). Token ids are decoded with ``skip_special_tokens``. ``bleu_tokenize``: as in
    :func:`hf_vanilla.analysis.evaluation.compute_bleu_chrf`."""
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
