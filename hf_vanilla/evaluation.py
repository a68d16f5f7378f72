"""BLEU and chrF of a model's translations, computed offline (Vaswani et al., 2017, §6.1, Table 2).

Scores come from sacreBLEU through a local ``evaluate`` metric module shipped in this package
(:data:`METRIC_PATH`), so nothing is fetched from the Hub: corpus BLEU (cased, ``13a``
tokenizer) and chrF, each with its sacreBLEU signature. Translations use the paper's decoding
(beam 4, α = 0.6, max output length = input length + 50, stop when no better hypothesis can appear;
see :mod:`hf_vanilla.translate`).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

import evaluate

from hf_vanilla.durability import atomic_file
from hf_vanilla.translate import DecodingOptions, translate

logger = logging.getLogger(__name__)

#: Folder of the offline ``evaluate`` metric module (corpus BLEU + chrF with signatures).
METRIC_PATH = str(Path(__file__).resolve().parent / "metrics" / "sacrebleu_chrf")

__all__ = [
    "METRIC_PATH",
    "compute_bleu_chrf",
    "evaluate_dataset",
    "evaluate_translations",
    "load_metric",
    "write_results",
]


@lru_cache(maxsize=1)
def load_metric() -> evaluate.EvaluationModule:
    """Load the packaged metric module by path (works with ``HF_HUB_OFFLINE=1``)."""
    return evaluate.load(METRIC_PATH)


def compute_bleu_chrf(
    hypotheses: Sequence[str],
    references: Sequence[str] | Sequence[Sequence[str]],
    bleu_tokenize: str = "13a",
) -> dict:
    """Corpus BLEU and chrF of ``hypotheses`` against ``references``.

    Args:
        hypotheses: one detokenized translation per segment.
        references: one reference string per segment, or a list of references per segment.
        bleu_tokenize: sacreBLEU's tokenizer for BLEU: ``"13a"`` (the WMT standard) or e.g.
            ``"char"`` for one-word outputs, where word BLEU has no 2- to 4-grams and is always 0.

    Returns:
        ``{"bleu", "bleu_signature", "chrf", "chrf_signature", "counts", "totals", "precisions", "bp",
        "sys_len", "ref_len"}`` (scores in [0, 100]).
    """
    if len(hypotheses) != len(references):
        raise ValueError(
            f"Got {len(hypotheses)} hypotheses but {len(references)} references: "
            "pass exactly one reference entry per hypothesis."
        )
    if not hypotheses:
        raise ValueError("No hypotheses to score: pass at least one segment.")
    return load_metric().compute(
        predictions=list(hypotheses), references=list(references), bleu_tokenize=bleu_tokenize
    )


def evaluate_translations(
    model: Any,
    tokenizer: Any,
    sources: Sequence[str],
    references: Sequence[str] | Sequence[Sequence[str]],
    options: DecodingOptions | None = None,
    batch_size: int = 64,
    device: str | None = None,
    hypotheses_file: str | Path | None = None,
    generate_kwargs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Translate ``sources``, score them against ``references`` and optionally write the hypotheses.

    Returns:
        the scores of :func:`compute_bleu_chrf` plus ``"num_segments"``, ``"decoding"`` (the settings,
        including which length penalty and stopping rule were used), ``"decoding_seconds"`` (wall
        time of the translation alone) and ``"hypotheses"``.
    """
    if len(sources) != len(references):
        raise ValueError(
            f"Got {len(sources)} source segments but {len(references)} references: the files must be parallel."
        )
    options = options or DecodingOptions()
    logger.info("Translating %d segments: %s", len(sources), options.describe())
    start = time.perf_counter()
    hypotheses = translate(model, tokenizer, sources, options, batch_size, device, generate_kwargs)
    decoding_seconds = time.perf_counter() - start
    logger.info("Translated %d segments in %.1f s", len(sources), decoding_seconds)
    if hypotheses_file is not None:
        with atomic_file(hypotheses_file) as handle:  # whole or absent
            handle.write("".join(h + "\n" for h in hypotheses))
        logger.info("Wrote %s", hypotheses_file)
    scores = compute_bleu_chrf(hypotheses, references)
    return {
        **scores,
        "num_segments": len(sources),
        "decoding": options.to_dict(),
        "decoding_seconds": decoding_seconds,
        "hypotheses": hypotheses,
    }


def evaluate_dataset(
    model: Any,
    tokenizer: Any,
    dataset: Any,
    source_lang: str,
    target_lang: str,
    **kwargs: Any,
) -> dict[str, Any]:
    """Evaluate on a ``datasets.Dataset`` with a ``translation`` column of ``{source_lang: ..., target_lang: ...}``.

    Keyword arguments go to :func:`evaluate_translations`.
    """
    if "translation" not in dataset.column_names:
        raise ValueError(
            f"The dataset has columns {dataset.column_names}; expected a 'translation' column of "
            f"{{{source_lang!r}: ..., {target_lang!r}: ...}} dicts (see hf_vanilla.data)."
        )
    pairs = dataset["translation"]
    if pairs and not {source_lang, target_lang} <= set(pairs[0]):
        raise ValueError(
            f"The 'translation' entries have keys {sorted(pairs[0])}, not {source_lang!r} and {target_lang!r}: "
            "pass the language codes used in the dataset."
        )
    sources = [pair[source_lang] for pair in pairs]
    references = [pair[target_lang] for pair in pairs]
    return evaluate_translations(model, tokenizer, sources, references, **kwargs)


def write_results(results: dict[str, Any], path: str | Path) -> Path:
    """Write the scores and decoding settings (not the hypotheses) as JSON (under a temporary name, then
    renamed into place)."""
    summary = {key: value for key, value in results.items() if key != "hypotheses"}
    with atomic_file(path) as handle:
        handle.write(json.dumps(summary, indent=2, ensure_ascii=False) + "\n")
    return Path(path)
