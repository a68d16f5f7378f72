"""Offline BLEU/chrF metric module, §6.1 decoding (beam 4, α = 0.6, input length + 50) and evaluation."""

from __future__ import annotations

import json
import runpy
import sys
from pathlib import Path
from types import SimpleNamespace

import datasets
import evaluate
import pytest
import torch
from sacrebleu.metrics import BLEU, CHRF

import hf_vanilla
from hf_vanilla.analysis.evaluation import (
    METRIC_PATH,
    compute_bleu_chrf,
    evaluate_dataset,
    evaluate_translations,
    write_results,
)
from hf_vanilla.inference.decoding import (
    generate_ids,
    gnmt_length_penalty,
    nbest_log_probs,
    paper_generation_kwargs,
)
from hf_vanilla.inference.options import DecodingOptions
from hf_vanilla.inference.streaming import translate_stream
from hf_vanilla.inference.translation import translate

REPO = Path(__file__).resolve().parents[2]

HYPS = [
    "A man in an orange hat starring at something.",
    "A Boston Terrier is running on lush green grass in front of a white fence.",
    "A girl in karate uniform breaking a stick with a front kick.",
    "Five people wearing winter jackets and helmets stand in the snow.",
]
REFS = [
    "A man in an orange hat staring at something.",
    "A Boston terrier runs through lush green grass in front of a white fence.",
    "A girl in a karate uniform is breaking a stick with a front kick.",
    "Five people in winter jackets and helmets stand in the snow, with snowmobiles in the background.",
]
REFS2 = [
    "A man wearing an orange hat looks at something.",
    "A dog runs on green grass near a white fence.",
    "A girl in a karate uniform breaks a board with a kick.",
    "Five people in winter clothing stand in the snow.",
]

#: Short outputs keep the tests fast: a random tiny model otherwise runs to input length + 50.
SHORT = {"max_new_tokens": 4}

SOURCES = ["w1 w2 w3 w4 w5", "w7", "w10 w11 w12", "w20 w21 w22 w23 w24 w25 w26 w27 w28", "w30 w31"]


# --- metric module ---------------------------------------------------------------------------------


def test_metric_module_is_package_data() -> None:
    """pyproject ships `analysis/metrics/*/*.py`: the module must live there, named like its folder."""
    package = Path(hf_vanilla.__file__).parent
    assert Path(METRIC_PATH, "sacrebleu_chrf.py") in [
        p.resolve() for p in package.glob("analysis/metrics/*/*.py")
    ]


def test_scores_equal_sacrebleu() -> None:
    scores = compute_bleu_chrf(HYPS, REFS)
    bleu, chrf = BLEU(), CHRF()
    assert scores["bleu"] == pytest.approx(bleu.corpus_score(HYPS, [REFS]).score, abs=1e-9)
    assert scores["chrf"] == pytest.approx(chrf.corpus_score(HYPS, [REFS]).score, abs=1e-9)
    assert scores["bleu_signature"] == str(bleu.get_signature())
    assert scores["chrf_signature"] == str(chrf.get_signature())
    assert "tok:13a" in scores["bleu_signature"] and "case:mixed" in scores["bleu_signature"]
    assert 0.0 < scores["bleu"] < 100.0


def test_multiple_references_equal_sacrebleu() -> None:
    scores = compute_bleu_chrf(HYPS, [list(pair) for pair in zip(REFS, REFS2, strict=True)])
    assert scores["bleu"] == pytest.approx(BLEU().corpus_score(HYPS, [REFS, REFS2]).score, abs=1e-9)
    assert scores["chrf"] == pytest.approx(CHRF().corpus_score(HYPS, [REFS, REFS2]).score, abs=1e-9)
    assert "nrefs:2" in scores["bleu_signature"]
    assert scores["bleu"] > compute_bleu_chrf(HYPS, REFS)["bleu"]


def test_perfect_match_scores_100() -> None:
    scores = compute_bleu_chrf(REFS, REFS)
    assert scores["bleu"] == pytest.approx(100.0)
    assert scores["chrf"] == pytest.approx(100.0)


def test_metric_loads_by_path_offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    metric = evaluate.load(METRIC_PATH)
    assert metric.compute(predictions=HYPS[:1], references=[REFS[:1]])["bleu"] > 0


