"""BLEU and chrF of a model's translations, computed offline (Vaswani et al., 2017, §6.1, Table 2).

Scores come from sacreBLEU through a local ``evaluate`` metric module shipped in this package
(:data:`METRIC_PATH`), so nothing is fetched from the Hub: corpus BLEU (cased, ``13a``
tokenizer by default, any of sacreBLEU's: :data:`BLEU_TOKENIZERS`) and chrF, each with its sacreBLEU
signature. Standard test sets come by their sacreBLEU name through sacreBLEU's own downloader and
cache (:func:`load_sacrebleu_test_set`). Translations use the paper's decoding
(beam 4, α = 0.6, max output length = input length + 50, stop when no better hypothesis can appear;
see :mod:`hf_vanilla.inference.translation`).
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
from sacrebleu.metrics.bleu import BLEU

from hf_vanilla.analysis.tokenized_bleu import TOKENIZED_BLEU_TOKENIZERS, check_segments, tokenized_bleu
from hf_vanilla.data.loading import hub_offline
from hf_vanilla.inference.ctranslate2 import CTranslate2Model
from hf_vanilla.inference.options import DecodingOptions
from hf_vanilla.inference.translation import translate
from hf_vanilla.io.atomic import atomic_file
from hf_vanilla.io.checked_loading import loaded_weights_fingerprint

logger = logging.getLogger(__name__)

#: Folder of the offline ``evaluate`` metric module (corpus BLEU + chrF with signatures).
METRIC_PATH = str(Path(__file__).resolve().parent / "metrics" / "sacrebleu_chrf")

#: sacreBLEU's BLEU tokenizers (``--bleu_tokenize``): 13a (WMT's), intl, char, zh, none, ...
BLEU_TOKENIZERS = tuple(BLEU.TOKENIZERS)

__all__ = [
    "BLEU_TOKENIZERS",
    "METRIC_PATH",
    "check_bleu_tokenize",
    "check_tokenized_bleu",
    "choose_bleu_tokenize",
    "compute_bleu_chrf",
    "evaluate_dataset",
    "evaluate_split_into",
    "evaluate_translations",
    "load_metric",
    "load_sacrebleu_test_set",
    "parallel_columns",
    "result_files",
    "write_results",
]


@lru_cache(maxsize=1)
def load_metric() -> evaluate.EvaluationModule:
    """Load the packaged metric module by path (works with ``HF_HUB_OFFLINE=1``)."""
    return evaluate.load(METRIC_PATH)


def choose_bleu_tokenize(name: str, references: Sequence[str]) -> tuple[str, str]:
    """Resolve ``--bleu_tokenize auto``: ``"char"`` when every reference is one word (the numbers task:
    word BLEU would count one 4-gram per sentence and score 0 beside a high chrF), else ``"13a"``.
    Returns the tokenizer and a sentence saying why, for the command's output; a named one is kept."""
    if name != "auto":
        return name, f"BLEU tokenizer {name!r}, as asked (--bleu_tokenize)."
    if references and all(len(reference.split()) <= 1 for reference in references):
        return "char", (
            "BLEU tokenizer 'char' (--bleu_tokenize auto): every reference is one word, so word-level BLEU "
            "(13a) has no 4-grams to match; give --bleu_tokenize 13a for word BLEU."
        )
    return "13a", "BLEU tokenizer '13a', WMT's (--bleu_tokenize auto: the references are sentences)."


def check_bleu_tokenize(name: str) -> None:
    """Refuse a name that is not one of sacreBLEU's BLEU tokenizers (:data:`BLEU_TOKENIZERS`)."""
    if name not in BLEU_TOKENIZERS:
        raise ValueError(
            f"--bleu_tokenize {name!r} is not one of sacreBLEU's tokenizers: {', '.join(BLEU_TOKENIZERS)}."
        )


def check_tokenized_bleu(name: str | None) -> None:
    """Refuse a ``--tokenized_bleu`` tokenizer other than :data:`TOKENIZED_BLEU_TOKENIZERS` (None: off)."""
    if name is not None and name not in TOKENIZED_BLEU_TOKENIZERS:
        raise ValueError(
            f"--tokenized_bleu {name!r} is not one of {', '.join(TOKENIZED_BLEU_TOKENIZERS)} (sacreBLEU's "
            "tokenizers used for the paper's tokenized BLEU)."
        )


