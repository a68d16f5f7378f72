"""One definition of a non-finite number, used by every check that refuses NaN and infinity."""

from __future__ import annotations

import argparse

import pytest
import torch

from hf_vanilla.cli import refuse_non_finite as refuse_non_finite_option
from hf_vanilla.inference.options import refuse_non_finite as refuse_non_finite_decoding
from hf_vanilla.io.numbers import is_non_finite, non_finite_names
from hf_vanilla.io.safe_loading import nonfinite_tensors

NON_FINITE = [float("nan"), float("inf"), float("-inf")]
FINITE = [0.0, -1.5, 1e308, 3, True, None, "nan", "inf"]


def test_non_finite_numbers_are_floats_and_float_tensors_holding_nan_or_infinity() -> None:
    assert all(is_non_finite(value) for value in NON_FINITE)
    assert not any(is_non_finite(value) for value in FINITE)
    assert all(is_non_finite(torch.tensor([1.0, value])) for value in NON_FINITE)
    assert all(is_non_finite(torch.tensor([1.0, value], dtype=torch.bfloat16)) for value in NON_FINITE)
    assert not is_non_finite(torch.ones(3)) and not is_non_finite(torch.arange(3))
    assert non_finite_names(
        [("a", 1.0), ("b", NON_FINITE[0]), ("c", torch.ones(2)), ("d", NON_FINITE[1])]
    ) == [
        "b",
        "d",
    ]


@pytest.mark.parametrize("value", NON_FINITE, ids=str)
def test_the_option_decoding_and_weight_checks_refuse_the_same_numbers(value: float) -> None:
    """A command-line number, a decoding option and a saved tensor are refused for the same values,
    each with its own message."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--rate", type=float, default=1.0)
    with pytest.raises(ValueError, match=r"^--rate .*: not a finite number\. Give an ordinary number"):
        refuse_non_finite_option(parser, [f"--rate={value}"])
    with pytest.raises(ValueError, match=r"^`rate` is .*, not a finite number: give an ordinary number\.$"):
        refuse_non_finite_decoding({"beams": 4, "rate": value})
    assert nonfinite_tensors([("ok", torch.ones(2)), ("bad", torch.tensor([value]))]) == ["bad"]


def test_finite_numbers_pass_every_check() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rate", type=float, default=1.0)
    refuse_non_finite_option(parser, ["--rate", "1e308"])
    refuse_non_finite_decoding({name: value for name, value in zip("abcdefgh", FINITE, strict=True)})
    assert nonfinite_tensors([("ok", torch.ones(2)), ("ints", torch.arange(2))]) == []