#: What ``evaluate.load("sacrebleu")`` returns (evaluate's metrics/sacrebleu/sacrebleu.py).
SACREBLEU_KEYS = {"score", "counts", "totals", "precisions", "bp", "sys_len", "ref_len"}


def test_metric_is_a_drop_in_for_evaluates_sacrebleu(monkeypatch: pytest.MonkeyPatch) -> None:
    """The stock example scripts (run_translation.py, run_translation_no_trainer.py) call ``compute`` with
    predictions and one-element reference lists, maybe sacrebleu's options, and read ``result["score"]``."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    metric = evaluate.load(METRIC_PATH)
    metric.add_batch(predictions=HYPS, references=[[ref] for ref in REFS])
    result = metric.compute()
    assert result.keys() >= SACREBLEU_KEYS
    expected = BLEU().corpus_score(HYPS, [REFS])
    assert result["score"] == pytest.approx(expected.score, abs=1e-9)
    assert (result["counts"], result["sys_len"], result["ref_len"]) == (
        expected.counts,
        expected.sys_len,
        expected.ref_len,
    )
    options = {"tokenize": "char", "lowercase": True, "smooth_method": "floor", "smooth_value": 0.1}
    again = metric.compute(
        predictions=HYPS, references=[[ref] for ref in REFS], use_effective_order=True, **options
    )
    bleu = BLEU(
        tokenize="char", lowercase=True, smooth_method="floor", smooth_value=0.1, effective_order=True
    )
    assert again["score"] == pytest.approx(bleu.corpus_score(HYPS, [REFS]).score, abs=1e-9)
    assert "tok:char" in again["bleu_signature"] and "smooth:floor" in again["bleu_signature"]
    with pytest.raises(ValueError, match="two BLEU tokenizers"):
        metric.compute(predictions=HYPS, references=REFS, tokenize="char", bleu_tokenize="13a")


def test_metric_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="one reference entry per hypothesis"):
        compute_bleu_chrf(HYPS, REFS[:2])
    with pytest.raises(ValueError, match="same number of references"):
        compute_bleu_chrf(HYPS[:2], [[REFS[0]], [REFS[1], REFS2[1]]])


# --- decoding ---------------------------------------------------------------------------------------


def test_gnmt_length_penalty_closed_form() -> None:
    assert gnmt_length_penalty(1.0, 0.6) == pytest.approx(1.0)
    assert gnmt_length_penalty(7.0, 0.6) == pytest.approx(2.0**0.6)
    assert gnmt_length_penalty(10.0, 0.0) == pytest.approx(1.0)


def test_decoding_options_defaults_are_the_papers() -> None:
    options = DecodingOptions()
    assert (options.num_beams, options.length_penalty) == (4, 0.6)
    assert "input length + 50" in options.describe()
    # §6.1 "terminate early when possible": stop when no better hypothesis can appear (HF's "never").
    assert paper_generation_kwargs(options)["early_stopping"] == "never"
    assert paper_generation_kwargs(DecodingOptions(early_stopping="true"))["early_stopping"] is True
    assert paper_generation_kwargs(DecodingOptions(early_stopping="false"))["early_stopping"] is False
    with pytest.raises(ValueError, match="early_stopping"):
        DecodingOptions(early_stopping="sometimes")
    with pytest.raises(ValueError, match="length_penalty_type"):
        DecodingOptions(length_penalty_type="wu")
    with pytest.raises(ValueError, match="num_beams >= 2"):
        DecodingOptions(num_beams=1, length_penalty_type="gnmt")


def test_nbest_log_probs_recover_sequence_log_likelihood(model, tokenizer) -> None:
    """sequences_scores × |Y|^α must equal Σ log p(y_t | y_<t, x) of the returned hypothesis."""
    batch = tokenizer(SOURCES[:3], padding=True, return_tensors="pt")
    alpha, beams = 0.6, 4
    out = model.generate(
        **batch,
        num_beams=beams,
        num_return_sequences=beams,
        length_penalty=alpha,
        max_new_tokens=6,
        output_scores=True,
        return_dict_in_generate=True,
    )
    log_probs, lengths = nbest_log_probs(out, alpha)
    seqs = out.sequences
    with torch.no_grad():
        logits = model(
            input_ids=batch["input_ids"].repeat_interleave(beams, 0),
            attention_mask=batch["attention_mask"].repeat_interleave(beams, 0),
            decoder_input_ids=seqs[:, :-1],
        ).logits
    token_lp = logits.log_softmax(-1).gather(-1, seqs[:, 1:, None]).squeeze(-1)
    inside = torch.arange(token_lp.shape[1])[None, :] < lengths[:, None]
    torch.testing.assert_close(log_probs, (token_lp * inside).sum(1), atol=1e-4, rtol=1e-4)
    assert torch.all(lengths >= 1) and torch.all(lengths <= 6)


def test_gnmt_with_alpha_zero_equals_plain_beam_search(model, tokenizer) -> None:
    """With α = 0 both penalties are 1, so n-best rescoring must pick HF's best hypothesis."""
    batch = tokenizer(SOURCES, padding=True, return_tensors="pt")
    hf = generate_ids(model, **batch, options=DecodingOptions(length_penalty=0.0), max_new_tokens=8)
    gnmt = generate_ids(
        model,
        **batch,
        options=DecodingOptions(length_penalty=0.0, length_penalty_type="gnmt"),
        max_new_tokens=8,
    )
    assert hf == gnmt


