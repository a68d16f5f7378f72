"""Training for a time budget: stop by the clock, and optionally cool the learning rate down to 0 over the
budget's end.

The paper trains for a number of steps (§5.2: 100,000 for base). A run on a fixed amount of machine time
(the Multi30k recipe's 50 minutes on 2 CPU cores) does not know in advance how many steps will fit, so
a schedule defined over steps cannot end at the end of the run. :class:`TrainingTimeBudget` gives such a
run two things, as Lightning's ``max_time`` and fairseq's ``--stop-time-hours`` give the first:

* **A clean stop** (``--max_train_minutes``): at the first step end after the budget, the run saves a
  checkpoint and ends as if it had reached ``max_steps`` (final model, metrics, averaging), exit status 0.
* **A cool-down** (``--lr_cooldown_fraction f``): over the last fraction ``f`` of the budget, Eq. (3)'s
  rate is multiplied by the budget's remaining share, remaining / (f · budget), which falls linearly in
  time from 1 to 0 (a linear decay to 0 tied to the budget, as in "Budgeted Training", Li et al., 2020;
  a deviation from the paper, which has no cool-down).

The time is the wall time of the training loop (evaluation and saving during training included), summed
over resumed runs: it is saved in each checkpoint's ``trainer_state.json`` and read back on resume. With
several processes all of them use the largest of their clocks (one all-reduce per step), so they stop at
the same step and apply the same learning rate.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from transformers.trainer_callback import ExportableState

from hf_vanilla.training.checkpoints import _largest_across_processes

logger = logging.getLogger(__name__)

__all__ = ["TrainingTimeBudget"]


class TrainingTimeBudget(TrainerCallback, ExportableState):
    """Stop training after ``minutes`` of training time with a checkpoint; with ``cooldown_fraction`` f > 0,
    :meth:`learning_rate_scale` falls linearly from 1 to 0 over the last f of those minutes (the Trainer
    multiplies Eq. (3) by it, :class:`~hf_vanilla.training.schedule.ScaledLambdaLR`).

    ``trained_seconds`` is the training time so far, agreed across processes after each optimizer update; a resumed
    run starts from the value its checkpoint saved. ``clock`` is injectable for tests."""

    def __init__(
        self,
        minutes: float,
        cooldown_fraction: float = 0.0,
        clock: Callable[[], float] | None = None,
    ) -> None:
        if not minutes > 0:
            raise ValueError(f"A training time budget needs minutes > 0, got {minutes!r}.")
        if not 0 <= cooldown_fraction <= 1:
            raise ValueError(
                f"The cool-down is a fraction of the time budget, from 0 to 1; got {cooldown_fraction!r}."
            )
        self.minutes = minutes
        self.cooldown_fraction = cooldown_fraction
        self.trained_seconds = 0.0
        self._clock = clock  # None: time.monotonic, looked up when read
        self._before = 0.0  # trained before this run: read from the resumed checkpoint at on_train_begin
        self._started_at: float | None = None

    def _now(self) -> float:
        return self._clock() if self._clock is not None else time.monotonic()

    @property
    def budget_seconds(self) -> float:
        return self.minutes * 60

    def learning_rate_scale(self) -> float:
        """1 until the cool-down starts, then the remaining share of the cool-down, down to 0 at the end."""
        if self.cooldown_fraction == 0:
            return 1.0
        remaining = self.budget_seconds - self.trained_seconds
        return min(1.0, max(0.0, remaining / (self.cooldown_fraction * self.budget_seconds)))

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        # This run's options win over a checkpoint's: transformers' restore_callback_states_from_checkpoint
        # rebuilds this callback from the budget saved in the checkpoint.
        if getattr(args, "max_train_minutes", 0):
            self.minutes = args.max_train_minutes
            self.cooldown_fraction = getattr(args, "lr_cooldown_fraction", 0)
        # On resume the Trainer has loaded the checkpoint's trainer_state.json by now, with this callback's
        # saved state in it; a new run holds this callback's own initial state there.
        saved = (state.stateful_callbacks or {}).get(type(self).__name__)
        if isinstance(saved, dict):
            self._before = float(saved.get("attributes", {}).get("trained_seconds", self._before))
        self.trained_seconds = self._before
        self._started_at = self._now()
        if self._before:
            logger.info(
                "Time budget: %.1f of %g minutes trained before this resume.", self._before / 60, self.minutes
            )

    def on_optimizer_step(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        # After the update and before the schedule steps, so the next update's rate sees this update's time.
        if self._started_at is not None:
            self.trained_seconds = _largest_across_processes(self._before + self._now() - self._started_at)

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if self.trained_seconds >= self.budget_seconds and not control.should_training_stop:
            control.should_save = True
            control.should_training_stop = True
            logger.info(
                "Trained %.1f minutes (--max_train_minutes %g): stopping after step %d, with a checkpoint.",
                self.trained_seconds / 60,
                self.minutes,
                state.global_step,
            )

    def state(self) -> dict[str, Any]:
        return {
            "args": {"minutes": self.minutes, "cooldown_fraction": self.cooldown_fraction},
            "attributes": {"trained_seconds": self.trained_seconds},
        }
