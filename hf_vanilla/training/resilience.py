"""Training-run durability: outputs that are whole or absent, and runs that survive being stopped.

The paper trained its big models for 3.5 days (§5.2) and averaged the last 20 checkpoints (§6.1); a
run that long is preempted, killed or crashes, and must resume without changing its result. What this
module guarantees (:mod:`hf_vanilla.training` plugs it into the ``Trainer``; loading checks are
:mod:`hf_vanilla.io.safe_loading`'s and :mod:`hf_vanilla.io.checkpoints`'):

* **Write, then rename** (:func:`atomic_directory`, :func:`save_pretrained_atomic`, :func:`atomic_file`,
  :class:`ResilientTrainerMixin`): a folder or file is written under a temporary name next to its final
  place and renamed into place only when complete, so a crash never leaves a half-written output where
  a good one was. The Trainer mixin does this for every ``checkpoint-<step>`` and for the final model.
* **Nothing replaced unasked** (:func:`refuse_to_replace`): a command stops before it would replace an
  output the user did not ask it to (``--overwrite``).
* **Resuming from the newest whole checkpoint** (:func:`resolve_resume_checkpoint`,
  :func:`last_complete_checkpoint`): a folder left half-written by a kill during saving is skipped with
  a warning, where ``transformers.trainer_utils.get_last_checkpoint`` would pick it and fail; the
  checkpoint resumed from is checked first, and its optimizer and scheduler states are checked against
  the run's optimizer and model before the first step (:func:`check_optimizer_state`).
* **Checkpoints in step order** (:func:`checkpoint_folders`, :func:`rotate_checkpoints_by_step`): rotation
  (``save_total_limit``), resuming and averaging order a run's checkpoints by the step in their names,
  never by file times, so reading or evaluating a checkpoint never changes which ones are kept.
* **One run per output folder** (:func:`hold_run_dir`): a second run into a folder a live run holds is
  refused; the lock is the kernel's and goes with the process, however it ends.
* **No non-finite state saved** (:class:`ResilientTrainerMixin`): a step with a non-finite loss or
  gradient norm, or non-finite weights at a save, stops the run with :class:`NonFiniteTrainingError`
  naming the step; the checkpoints saved before it are kept.
* **Preemption and Ctrl-C** (:class:`SaveOnSignalCallback`): on SIGTERM (what SLURM, Kubernetes and
  ``torchrun`` send before killing a job) or SIGINT (Ctrl-C) the run finishes its current optimizer
  step, saves a checkpoint and exits; ``--resume_from_checkpoint last`` continues it. All processes
  agree on the step.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import shutil
import signal
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch.distributed.tensor import DTensor
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from transformers.trainer import OPTIMIZER_NAME, SCHEDULER_NAME

from hf_vanilla.io.atomic import TEMPORARY_REMOVED, DiskFullError, full_disk_named, publish_directory
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
    _agree_across_processes,
    _no_complete_checkpoint,
    check_optimizer_state,
    check_scheduler_state,
    rotate_checkpoints_by_step,
)
from hf_vanilla.training.sharded_loading import load_full_state_dict_into_sharded, tie_state_dict

logger = logging.getLogger(__name__)


__all__ = ["NonFiniteTrainingError", "ResilientTrainerMixin", "SaveOnSignalCallback", "StoppedBySignal"]


@contextlib.contextmanager
def _removed_when_the_disk_is_full(
    staged: Path, target: Path, kept: str = "the previous checkpoints are untouched"
) -> Iterator[None]:
    """Raise :class:`~hf_vanilla.io.atomic.DiskFullError` naming ``target`` when the block fails for want of
    space, after removing what was staged of it (:func:`~hf_vanilla.io.atomic.full_disk_named`)."""
    try:
        with full_disk_named(target, f"{kept}, {TEMPORARY_REMOVED}"):
            yield
    except DiskFullError:
        shutil.rmtree(staged, ignore_errors=True)
        raise


class NonFiniteTrainingError(ValueError):
    """A training step gave a non-finite loss or gradient norm, or the weights to be saved are not finite."""


class StoppedBySignal(SystemExit):
    """Raised by :class:`SaveOnSignalCallback` once every process has saved the step a signal stopped it
    at; its ``code`` is the exit status, ``128 + signal``. A ``SystemExit``, so a script that does not
    catch it exits with that status; ``scripts/train.py`` catches it to end the process group first
    (:func:`~hf_vanilla.training.launch_checks.end_process_group`, which needs the Trainer gone)."""


# --------------------------------------------------------------------------------------------------
# Trainer integration
# --------------------------------------------------------------------------------------------------
class ResilientTrainerMixin:
    """A ``Trainer`` mixin (put it first among the bases): checkpoints written, then renamed; checks
    before resuming; ``resume_from_checkpoint=True`` means the newest *whole* checkpoint.

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
    """

    checkpoint_checksums: bool = True
    _staging_run_dir: str | None = None
    #: The first step with a non-finite loss or gradient norm, kept where the values are (no host
    #: synchronisation per step) and read only before a log, evaluation, save or stop.
    _first_nonfinite: torch.Tensor | None = None
    _first_nonfinite_host: float = math.inf

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
        last = last_complete_checkpoint(self.args.output_dir, checksums=False)  # type: ignore[attr-defined]
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
                f"step {self.state.global_step} without saving (the learning rate is probably too high, "  # type: ignore[attr-defined]
                f"--learning_rate {self.args.learning_rate:g}). {self._last_good_checkpoint()}"  # type: ignore[attr-defined]
            )

    def _stop_if_weights_nonfinite(self) -> None:
        """Raise :class:`NonFiniteTrainingError` if any weight is inf or nan (before anything is saved)."""
        model = self.model  # type: ignore[attr-defined]
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
                f"After training step {self.state.global_step} the weights hold {bad} non-finite values (inf or "  # type: ignore[attr-defined]
                f"nan): they were not saved (the learning rate is probably too high, --learning_rate "
                f"{self.args.learning_rate:g}). {self._last_good_checkpoint()}"  # type: ignore[attr-defined]
            )

    def training_step(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        loss = super().training_step(*args, **kwargs)  # type: ignore[misc]
        self._note_nonfinite(loss, self.state.global_step + 1)  # type: ignore[attr-defined]
        return loss

    def _maybe_log_save_evaluate(self, tr_loss: Any, grad_norm: Any, *args: Any, **kwargs: Any) -> None:
        """Before anything is logged, evaluated or saved, and when the run stops (``max_steps``, a
        signal), stop with :class:`NonFiniteTrainingError` if a step gave a non-finite loss or
        gradient norm. The Trainer's own ``logging_nan_inf_filter`` would otherwise log the average
        of earlier losses in place of ``nan``, and the checkpoint would hold the damaged weights."""
        self._note_nonfinite(grad_norm, self.state.global_step)  # type: ignore[attr-defined]
        control = self.control  # type: ignore[attr-defined]
        if (
            control.should_log
            or control.should_evaluate
            or control.should_save
            or control.should_training_stop
        ):
            self._stop_if_nonfinite()
        super()._maybe_log_save_evaluate(tr_loss, grad_norm, *args, **kwargs)  # type: ignore[misc]

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
        return super()._get_output_dir(trial)  # type: ignore[misc]

    def _save_checkpoint(self, model: torch.nn.Module, trial: Any) -> None:
        self._stop_if_nonfinite()
        self._stop_if_weights_nonfinite()
        args = self.args  # type: ignore[attr-defined]
        if args.push_to_hub:
            super()._save_checkpoint(model, trial)  # type: ignore[misc]
            return
        state = self.state  # type: ignore[attr-defined]
        accelerator = self.accelerator  # type: ignore[attr-defined]
        run_dir = Path(super()._get_output_dir(trial))  # type: ignore[misc]
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
            with _removed_when_the_disk_is_full(staged, final):
                super()._save_checkpoint(model, trial)  # type: ignore[misc]
        finally:
            self._staging_run_dir = None
        accelerator.wait_for_everyone()
        if args.should_save:
            best = state.best_model_checkpoint
            with _removed_when_the_disk_is_full(staged, final):
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
        args = self.args  # type: ignore[attr-defined]
        if _internal_call or args.push_to_hub:  # a checkpoint (staged whole), or uploaded from output_dir
            super().save_model(output_dir, _internal_call=_internal_call)  # type: ignore[misc]
            if _internal_call:
                # The Trainer's _save_checkpoint goes on to the optimizer, scheduler and RNG states; under
                # DDP a process other than the main one reaches _save_rng_state at once and would write
                # rng_state_<rank>.pth into the folder while the main process still writes and checks
                # the model there (hf_vanilla.training's _save refuses a model folder holding a pickle).
                self.accelerator.wait_for_everyone()  # type: ignore[attr-defined]
            return
        self._stop_if_nonfinite()
        self._stop_if_weights_nonfinite()
        target = Path(output_dir if output_dir is not None else args.output_dir)
        staged = target / f".save-{self.state.global_step}.tmp"  # type: ignore[attr-defined]
        if args.should_save and staged.exists():
            shutil.rmtree(staged)
        self.accelerator.wait_for_everyone()  # type: ignore[attr-defined]
        with _removed_when_the_disk_is_full(staged, target, "the files already in it are untouched"):
            super().save_model(str(staged), _internal_call=False)  # type: ignore[misc]
        self.accelerator.wait_for_everyone()  # type: ignore[attr-defined]
        if args.should_save:
            for path in sorted(staged.rglob("*"), key=lambda p: len(p.parts), reverse=True):
                if path.is_file():
                    destination = target / path.relative_to(staged)
                    destination.parent.mkdir(parents=True, exist_ok=True)
                    os.replace(path, destination)  # each file replaced whole, never half-written
            shutil.rmtree(staged)
        self.accelerator.wait_for_everyone()  # type: ignore[attr-defined]

    def _save(self, output_dir: str | None = None, state_dict: dict[str, Any] | None = None) -> None:
        if state_dict is not None:  # gathered from shards: one copy per name of the shared matrix
            model = self.accelerator.unwrap_model(self.model)  # type: ignore[attr-defined]
            state_dict = tie_state_dict(model, state_dict)
        super()._save(output_dir, state_dict=state_dict)  # type: ignore[misc]

    def _fsdp2_full_state_dict(self) -> bool:
        accelerator = self.accelerator  # type: ignore[attr-defined]
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
            super()._load_from_checkpoint(resume_from_checkpoint, model)  # type: ignore[misc]
            return
        logger.info("Loading the sharded model from %s/model.safetensors", resume_from_checkpoint)
        target = model if model is not None else self.model  # type: ignore[attr-defined]
        load_full_state_dict_into_sharded(target, Path(resume_from_checkpoint) / "model.safetensors")

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        """Check the checkpoint's optimizer and scheduler states against this run's optimizer and
        scheduler (:func:`check_optimizer_state`, :func:`check_scheduler_state`) as the Trainer loads
        them, before the first step; DeepSpeed and FSDP load their own states their own way."""
        plain = not (getattr(self, "is_deepspeed_enabled", False) or getattr(self, "is_fsdp_enabled", False))
        folder = Path(checkpoint) if checkpoint is not None else None
        if folder is None or not plain or not (folder / OPTIMIZER_NAME).is_file():
            super()._load_optimizer_and_scheduler(checkpoint)  # type: ignore[misc]
            return
        if (folder / SCHEDULER_NAME).is_file():
            saved = torch.load(folder / SCHEDULER_NAME, map_location="cpu", weights_only=True)
            check_scheduler_state(saved, self.lr_scheduler, folder / SCHEDULER_NAME)  # type: ignore[attr-defined]
        optimizer = self.optimizer  # type: ignore[attr-defined]
        optimizer = getattr(optimizer, "optimizer", optimizer)  # Accelerate's wrapper loads into this one
        model = self.accelerator.unwrap_model(self.model)  # type: ignore[attr-defined]
        names = {id(param): name for name, param in model.named_parameters()}
        handle = optimizer.register_load_state_dict_pre_hook(
            lambda opt, state_dict: check_optimizer_state(state_dict, opt, folder / OPTIMIZER_NAME, names)
        )
        try:
            super()._load_optimizer_and_scheduler(checkpoint)  # type: ignore[misc]
        finally:
            handle.remove()

    def _issue_warnings_after_load(self, load_result: Any) -> None:
        """The Trainer's warning about missing keys after it loads a checkpoint's weights, without the
        weights tied to a loaded one (:func:`untied_missing_keys`): every resume reported the shared
        embedding's other names as missing, though they are saved once and restored exactly. Keys that
        are really missing, and unexpected ones, are still reported."""
        model = self.accelerator.unwrap_model(self.model)  # type: ignore[attr-defined]
        load_result = load_result._replace(missing_keys=untied_missing_keys(model, load_result.missing_keys))
        super()._issue_warnings_after_load(load_result)  # type: ignore[misc]

    def train(self, resume_from_checkpoint: str | bool | None = None, *args: Any, **kwargs: Any) -> Any:
        output_dir = self.args.output_dir  # type: ignore[attr-defined]
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
            return super().train(resume_from_checkpoint, *args, **kwargs)  # type: ignore[misc]
        finally:  # also after an exception: no signal handler of a finished run stays installed
            for callback in self.callback_handler.callbacks:  # type: ignore[attr-defined]
                if isinstance(callback, SaveOnSignalCallback):
                    callback.restore_handlers()


class SaveOnSignalCallback(TrainerCallback):
    """On SIGTERM or SIGINT (Ctrl-C), finish the current optimizer step, save a checkpoint, and exit
    (preemption, §5.2's days-long runs on shared clusters; an interrupted run loses no steps).

    At every step end all processes agree (one all-reduce of a flag) whether any of them has received
    the signal, so they save the same step together. After the checkpoint is written the process exits
    with status ``128 + signal`` (143 for SIGTERM, 130 for SIGINT: :class:`StoppedBySignal`), which
    schedulers and shells read as "terminated by signal"; ``--resume_from_checkpoint last`` then
    continues the run. A second signal acts at once: the previous handlers are restored after the
    first (SIGTERM's default kills the process, Python's SIGINT handler raises ``KeyboardInterrupt``).
    A signal that arrives during evaluation or saving takes effect at the next step end. ``torchrun``
    forwards SIGTERM to every worker and waits up to 30 s before SIGKILL, which bounds the time left to
    finish the step and save.
    """

    def __init__(
        self,
        signals: Iterable[int] = (signal.SIGTERM, signal.SIGINT),
        exit_fn: Callable[[int], None] | None = None,
    ) -> None:
        self.signals = tuple(signals)
        self.received: int | None = None
        self.stopped_at: int | None = None
        self._exit = exit_fn
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: Any) -> None:
        self.received = signum
        logger.warning(
            "Received %s: finishing this step, saving a checkpoint and stopping (send it again to stop at once).",
            signal.Signals(signum).name,
        )
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)  # a second signal acts at once

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if threading.current_thread() is not threading.main_thread():
            logger.warning("SaveOnSignalCallback: not in the main thread, so no signal handler is installed.")
            return
        for sig in self.signals:
            self._previous[sig] = signal.signal(sig, self._handle)

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if _agree_across_processes(self.received is not None):
            self.stopped_at = state.global_step
            control.should_save = True
            control.should_training_stop = True

    def on_save(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if self.stopped_at is None or self.stopped_at != state.global_step:
            return
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.barrier()  # nobody exits (and makes torchrun kill the rest) before all saved
        signum = self.received if self.received is not None else signal.SIGTERM
        logger.warning(
            "Saved checkpoint-%d after %s; exiting. Continue with --resume_from_checkpoint last.",
            state.global_step,
            signal.Signals(signum).name,
        )
        if self._exit is not None:
            self._exit(128 + signum)
            return
        raise StoppedBySignal(128 + signum)

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self.restore_handlers()

    def restore_handlers(self) -> None:
        """Put back the handlers this callback replaced. ``on_train_end`` does it after a run that ends
        normally; :class:`ResilientTrainerMixin` after any end of ``train()``, an exception included (a
        stale handler would swallow the next Ctrl-C of a notebook or a later run in the process)."""
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous.clear()