class _FixedNBest:
    """Stands in for a model whose beam search returned two finished hypotheses for one sentence."""

    def __init__(self) -> None:
        self.config = SimpleNamespace(decoder_start_token_id=1)
        self.generation_config = SimpleNamespace(eos_token_id=2)
        long = [1, *[5] * 9, 2]  # |Y| = 10 (</s> included), log P = -6.9
        short = [1, 7, 2] + [0] * 8  # |Y| = 2, log P = -3.0
        self.log_probs, self.lengths = torch.tensor([-6.9, -3.0]), torch.tensor([10.0, 2.0])
        self.sequences = torch.tensor([long, short])
        self.beam_indices = torch.tensor([[0] * 10, [1, 1] + [-1] * 8])

    def generate(self, **kwargs):
        alpha = kwargs["length_penalty"]
        assert kwargs["num_return_sequences"] == kwargs["num_beams"] == 2 and kwargs["output_scores"]
        scores = self.log_probs / self.lengths**alpha  # HF's definition of sequences_scores
        return SimpleNamespace(
            sequences=self.sequences, sequences_scores=scores, beam_indices=self.beam_indices
        )


def test_gnmt_rescoring_can_prefer_another_hypothesis() -> None:
    """HF's |Y|^0.6 ranks the long hypothesis first (-1.73 > -1.98); ((5+|Y|)/6)^0.6 ranks the short one
    first (-2.73 > -3.98): the rescoring must return the short one."""
    fake = _FixedNBest()
    hf_scores = fake.log_probs / fake.lengths**0.6
    assert hf_scores[0] > hf_scores[1]
    options = DecodingOptions(num_beams=2, length_penalty=0.6, length_penalty_type="gnmt")
    dummy = torch.zeros(1, 3, dtype=torch.long)
    assert generate_ids(fake, dummy, torch.ones_like(dummy), options) == [[7]]


def test_output_length_bound_is_per_sentence(model, tokenizer) -> None:
    """§6.1: at most input length + 50 output tokens (</s> included), for each sentence of a batch."""
    batch = tokenizer(SOURCES[:3], padding=True, return_tensors="pt")
    input_lengths = batch["attention_mask"].sum(1).tolist()
    outputs = generate_ids(
        model, **batch, options=DecodingOptions(num_beams=1)
    )  # greedy: the bound is the same
    assert all(len(ids) + 1 <= n + 50 for ids, n in zip(outputs, input_lengths, strict=True))
    # The random tiny model never says </s> by itself, so each row runs into its own bound.
    assert [len(ids) + 1 for ids in outputs] == [n + 50 for n in input_lengths]


def test_translate_restores_order_and_is_batch_invariant(model, tokenizer) -> None:
    sentences = [*SOURCES[:3], "", "w40 w41 w42 w43"]
    one_by_one = translate(model, tokenizer, sentences, batch_size=1, device="cpu", generate_kwargs=SHORT)
    batched = translate(model, tokenizer, sentences, batch_size=3, device="cpu", generate_kwargs=SHORT)
    assert batched == one_by_one
    assert len(batched) == len(sentences)
    assert batched[3] == ""  # blank input line → blank output line
    assert all(text for i, text in enumerate(batched) if i != 3)
    # each output is the translation of its own input, not of a neighbour in its batch
    assert batched[1] == translate(model, tokenizer, [sentences[1]], device="cpu", generate_kwargs=SHORT)[0]


