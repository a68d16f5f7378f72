"""The learning rate of Eq. (3) (§5.3) as a ``LambdaLR`` schedule."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from transformers.optimization import _get_inverse_sqrt_schedule_lr_lambda

__all__ = [
    "PaperLRLambda",
    "ScaledLambdaLR",
    "create_paper_lr_scheduler",
    "paper_learning_rate",
    "paper_peak_learning_rate",
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


class ScaledLambdaLR(torch.optim.lr_scheduler.LambdaLR):
    """A ``LambdaLR`` whose rates are multiplied by ``scale()``, read each time the scheduler steps (the
    training time budget's cool-down, :class:`~hf_vanilla.training.time_budget.TrainingTimeBudget`).

    ``scale`` is not part of the saved state, so ``scheduler.pt`` is the same as a plain ``LambdaLR``'s and
    a run resumes with or without the scale."""

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        lr_lambda: Callable[[int], float],
        scale: Callable[[], float],
    ) -> None:
        self._scale = scale  # before LambdaLR's first step, which reads it
        super().__init__(optimizer, lr_lambda)

    def get_lr(self) -> list[float]:
        scale = self._scale()
        return [rate * scale for rate in super().get_lr()]

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state.pop("_scale", None)
        return state


def create_paper_lr_scheduler(
    optimizer: torch.optim.Optimizer, warmup_steps: int, scale: Callable[[], float] | None = None
) -> torch.optim.lr_scheduler.LambdaLR:
    """Eq. (3) as a ``LambdaLR`` over the optimizer's learning rate (which must be the peak,
    :func:`paper_peak_learning_rate`, for the exact formula); with ``scale``, multiplied by ``scale()`` at
    each step (:class:`ScaledLambdaLR`)."""
    if scale is None:
        return torch.optim.lr_scheduler.LambdaLR(optimizer, PaperLRLambda(warmup_steps))
    return ScaledLambdaLR(optimizer, PaperLRLambda(warmup_steps), scale)
