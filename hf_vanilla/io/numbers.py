"""The numbers a command can honour: what counts as a finite number, for every check that refuses NaN and
infinity (command-line options, decoding options, saved weights), and the bounds of number options (a
zero batch size, a probability of 1.5, an integer beyond 64 bits). It imports nothing heavy (tensors are read through their own
methods), so that a command's options are checked without importing torch."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["LARGEST_INT", "Bounds", "is_non_finite", "non_finite_names", "refuse_out_of_bounds"]


def is_non_finite(value: Any) -> bool:
    """Whether ``value`` is a float that is NaN or an infinity, or a floating-point tensor holding one.
    Anything else (integers, strings, integer tensors, ``None``) is not a non-finite number."""
    if isinstance(value, float):
        return not math.isfinite(value)
    if callable(getattr(value, "is_floating_point", None)) and callable(getattr(value, "isfinite", None)):
        return bool(value.is_floating_point() and not value.isfinite().all())
    return False


def non_finite_names(named: Iterable[tuple[str, Any]]) -> list[str]:
    """The names of the ``(name, value)`` pairs whose value :func:`is_non_finite`, in order."""
    return [name for name, value in named if is_non_finite(value)]


#: The largest integer an option can hold: torch, numpy and the data loaders store counts in 64 bits.
LARGEST_INT = 2**63 - 1


@dataclasses.dataclass(frozen=True)
class Bounds:
    """The values a number option can honour: from ``low`` to ``high`` (each included unless
    ``low_open`` / ``high_open``; ``None``: no bound), and integers at most :data:`LARGEST_INT`. ``what``
    says what the option counts, for the message."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    what: str = ""

    def admits(self, value: float) -> bool:
        above = self.low is None or (value > self.low if self.low_open else value >= self.low)
        below = self.high is None or (value < self.high if self.high_open else value <= self.high)
        return above and below

    def describe(self) -> str:
        low, high = self.low, self.high
        if low is not None and high is not None:
            return f"in {'(' if self.low_open else '['}{low}, {high}{')' if self.high_open else ']'}"
        if low is not None:
            return f"{'greater than' if self.low_open else 'at least'} {low}"
        if high is not None:
            return f"{'less than' if self.high_open else 'at most'} {high}"
        return "any number"


def refuse_out_of_bounds(args: object, bounds: Mapping[str, Bounds]) -> None:
    """Raise ``ValueError`` naming the first option of ``args`` (parsed options, a dataclass) whose
    value is outside its ``bounds`` (option name -> :class:`Bounds`; ``None`` values are not checked):
    a number a command cannot honour (a zero batch size, a negative step count, a probability of 1.5,
    an integer too large for 64 bits) is refused where the options are read, not met as a traceback
    later."""
    for name, bound in bounds.items():
        value = getattr(args, name, None)
        if not isinstance(value, int | float) or isinstance(value, bool):
            continue
        what = f" ({bound.what})" if bound.what else ""
        if isinstance(value, int) and abs(value) > LARGEST_INT:
            raise ValueError(f"--{name} {value}: too large (at most {LARGEST_INT}){what}; nothing was done.")
        if not bound.admits(value):
            raise ValueError(f"--{name} {value}: must be {bound.describe()}{what}; nothing was done.")