def test_translate_stream_file_to_file(model, tokenizer, tmp_path: Path) -> None:
    source = tmp_path / "in.txt"
    source.write_text("\n".join(SOURCES[:3]) + "\n", encoding="utf-8")
    output = tmp_path / "out.txt"
    count = translate_stream(
        model, tokenizer, source, output, batch_size=2, device="cpu", chunk_lines=2, generate_kwargs=SHORT
    )
    assert count == 3
    expected = translate(model, tokenizer, SOURCES[:3], generate_kwargs=SHORT)
    assert output.read_text(encoding="utf-8").splitlines() == expected


# --- evaluation --------------------------------------------------------------------------------------


def test_evaluate_translations_writes_hypotheses(model, tokenizer, tmp_path: Path) -> None:
    references = ["w1 w2 w3", "w7 w8", "w10 w11", "w20 w21", "w30"]
    hyp_file = tmp_path / "sub" / "hyps.txt"
    options = DecodingOptions(length_penalty_type="gnmt")
    results = evaluate_translations(
        model,
        tokenizer,
        SOURCES,
        references,
        options,
        batch_size=2,
        device="cpu",
        hypotheses_file=hyp_file,
        generate_kwargs=SHORT,
    )
    lines = hyp_file.read_text(encoding="utf-8").splitlines()
    assert lines == results["hypotheses"] and len(lines) == len(SOURCES)
    expected = compute_bleu_chrf(lines, references)
    assert results["bleu"] == expected["bleu"] and results["chrf"] == expected["chrf"]
    assert results["decoding"]["length_penalty_type"] == "gnmt"
    assert "GNMT" in results["decoding"]["description"]
    summary = json.loads(write_results(results, tmp_path / "results.json").read_text())
    assert "hypotheses" not in summary and summary["bleu_signature"].startswith("nrefs:1")
    assert summary["decoding_seconds"] == results["decoding_seconds"] > 0
    assert summary["decoding"]["early_stopping"] == "never"


def test_evaluate_dataset_uses_translation_column(model, tokenizer) -> None:
    pairs = [{"en": s, "de": s} for s in SOURCES[:2]]
    data = datasets.Dataset.from_dict({"translation": pairs})
    results = evaluate_dataset(model, tokenizer, data, "en", "de", device="cpu", generate_kwargs=SHORT)
    assert results["num_segments"] == 2
    with pytest.raises(ValueError, match="language codes"):
        evaluate_dataset(model, tokenizer, data, "de", "fr")
    with pytest.raises(ValueError, match="'translation' column"):
        evaluate_dataset(model, tokenizer, datasets.Dataset.from_dict({"text": ["a"]}), "en", "de")


def test_evaluate_translations_rejects_unparallel_input(model, tokenizer) -> None:
    with pytest.raises(ValueError, match="parallel"):
        evaluate_translations(model, tokenizer, SOURCES, SOURCES[:2])


@pytest.mark.parametrize("script", ["evaluate_bleu.py", "translate.py"])
def test_script_help_shows_paper_defaults(
    script: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "argv", [script, "--help"])
    with pytest.raises(SystemExit) as exit_info:
        runpy.run_path(str(REPO / "scripts" / script), run_name="__main__")
    assert exit_info.value.code == 0
    help_text = " ".join(capsys.readouterr().out.split())
    assert "--num_beams" in help_text and "Beam size (§6.1: 4). (default: 4)" in help_text
    assert "Length penalty α (§6.1: 0.6). (default: 0.6)" in help_text
    assert "--length_penalty_type {hf,gnmt}" in help_text
    assert "--early_stopping {never,true,false}" in help_text


# --------------------------------------------------------------------------------------------------
# sacreBLEU's CLI: --bleu_tokenize, standard test sets by name
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("tokenize", ["13a", "intl", "char", "zh", "none"])
def test_bleu_tokenize_is_applied_and_named_in_the_signature(tokenize: str) -> None:
    from hf_vanilla.analysis.evaluation import compute_bleu_chrf

    hypotheses, references = ["Der Hund läuft, schnell!"], ["Der Hund rennt, schnell!"]
    scores = compute_bleu_chrf(hypotheses, references, bleu_tokenize=tokenize)
    expected = BLEU(tokenize=tokenize).corpus_score(hypotheses, [references])
    assert scores["bleu"] == pytest.approx(expected.score)
    assert f"tok:{tokenize}|" in scores["bleu_signature"]


