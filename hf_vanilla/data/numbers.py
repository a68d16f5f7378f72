"""The demo's data: English → German spelled-out numbers, generated at run time (no download).

"three thousand four hundred twenty-one" → "dreitausendvierhunderteinundzwanzig": a tiny stand-in for
WMT EN-DE (§6.1) in which German puts units before tens and fuses words, so a model must reorder and
emit subwords. :mod:`hf_vanilla.demo` trains on it; ``--demo`` (:mod:`hf_vanilla.data`) loads it in
place of a Hub dataset or local files. It needs only ``datasets``, so that data loading does not
import the demo's training stack.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import datasets

__all__ = ["MAX_DEMO_NUMBER", "english_number", "german_number", "make_demo_splits", "make_number_pairs"]

# fmt: off
_EN_ONES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven",
            "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen"]
_EN_TENS = ["", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]
_DE_ONES = ["null", "eins", "zwei", "drei", "vier", "fünf", "sechs", "sieben", "acht", "neun", "zehn", "elf",
            "zwölf", "dreizehn", "vierzehn", "fünfzehn", "sechzehn", "siebzehn", "achtzehn", "neunzehn"]
_DE_TENS = ["", "", "zwanzig", "dreißig", "vierzig", "fünfzig", "sechzig", "siebzig", "achtzig", "neunzig"]
# fmt: on
MAX_DEMO_NUMBER = 999_999


def _check_number(n: int) -> None:
    if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n <= MAX_DEMO_NUMBER:
        raise ValueError(f"Numbers must be integers in 0..{MAX_DEMO_NUMBER}, got {n!r}.")


def _english_below_1000(n: int) -> str:
    hundreds, rest = divmod(n, 100)
    words = [f"{_EN_ONES[hundreds]} hundred"] if hundreds else []
    if rest:
        tens, ones = divmod(rest, 10)
        words.append(_EN_ONES[rest] if rest < 20 else _EN_TENS[tens] + (f"-{_EN_ONES[ones]}" if ones else ""))
    return " ".join(words)


def english_number(n: int) -> str:
    """American English words without "and": 3421 → "three thousand four hundred twenty-one"."""
    _check_number(n)
    if n == 0:
        return "zero"
    thousands, rest = divmod(n, 1000)
    words = [f"{_english_below_1000(thousands)} thousand"] if thousands else []
    if rest:
        words.append(_english_below_1000(rest))
    return " ".join(words)


def _german_below_1000(n: int, final: bool) -> str:
    """German words for 1..999; a trailing 1 is "eins" only at the very end of the number (`final`)."""
    hundreds, rest = divmod(n, 100)
    word = f"{'ein' if hundreds == 1 else _DE_ONES[hundreds]}hundert" if hundreds else ""
    if rest == 1:
        word += "eins" if final else "ein"
    elif rest < 20 and rest:
        word += _DE_ONES[rest]
    elif rest:
        tens, ones = divmod(rest, 10)
        unit = "ein" if ones == 1 else _DE_ONES[ones]
        word += (f"{unit}und" if ones else "") + _DE_TENS[tens]
    return word


def german_number(n: int) -> str:
    """German words written as one word: 3421 → "dreitausendvierhunderteinundzwanzig".

    Standard forms: "einhundert", "eintausend" (never bare "hundert"/"tausend"); "eins" only at the end
    ("einhunderteins", "eintausendeins"), "ein" inside ("einundzwanzig", "einhunderteintausend").
    """
    _check_number(n)
    if n == 0:
        return "null"
    thousands, rest = divmod(n, 1000)
    word = f"{_german_below_1000(thousands, final=False)}tausend" if thousands else ""
    if rest:
        word += _german_below_1000(rest, final=True)
    return word


def make_number_pairs(numbers: Sequence[int]) -> list[dict[str, str]]:
    """Translation pairs `{"en": english words, "de": german words}` for the given numbers."""
    return [{"en": english_number(n), "de": german_number(n)} for n in numbers]


def make_demo_splits(
    n_train: int = 6000,
    n_valid: int = 500,
    n_test: int = 500,
    max_number: int = 9999,
    seed: int = 42,
) -> datasets.DatasetDict:
    """The demo task: English → German spelled-out numbers, splits drawn from 0..`max_number` without overlap.

    A tiny stand-in for WMT EN-DE that needs no download: word order changes ("twenty-one" → "einundzwanzig",
    units before tens) and words fuse into one, so the model must learn reordering and subword output.
    """
    _check_number(max_number)
    sizes = {"train": n_train, "validation": n_valid, "test": n_test}
    if any(size < 0 for size in sizes.values()):
        raise ValueError(f"Split sizes must be non-negative, got {sizes}.")
    total = sum(sizes.values())
    if total > max_number + 1:
        raise ValueError(
            f"Asked for {total} distinct numbers ({sizes}) but 0..{max_number} has only {max_number + 1}; "
            "raise max_number (up to 999999) or lower the split sizes."
        )
    numbers = random.Random(seed).sample(range(max_number + 1), total)
    features = datasets.Features({"translation": datasets.Translation(languages=["en", "de"])})
    out, start = {}, 0
    for split, size in sizes.items():
        if size:
            pairs = make_number_pairs(numbers[start : start + size])
            out[split] = datasets.Dataset.from_dict({"translation": pairs}, features=features)
        start += size
    return datasets.DatasetDict(out)
