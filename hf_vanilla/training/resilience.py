"""Training-run durability: outputs that are whole or absent, and runs that survive being stopped.

The paper trained its big models for 3.5 days (§5.2) and averaged the last 20 checkpoints (§6.1); a
run that long is preempted, killed or crashes, and must resume without changing its result. What this
module guarantees (:class:`~hf_vanilla.training.trainer.PaperSeq2SeqTrainer` brings it to the ``Trainer``; loading checks are
:mod:`hf_vanilla.io.safe_loading`'s and :mod:`hf_vanilla.io.checkpoints`'):

* **Write, then rename** (:func:`atomic_directory`, :func:`save_pretrained_atomic`, :func:`atomic_file`,
  :class:`~hf_vanilla.training.trainer.PaperSeq2SeqTrainer`): a folder or file is written under a temporary
  name next to its final place and renamed into place only when complete, so a crash never leaves a
  half-written output where a good one was. The Trainer does this for every ``checkpoint-<step>`` and for
  the final model.
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
* **No non-finite state saved** (:class:`~hf_vanilla.training.trainer.PaperSeq2SeqTrainer`): a step with a non-finite loss or
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
import shutil
import signal
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from hf_vanilla.io.atomic import TEMPORARY_REMOVED, DiskFullError, full_disk_named
from hf_vanilla.training.checkpoints import (
    _agree_across_processes,
)

logger = logging.getLogger(__name__)


__all__ = [
    "NonFiniteTrainingError",
    "SaveOnSignalCallback",
    "StoppedBySignal",
    "removed_when_the_disk_is_full",
]


@contextlib.contextmanager
def removed_when_the_disk_is_full(
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
        normally; :class:`~hf_vanilla.training.trainer.PaperSeq2SeqTrainer` after any end of ``train()``, an exception included (a
        stale handler would swallow the next Ctrl-C of a notebook or a later run in the process)."""
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous.clear()