def test_an_unknown_bleu_tokenizer_is_refused_before_any_work(tmp_path: Path) -> None:
    from hf_vanilla.analysis.evaluation import compute_bleu_chrf
    from hf_vanilla.training.arguments import PaperTrainingArguments

    with pytest.raises(
        ValueError, match="'13b' is not one of sacreBLEU's tokenizers: none, zh, 13a, intl, char"
    ):
        compute_bleu_chrf(["a"], ["a"], bleu_tokenize="13b")
    with pytest.raises(ValueError, match="'13b' is not one of sacreBLEU's tokenizers"):
        PaperTrainingArguments(output_dir=str(tmp_path), bleu_tokenize="13b", use_cpu=True, report_to="none")
    assert (
        PaperTrainingArguments(output_dir=str(tmp_path), bleu_tokenize="intl", use_cpu=True).bleu_tokenize
        == "intl"
    )


def test_a_sacrebleu_test_set_offline_is_one_clear_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    import sacrebleu.utils

    from hf_vanilla.cli.evaluate_bleu import main

    monkeypatch.setattr(sacrebleu.utils, "SACREBLEU_DIR", str(tmp_path / "sacrebleu"))  # an empty cache
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    args = ["--model_name_or_path", str(tmp_path / "model"), "--output_dir", str(tmp_path / "eval")]
    assert main([*args, "--sacrebleu_test_set", "wmt14", "--language_pair", "de-en"]) == 1
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0 and error.startswith(
        "error: sacreBLEU test set wmt14 de-en is not in sacreBLEU's cache"
    ) and "offline" in error  # fmt: skip
    assert main([*args, "--sacrebleu_test_set", "wmt99"]) == 1
    assert "'wmt99' is not a sacreBLEU test set" in capsys.readouterr().err
    assert main([*args, "--sacrebleu_test_set", "wmt14", "--language_pair", "de-xx"]) == 1
    assert "has no language pair 'de-xx'; it has: cs-en, de-en" in capsys.readouterr().err
    assert not (tmp_path / "eval").exists()


def test_a_cached_sacrebleu_test_set_loads_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A set in sacreBLEU's cache is read from it without the network (wmt14's layout, faked)."""
    import sacrebleu.utils
    from sacrebleu.dataset import DATASETS

    from hf_vanilla.analysis.evaluation import load_sacrebleu_test_set

    dataset = DATASETS["wmt14"]
    monkeypatch.setattr(sacrebleu.utils, "SACREBLEU_DIR", str(tmp_path))
    (tmp_path / "wmt14" / "raw").mkdir(parents=True)
    (tmp_path / "wmt14" / "raw" / "placeholder").write_text("")
    (tmp_path / "src.txt").write_text("Ein Hund.\nZwei.\n")
    (tmp_path / "ref.txt").write_text("A dog.\nTwo.\n")
    monkeypatch.setattr(type(dataset), "get_source_file", lambda self, pair: str(tmp_path / "src.txt"))
    monkeypatch.setattr(type(dataset), "get_reference_files", lambda self, pair: [str(tmp_path / "ref.txt")])
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert load_sacrebleu_test_set("wmt14", "de-en") == (["Ein Hund.", "Zwei."], [["A dog."], ["Two."]])


def test_auto_bleu_tokenize_suits_one_word_references_and_says_so() -> None:
    """The numbers task's references are one word each: word BLEU (13a) is 0 there whatever the
    output, so ``--bleu_tokenize auto`` (the evaluate command's default) takes char BLEU and says why."""
    from hf_vanilla.analysis.evaluation import choose_bleu_tokenize, compute_bleu_chrf
    from hf_vanilla.cli.evaluate_bleu import EvalArguments

    assert EvalArguments.__dataclass_fields__["bleu_tokenize"].default == "auto"
    numbers = ["vierhundertzwölf", "dreiundzwanzig"]
    name, note = choose_bleu_tokenize("auto", numbers)
    assert name == "char" and "'char'" in note and "one word" in note
    assert compute_bleu_chrf(numbers, numbers, bleu_tokenize=name)["bleu"] == pytest.approx(100)
    assert choose_bleu_tokenize("auto", ["Der Hund rennt.", "Ja"])[0] == "13a"
    assert choose_bleu_tokenize("intl", numbers)[0] == "intl"
