"""The paper's tokenized BLEU with compound splitting (tensor2tensor's get_ende_bleu.sh), on small strings
whose n-gram counts are worked out by hand in the comments."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from hf_vanilla.analysis.evaluation import compute_bleu_chrf, evaluate_translations
from hf_vanilla.analysis.tokenized_bleu import split_compounds, tokenize_for_bleu, tokenized_bleu
from hf_vanilla.cli.evaluate_bleu import main as evaluate_main


def test_compound_split_is_the_perl_one_liner() -> None:
    # perl -ple 's{(\S)-(\S)}{$1 ##AT##-##AT## $2}g': left to right, matches do not overlap, so the second
    # hyphen of a-b-c stays (its left character was taken by the first match); spaced or edge hyphens stay.
    assert split_compounds("rich-text format") == "rich ##AT##-##AT## text format"
    assert split_compounds("a-b-c") == "a ##AT##-##AT## b-c"
    assert split_compounds("a - b -c d-") == "a - b -c d-"
    assert tokenize_for_bleu("Die Wahl-Kampagne beginnt heute.") == (
        "Die Wahl ##AT##-##AT## Kampagne beginnt heute ."
    )


def test_tokenized_bleu_counts_the_split_compound_as_three_tokens() -> None:
    hyp, ref = "Die Wahl-Kampagne beginnt heute.", "Die Wahl-Kampagne beginnt morgen."
    # Tokens after 13a + split: Die Wahl ##AT##-##AT## Kampagne beginnt heute|morgen .  (7 each, BP = 1)
    # 1-grams 6/7, 2-grams 4/6, 3-grams 3/5, 4-grams 2/4.
    expected = 100 * (6 / 7 * 4 / 6 * 3 / 5 * 2 / 4) ** 0.25  # 64.35
    scores = tokenized_bleu([hyp], [ref])
    assert scores["tokenized_bleu"] == pytest.approx(expected)
    assert scores["tokenized_bleu_precisions"] == pytest.approx([600 / 7, 400 / 6, 60, 50])
    assert (
        "compound-split" in scores["tokenized_bleu_method"] and "tok:13a" in scores["tokenized_bleu_method"]
    )
    # Unsplit (sacreBLEU 13a, compute_bleu_chrf): Die Wahl-Kampagne beginnt heute . -> 1-grams 4/5,
    # 2-grams 2/4, 3-grams 1/3, 4-grams 0/2, which sacreBLEU's exp smoothing makes 1/(2·2): (1/30)^(1/4).
    unsplit = 100 * (4 / 5 * 2 / 4 * 1 / 3 * 1 / 4) ** 0.25  # 42.73
    assert compute_bleu_chrf([hyp], [ref])["bleu"] == pytest.approx(unsplit)


def test_tokenized_bleu_brevity_penalty_and_closest_reference() -> None:
    # Hyp: a b c d (4 tokens); refs: "a b c d e f" (6) and "a b c d e f g h" (8): closest is 6,
    # BP = exp(1 - 6/4); every n-gram of the hypothesis matches.
    scores = tokenized_bleu(["a b c d"], [["a b c d e f", "a b c d e f g h"]])
    assert scores["tokenized_bleu"] == pytest.approx(100 * math.exp(1 - 6 / 4))
    assert scores["tokenized_bleu_bp"] == pytest.approx(math.exp(1 - 6 / 4))
    # Two segments pooled (corpus BLEU, not an average): x-y z vs x-y z; q vs r.
    # Tokens: [x ##AT##-##AT## y z] + [q] vs [x ##AT##-##AT## y z] + [r]: 1-grams 4/5, 2-grams 3/3,
    # 3-grams 2/2, 4-grams 1/1 (the one-token segment has no n-grams above 1).
    pooled = tokenized_bleu(["x-y z", "q"], ["x-y z", "r"])
    assert pooled["tokenized_bleu"] == pytest.approx(100 * (4 / 5) ** 0.25)


def test_tokenized_bleu_refuses_bad_input() -> None:
    with pytest.raises(ValueError, match="1 hypotheses but 2 references"):
        tokenized_bleu(["a"], ["a", "b"])
    with pytest.raises(ValueError, match="'moses' is not one of 13a, intl"):
        tokenized_bleu(["a"], ["a"], tokenizer="moses")


def test_evaluate_translations_adds_the_tokenized_bleu(model, tokenizer) -> None:
    sources, references = ["w1 w2 w3", "w7 w8"], ["w1 w2-w3", "w7 w8"]
    kwargs = {"device": "cpu", "generate_kwargs": {"max_new_tokens": 4}}
    results = evaluate_translations(
        model, tokenizer, sources, references, tokenized_bleu_tokenizer="13a", **kwargs
    )
    expected = tokenized_bleu(results["hypotheses"], references)
    assert results["tokenized_bleu"] == expected["tokenized_bleu"]
    assert results["tokenized_bleu_method"] == expected["tokenized_bleu_method"]
    assert "tokenized_bleu" not in evaluate_translations(model, tokenizer, sources, references, **kwargs)


def test_an_unknown_tokenized_bleu_tokenizer_is_one_line_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--model_name_or_path", str(tmp_path / "absent"), "--validation_files", str(tmp_path / "absent"),
            "--source_lang", "en", "--target_lang", "de", "--tokenized_bleu", "moses"]  # fmt: skip
    assert evaluate_main(argv) in (1, 2)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --tokenized_bleu 'moses' is not one of 13a, intl")
    assert list(tmp_path.iterdir()) == []