def compute_bleu_chrf(
    hypotheses: Sequence[str],
    references: Sequence[str] | Sequence[Sequence[str]],
    bleu_tokenize: str = "13a",
) -> dict:
    """Corpus BLEU and chrF of ``hypotheses`` against ``references``.

    Args:
        hypotheses: one detokenized translation per segment.
        references: one reference string per segment, or a list of references per segment.
        bleu_tokenize: sacreBLEU's tokenizer for BLEU (:data:`BLEU_TOKENIZERS`): ``"13a"`` (the WMT
            standard), ``"intl"``, ``"zh"``, ``"none"``, or e.g. ``"char"`` for one-word outputs, where
            word BLEU has no 2- to 4-grams and is always 0. The signature names it (``tok:...``).

    Returns:
        ``{"bleu", "bleu_signature", "chrf", "chrf_signature", "counts", "totals", "precisions", "bp",
        "sys_len", "ref_len"}`` (scores in [0, 100]).
    """
    check_segments(hypotheses, references)
    check_bleu_tokenize(bleu_tokenize)
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
    bleu_tokenize: str = "13a",
    tokenized_bleu_tokenizer: str | None = None,
    max_tokens: int = 0,
) -> dict[str, Any]:
    """Translate ``sources``, score them against ``references`` (BLEU with sacreBLEU's ``bleu_tokenize``)
    and optionally write the hypotheses. ``batch_size`` and ``max_tokens`` batch the translation as in
    :func:`~hf_vanilla.inference.translation.translate`. With ``tokenized_bleu_tokenizer`` (``"13a"`` or ``"intl"``) the
    paper's tokenized BLEU with compound splitting is added (:func:`hf_vanilla.analysis.tokenized_bleu.tokenized_bleu`).

    Returns:
        the scores of :func:`compute_bleu_chrf` plus ``"num_segments"``, ``"decoding"`` (the settings,
        including which length penalty and stopping rule were used), ``"decoding_seconds"`` (wall
        time of the translation alone) and ``"hypotheses"``.
    """
    if len(sources) != len(references):
        raise ValueError(
            f"Got {len(sources)} source segments but {len(references)} references: the files must be parallel."
        )
    check_bleu_tokenize(bleu_tokenize)  # before the translation, not after
    check_tokenized_bleu(tokenized_bleu_tokenizer)
    options = options or DecodingOptions()
    decoding = decoding_record(model, options)
    logger.info("Translating %d segments: %s", len(sources), decoding["description"])
    start = time.perf_counter()
    hypotheses = translate(
        model, tokenizer, sources, options, batch_size, device, generate_kwargs, max_tokens=max_tokens
    )
    decoding_seconds = time.perf_counter() - start
    logger.info("Translated %d segments in %.1f s", len(sources), decoding_seconds)
    if hypotheses_file is not None:
        with atomic_file(hypotheses_file) as handle:  # whole or absent
            handle.write("".join(h + "\n" for h in hypotheses))
        logger.info("Wrote %s", hypotheses_file)
    scores = compute_bleu_chrf(hypotheses, references, bleu_tokenize=bleu_tokenize)
    if tokenized_bleu_tokenizer:
        scores.update(tokenized_bleu(hypotheses, references, tokenizer=tokenized_bleu_tokenizer))
    return {
        **scores,
        "num_segments": len(sources),
        "decoding": decoding,
        "decoding_seconds": decoding_seconds,
        "hypotheses": hypotheses,
    }


def decoding_record(model: Any, options: DecodingOptions) -> dict[str, Any]:
    """The decoding settings as a results file records them: :meth:`DecodingOptions.to_dict`, and for a
    CTranslate2 export what CTranslate2 did instead (its own stopping rule: ``early_stopping`` unused)."""
    record = options.to_dict()
    if isinstance(model, CTranslate2Model):
        record.update(backend="ctranslate2", early_stopping=None, description=model.describe(options))
    return record


def parallel_columns(dataset: Any, source_lang: str, target_lang: str) -> tuple[list[str], list[str]]:
    """Sources and references of a ``datasets.Dataset`` with a ``translation`` column of
    ``{source_lang: ..., target_lang: ...}``."""
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
    return [pair[source_lang] for pair in pairs], [pair[target_lang] for pair in pairs]


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
    sources, references = parallel_columns(dataset, source_lang, target_lang)
    return evaluate_translations(model, tokenizer, sources, references, **kwargs)


