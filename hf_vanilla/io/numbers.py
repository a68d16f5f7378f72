"""What counts as a finite number, for every check that refuses NaN and infinity: command-line options,
decoding options and saved weights. It imports nothing heavy (tensors are read through their own
methods), so that a command's options are checked without importing torch."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

__all__ = ["is_non_finite", "non_finite_names"]


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
