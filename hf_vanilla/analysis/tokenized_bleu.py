r"""The paper's BLEU: tokenized BLEU with compound splitting, after tensor2tensor's ``get_ende_bleu.sh``.

The paper's WMT14 EN-DE scores (27.3 base, 28.4 big, Table 2) are not sacreBLEU scores: tensor2tensor
tokenized hypotheses and references with Moses' ``tokenizer.perl -l de``, split hyphenated compounds with

    perl -ple 's{(\S)-(\S)}{$1 ##AT##-##AT## $2}g'

and scored the tokens with Moses' ``multi-bleu.perl`` (no smoothing, closest reference length). The split
makes ``Wahl-Kampagne`` three tokens, so a correct compound earns more n-grams: this BLEU is typically higher
than sacreBLEU's on the same output. :func:`tokenized_bleu` does the same three steps here:

1. tokenization with sacreBLEU's ``13a`` tokenizer (mteval-v13a, WMT's; ``intl`` on request), NOT Moses'
   ``tokenizer.perl`` (not a dependency of this package): both split punctuation from words and keep
   letter-letter hyphens, but Moses escapes ``& < > " '`` as HTML entities, splits apostrophes and some
   German abbreviations differently, and t2t first ran ``replace-unicode-punctuation.perl``, which is not
   done here. Scores can differ from the paper's pipeline by a few tenths;
2. the compound split with the same regular expression and the same left-to-right, non-overlapping
   matching as Perl's ``s///g`` (``a-b-c`` becomes ``a ##AT##-##AT## b-c``, exactly as the Perl one-liner);
3. corpus BLEU of the whitespace tokens with no smoothing and closest reference length, as
   ``multi-bleu.perl`` (sacreBLEU with ``tokenize="none", smooth_method="none"``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from sacrebleu.metrics.bleu import BLEU
from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a
from sacrebleu.tokenizers.tokenizer_intl import TokenizerV14International

__all__ = [
    "COMPOUND_SPLIT",
    "TOKENIZED_BLEU_TOKENIZERS",
    "check_segments",
    "split_compounds",
    "tokenize_for_bleu",
    "tokenized_bleu",
]

#: The compound-splitting rule of tensor2tensor's get_ende_bleu.sh (a Perl ``s{(\S)-(\S)}{...}g``).
COMPOUND_SPLIT = re.compile(r"(\S)-(\S)")

#: Tokenizers the tokenized BLEU can use (sacreBLEU's; see the module docstring for how they differ from Moses).
TOKENIZED_BLEU_TOKENIZERS = {"13a": Tokenizer13a, "intl": TokenizerV14International}


def split_compounds(text: str) -> str:
    """``perl -ple 's{(\\S)-(\\S)}{$1 ##AT##-##AT## $2}g'`` on one line."""
    return COMPOUND_SPLIT.sub(r"\1 ##AT##-##AT## \2", text)


def tokenize_for_bleu(text: str, tokenizer: str = "13a") -> str:
    """One segment as the paper scored it: tokenized (sacreBLEU's ``tokenizer``), then compounds split."""
    if tokenizer not in TOKENIZED_BLEU_TOKENIZERS:
        raise ValueError(
            f"tokenized BLEU tokenizer {tokenizer!r} is not one of {', '.join(TOKENIZED_BLEU_TOKENIZERS)}."
        )
    return split_compounds(TOKENIZED_BLEU_TOKENIZERS[tokenizer]()(text.strip()))


def check_segments(hypotheses: Sequence[str], references: Sequence[object]) -> None:
    """Refuse (``ValueError``) an empty list of hypotheses or one whose length differs from the
    references' (one reference entry per hypothesis)."""
    if len(hypotheses) != len(references):
        raise ValueError(
            f"Got {len(hypotheses)} hypotheses but {len(references)} references: "
            "pass exactly one reference entry per hypothesis."
        )
    if not hypotheses:
        raise ValueError("No hypotheses to score: pass at least one segment.")


def tokenized_bleu(
    hypotheses: Sequence[str],
    references: Sequence[str] | Sequence[Sequence[str]],
    tokenizer: str = "13a",
) -> dict[str, object]:
    """Corpus BLEU of detokenized ``hypotheses`` against ``references`` (a string or a list of strings per
    segment) the paper's way (module docstring).

    Returns:
        ``{"tokenized_bleu", "tokenized_bleu_method", "tokenized_bleu_precisions", "tokenized_bleu_bp"}``
        (score and precisions in [0, 100]); the method string names the tokenizer, the split and the scorer.
    """
    check_segments(hypotheses, references)
    per_segment = [[r] if isinstance(r, str) else list(r) for r in references]
    if len({len(r) for r in per_segment}) != 1:
        raise ValueError("Every segment needs the same number of references.")
    streams = [[tokenize_for_bleu(r[i], tokenizer) for r in per_segment] for i in range(len(per_segment[0]))]
    hyps = [tokenize_for_bleu(h, tokenizer) for h in hypotheses]
    score = BLEU(tokenize="none", smooth_method="none", force=True).corpus_score(hyps, streams)
    return {
        "tokenized_bleu": score.score,
        "tokenized_bleu_method": f"tok:{tokenizer}+compound-split(##AT##)|multi-bleu(no smoothing)"
        f"|nrefs:{len(streams)}",
        "tokenized_bleu_precisions": list(score.precisions),
        "tokenized_bleu_bp": score.bp,
    }