def load_sacrebleu_test_set(name: str, language_pair: str) -> tuple[list[str], list[list[str]]]:
    """Sources and references (a list per segment) of sacreBLEU's test set ``name`` (e.g. ``"wmt14"``) for
    ``language_pair`` (e.g. ``"de-en"``), through sacreBLEU's own downloader and cache (``$SACREBLEU``,
    default ``~/.sacrebleu``). Offline (``HF_HUB_OFFLINE=1`` or ``HF_DATASETS_OFFLINE=1``) only the cache
    is used; a set that is not there, or a failed download, raises ``ValueError`` in one line."""
    from sacrebleu.dataset import DATASETS
    from sacrebleu.utils import SACREBLEU_DIR

    if name not in DATASETS:
        raise ValueError(
            f"--sacrebleu_test_set {name!r} is not a sacreBLEU test set (`sacrebleu --list` lists them; "
            "e.g. wmt14, wmt19, flores200)."
        )
    dataset = DATASETS[name]
    if language_pair not in dataset.langpairs:
        pairs = ", ".join(sorted(pair for pair in dataset.langpairs if pair != "citation"))
        raise ValueError(
            f"sacreBLEU test set {name!r} has no language pair {language_pair!r}; it has: {pairs}."
        )
    cached = Path(SACREBLEU_DIR, name, "raw")
    if hub_offline() and not (cached.is_dir() and any(cached.iterdir())):
        raise ValueError(
            f"sacreBLEU test set {name} {language_pair} is not in sacreBLEU's cache ({cached}) and this run is "
            "offline (HF_HUB_OFFLINE/HF_DATASETS_OFFLINE): fetch it once online (`sacrebleu -t "
            f"{name} -l {language_pair} --echo src > /dev/null`) or pass the files with --validation_files."
        )
    try:
        source_file = dataset.get_source_file(language_pair)
        reference_files = dataset.get_reference_files(language_pair)
    except (OSError, SystemExit) as err:  # sacreBLEU's downloader calls sys.exit(1) on some failures
        raise ValueError(
            f"sacreBLEU test set {name} {language_pair} could not be fetched into {cached} ({err or 'download failed'}): "
            "check the connection, or pass the files with --validation_files."
        ) from None
    sources = Path(source_file).read_text(encoding="utf-8-sig").splitlines()
    references = [Path(f).read_text(encoding="utf-8-sig").splitlines() for f in reference_files]
    return sources, [list(segment) for segment in zip(*references, strict=True)]


def write_results(results: dict[str, Any], path: str | Path) -> Path:
    """Write the scores and decoding settings (not the hypotheses) as JSON (under a temporary name, then
    renamed into place)."""
    summary = {key: value for key, value in results.items() if key != "hypotheses"}
    with atomic_file(path) as handle:
        handle.write(json.dumps(summary, indent=2, ensure_ascii=False) + "\n")
    return Path(path)


def result_files(output_dir: str | Path, split: str, target_lang: str) -> tuple[Path, Path]:
    """Where a split's evaluation goes: ``<output_dir>/<split>.hyp.<target_lang>`` (the hypotheses) and
    ``<output_dir>/<split>.results.json`` (what ``hf-vanilla-publish --results_files`` reads)."""
    output_dir = Path(output_dir)
    return output_dir / f"{split}.hyp.{target_lang}", output_dir / f"{split}.results.json"


def evaluate_split_into(
    output_dir: str | Path,
    model: Any,
    tokenizer: Any,
    sources: Sequence[str],
    references: Sequence[str] | Sequence[Sequence[str]],
    *,
    split: str,
    source_lang: str,
    target_lang: str,
    model_name: str,
    dataset_name: str,
    **kwargs: Any,
) -> tuple[dict[str, Any], Path]:
    """Translate and score one split as ``hf-vanilla-evaluate`` does, writing its :func:`result_files`
    (existing ones are replaced). The results name the split, the languages, the model (its name and
    ``model_sha256``, the fingerprint of the weights ``model`` was built from:
    :func:`hf_vanilla.io.checked_loading.loaded_weights_fingerprint`, ``None`` for a model not loaded from a
    local folder by :func:`~hf_vanilla.io.checked_loading.load_pretrained_checked`) and the data, as the model
    card needs them. The fingerprint is taken from the model, not from the folder after translating: the
    folder's weights may have been replaced meanwhile. Keyword arguments go to
    :func:`evaluate_translations`. Returns the results and the path of the results file."""
    hypotheses_file, results_file = result_files(output_dir, split, target_lang)
    results = evaluate_translations(
        model, tokenizer, sources, references, hypotheses_file=hypotheses_file, **kwargs
    )
    results.update(
        split=split,
        source_lang=source_lang,
        target_lang=target_lang,
        model=model_name,
        model_sha256=loaded_weights_fingerprint(model),
        dataset_name=dataset_name,
    )
    return results, write_results(results, results_file)
