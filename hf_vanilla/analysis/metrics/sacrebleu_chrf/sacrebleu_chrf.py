"""Corpus BLEU and chrF with sacreBLEU, as a local ``evaluate`` metric module that works offline.

``evaluate.load("sacrebleu")`` fetches its script from the Hugging Face Hub; this module is shipped
inside the ``hf_vanilla`` package and is loaded by path instead::

    import evaluate
    from hf_vanilla.analysis.evaluation import METRIC_PATH

    metric = evaluate.load(METRIC_PATH)  # works with HF_HUB_OFFLINE=1
    metric.compute(predictions=["Ein Hund läuft."], references=[["Ein Hund rennt."]])

BLEU is the metric of the paper's Table 2 (Vaswani et al., 2017, §6.1). sacreBLEU (Post, 2018) makes
it reproducible: scores are computed on detokenized, cased text with sacreBLEU's own ``13a``
tokenizer, and the returned *signature* records every setting. The paper's numbers were computed
with a different (tokenized, ``multi-bleu.perl``-style) pipeline and are not directly comparable.
chrF (Popović, 2015) is reported next to BLEU because it is more reliable on single sentences
and small test sets.

It is a drop-in for ``evaluate.load("sacrebleu")``: it returns that metric's keys (``score``, ``counts``,
``totals``, ``precisions``, ``bp``, ``sys_len``, ``ref_len``) and takes its ``compute`` arguments (``tokenize``,
``lowercase``, ``smooth_method``, ``smooth_value``, ``force``, ``use_effective_order``), so the stock example
scripts (``run_translation.py`` reads ``result["score"]``) run with only the metric's path changed.

This file is self-contained (no ``hf_vanilla`` imports) because ``evaluate`` copies it into its
module cache before importing it.
"""

from __future__ import annotations

from typing import Any

import datasets
import evaluate
from sacrebleu.metrics import BLEU, CHRF

_CITATION = """\
@inproceedings{post-2018-call,
    title = "A Call for Clarity in Reporting {BLEU} Scores",
    author = "Post, Matt",
    booktitle = "Proceedings of the Third Conference on Machine Translation: Research Papers",
    year = "2018",
    pages = "186--191",
}
@inproceedings{popovic-2015-chrf,
    title = "chr{F}: character n-gram {F}-score for automatic {MT} evaluation",
    author = "Popovi{\\'c}, Maja",
    booktitle = "Proceedings of the Tenth Workshop on Statistical Machine Translation",
    year = "2015",
    pages = "392--395",
}
"""

_DESCRIPTION = """\
Corpus-level BLEU and chrF computed with sacreBLEU, each returned with its sacreBLEU signature.
Predictions and references are detokenized strings; each prediction may have several references.
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions: list of hypothesis strings, one per segment.
    references: list of reference lists (one list of strings per segment; every segment must have
        the same number of references), or a list of single reference strings.
    bleu_tokenize (or ``tokenize``, evaluate's sacrebleu name): sacreBLEU tokenizer for BLEU; default "13a"
        (the WMT standard).
    lowercase: compute case-insensitive scores; default False (cased, as usual for WMT).
    smooth_method, smooth_value, force, use_effective_order: sacreBLEU's BLEU options, as in
        evaluate's sacrebleu metric (defaults "exp", None, False, False).
    char_order: character n-gram order of chrF; default 6.
    word_order: word n-gram order of chrF; default 0 (chrF; 2 gives chrF++).
    beta: recall weight of chrF; default 2.
Returns:
    score, bleu: corpus BLEU in [0, 100] (``score`` is evaluate's sacrebleu key).
    bleu_signature: sacreBLEU's signature for BLEU, e.g. "nrefs:1|case:mixed|eff:no|tok:13a|...".
    counts, totals, precisions, bp, sys_len, ref_len: BLEU's n-gram statistics.
    chrf: corpus chrF in [0, 100].
    chrf_signature: sacreBLEU's signature for chrF.
Examples:
    >>> metric = evaluate.load("path/to/hf_vanilla/metrics/sacrebleu_chrf")
    >>> hyps, refs = ["the cat sat on the mat"], [["the cat sat on the mat"]]
    >>> metric.compute(predictions=hyps, references=refs)["bleu"]
    100.0
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class SacrebleuChrf(evaluate.Metric):
    """Corpus BLEU (sacreBLEU, 13a, cased) and chrF, with signatures."""

    def _info(self) -> evaluate.MetricInfo:
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=[
                datasets.Features(
                    {
                        "predictions": datasets.Value("string"),
                        "references": datasets.Sequence(datasets.Value("string")),
                    }
                ),
                datasets.Features(
                    {
                        "predictions": datasets.Value("string"),
                        "references": datasets.Value("string"),
                    }
                ),
            ],
            codebase_urls=["https://github.com/mjpost/sacrebleu"],
            reference_urls=["https://aclanthology.org/W18-6319/", "https://aclanthology.org/W15-3049/"],
        )

    def _compute(
        self,
        predictions: list[str],
        references: list[list[str]] | list[str],
        bleu_tokenize: str | None = None,
        lowercase: bool = False,
        tokenize: str | None = None,
        smooth_method: str = "exp",
        smooth_value: float | None = None,
        force: bool = False,
        use_effective_order: bool = False,
        char_order: int = 6,
        word_order: int = 0,
        beta: int = 2,
    ) -> dict[str, Any]:
        if references and isinstance(references[0], str):
            references = [[reference] for reference in references]
        counts = {len(refs) for refs in references}
        if len(counts) > 1:
            raise ValueError(
                f"Every prediction needs the same number of references, got {sorted(counts)}: "
                "pad missing references or drop the extra ones."
            )
        # sacreBLEU wants one stream per reference position: ref_streams[j][i] is reference j of segment i.
        n_refs = counts.pop() if counts else 1
        ref_streams = [[refs[j] for refs in references] for j in range(n_refs)]

        if bleu_tokenize is not None and tokenize is not None and bleu_tokenize != tokenize:
            raise ValueError(
                f"bleu_tokenize={bleu_tokenize!r} and tokenize={tokenize!r} name two BLEU tokenizers: pass one."
            )
        bleu = BLEU(
            tokenize=bleu_tokenize or tokenize or "13a",
            lowercase=lowercase,
            smooth_method=smooth_method,
            smooth_value=smooth_value,
            force=force,
            effective_order=use_effective_order,
        )
        bleu_score = bleu.corpus_score(predictions, ref_streams)
        chrf = CHRF(char_order=char_order, word_order=word_order, beta=beta, lowercase=lowercase)
        chrf_score = chrf.corpus_score(predictions, ref_streams)
        return {
            "score": bleu_score.score,
            "bleu": bleu_score.score,
            "bleu_signature": str(bleu.get_signature()),
            "counts": bleu_score.counts,
            "totals": bleu_score.totals,
            "precisions": bleu_score.precisions,
            "bp": bleu_score.bp,
            "sys_len": bleu_score.sys_len,
            "ref_len": bleu_score.ref_len,
            "chrf": chrf_score.score,
            "chrf_signature": str(chrf.get_signature()),
        }
