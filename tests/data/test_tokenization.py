"""Shared BPE tokenizer (hf_vanilla/data/tokenization.py): special ids, </s>, exact round trip, save/load, config check."""

from __future__ import annotations

import json
from pathlib import Path

import datasets
import pytest
from transformers import AutoTokenizer, HfArgumentParser

from hf_vanilla import VanillaTransformerConfig
from hf_vanilla.data.numbers import make_demo_splits
from hf_vanilla.data.options import DataArguments, TokenizerArguments
from hf_vanilla.data.tokenization import (
    check_tokenizer_matches_config,
    load_tokenizer,
    tokenize_translations,
    train_bpe_tokenizer,
    train_tokenizer_from_dataset,
)

LINES = [
    "Ein Mann fährt Fahrrad.",
    "Die Straße ist groß, die Größe überrascht; Übermaß!",
    "Zwei  Hunde   spielen im Schnee.",  # repeated spaces
    "A man (in a red shirt) says: \"Hello?\" — 'fine'...",
    "Äpfel, Öl & Übel: 100 % Spaß @ 3.50€",
    " leading and trailing spaces ",
    "tabs\tinside\tand a final one\t",
    "日本語も大丈夫",
]
PAIRS = [{"en": LINES[i], "de": LINES[-1 - i]} for i in range(len(LINES))]


@pytest.fixture(scope="module")
def tokenizer():
    return train_bpe_tokenizer(LINES * 20, vocab_size=400)


def test_special_token_ids(tokenizer) -> None:
    assert (
        tokenizer.pad_token_id,
        tokenizer.bos_token_id,
        tokenizer.eos_token_id,
        tokenizer.unk_token_id,
    ) == (
        0,
        1,
        2,
        3,
    )
    assert tokenizer.convert_ids_to_tokens([0, 1, 2, 3]) == ["<pad>", "<s>", "</s>", "<unk>"]
    assert 260 < len(tokenizer) <= 400


def test_eos_appended_to_source_and_target(tokenizer) -> None:
    source = tokenizer("Ein Mann")["input_ids"]
    target = tokenizer(text_target="Ein Mann")["input_ids"]
    assert source == target
    assert source[-1] == tokenizer.eos_token_id and source.count(tokenizer.eos_token_id) == 1
    assert tokenizer.bos_token_id not in source
    assert set(tokenizer("x")) == {"input_ids", "attention_mask"}  # no token_type_ids for the model


@pytest.mark.parametrize("text", LINES)
def test_exact_round_trip(tokenizer, text: str) -> None:
    ids = tokenizer(text)["input_ids"]
    assert tokenizer.unk_token_id not in ids
    assert tokenizer.decode(ids, skip_special_tokens=True) == text


def test_round_trip_on_unseen_text(tokenizer) -> None:
    # Byte-level: characters never seen in training still come back exactly, without <unk>.
    text = "Ωmega ✓ naïve façade — ẞ"
    ids = tokenizer(text)["input_ids"]
    assert tokenizer.unk_token_id not in ids
    assert tokenizer.decode(ids, skip_special_tokens=True) == text


def test_save_and_load_with_auto_tokenizer(tokenizer, tmp_path: Path) -> None:
    tokenizer.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    assert len(loaded) == len(tokenizer)
    assert (loaded.pad_token_id, loaded.bos_token_id, loaded.eos_token_id) == (0, 1, 2)
    for text in LINES:
        ids = loaded(text)["input_ids"]
        assert ids == tokenizer(text)["input_ids"]
        assert loaded.decode(ids, skip_special_tokens=True) == text


def test_load_tokenizer_builds_what_auto_tokenizer_builds(tokenizer, tmp_path: Path) -> None:
    """``load_tokenizer`` loads this project's tokenizers with their class directly (no torch import for
    a CTranslate2 translation): the same class, settings, ids and text as ``AutoTokenizer``."""
    tokenizer.save_pretrained(tmp_path)
    direct, auto = load_tokenizer(tmp_path), AutoTokenizer.from_pretrained(tmp_path)
    assert type(direct) is type(auto)
    assert direct.init_kwargs == auto.init_kwargs and direct.special_tokens_map == auto.special_tokens_map
    assert (direct.model_max_length, direct.padding_side, direct.pad_token_id) == (
        auto.model_max_length, auto.padding_side, auto.pad_token_id,
    )  # fmt: skip
    ids = direct(LINES, padding=True)["input_ids"]
    assert ids == auto(LINES, padding=True)["input_ids"]
    assert direct.batch_decode(ids, skip_special_tokens=True) == auto.batch_decode(
        ids, skip_special_tokens=True
    )
    other = tmp_path / "other"  # a folder naming another class goes through AutoTokenizer
    tokenizer.save_pretrained(other)
    config = json.loads((other / "tokenizer_config.json").read_text())
    (other / "tokenizer_config.json").write_text(json.dumps({**config, "tokenizer_class": "BertTokenizer"}))
    assert type(load_tokenizer(other)) is type(AutoTokenizer.from_pretrained(other)) is not type(auto)


def test_train_from_dataset_round_trips_every_line() -> None:
    demo = make_demo_splits(200, 10, 10, max_number=9999, seed=0)
    data = datasets.DatasetDict(
        {
            "train": datasets.concatenate_datasets(
                [
                    demo["train"],
                    datasets.Dataset.from_dict({"translation": PAIRS}, features=demo["train"].features),
                ]
            )
        }
    )
    tokenizer = train_tokenizer_from_dataset(data, "en", "de", vocab_size=500)
    vocab = tokenizer.get_vocab()
    assert "zwanzig" in vocab or "Ġzwanzig" in vocab  # both sides are in the shared vocabulary
    assert "hundred" in vocab or "Ġhundred" in vocab
    for row in data["train"]:
        for text in row["translation"].values():
            assert tokenizer.decode(tokenizer(text)["input_ids"], skip_special_tokens=True) == text
    with pytest.raises(ValueError, match="No split 'dev'"):
        train_tokenizer_from_dataset(data, "en", "de", vocab_size=500, split="dev")


def test_vocab_too_small() -> None:
    with pytest.raises(ValueError, match="vocab_size >= 260"):
        train_bpe_tokenizer(LINES, vocab_size=100)


def test_check_tokenizer_matches_config(tokenizer) -> None:
    n = len(tokenizer)
    check_tokenizer_matches_config(tokenizer, VanillaTransformerConfig(vocab_size=n))
    for rows in (n - 100, n + 8):  # a smaller tokenizer is refused as well as a larger one
        with pytest.raises(ValueError, match=rf"has {n} tokens but the model's has {rows}.*trained with"):
            check_tokenizer_matches_config(
                tokenizer, VanillaTransformerConfig(vocab_size=rows), "tok and model"
            )
    with pytest.raises(
        ValueError, match=r"\(a and b\): pad_token_id is 0 in the tokenizer but 5 in the model"
    ):
        check_tokenizer_matches_config(
            tokenizer, VanillaTransformerConfig(vocab_size=n, pad_token_id=5), "a and b"
        )
    with pytest.raises(ValueError, match=r"bos_token_id is 1 in the tokenizer but 4"):
        check_tokenizer_matches_config(tokenizer, VanillaTransformerConfig(vocab_size=n, bos_token_id=4))
    with pytest.raises(ValueError, match=r"eos_token_id is 2 in the tokenizer but 7"):
        check_tokenizer_matches_config(tokenizer, VanillaTransformerConfig(vocab_size=n, eos_token_id=7))


def test_tokenize_translations(tokenizer) -> None:
    data = datasets.Dataset.from_dict({"translation": PAIRS})
    out = tokenize_translations(data, tokenizer, "en", "de", max_source_length=5)
    assert out.column_names == ["input_ids", "attention_mask", "labels"]
    for row, pair in zip(out, PAIRS, strict=True):
        assert len(row["input_ids"]) <= 5 and row["input_ids"][-1] == tokenizer.eos_token_id
        assert row["labels"] == tokenizer(pair["de"])["input_ids"]


def test_script_arguments_show_paper_default() -> None:
    parser = HfArgumentParser((DataArguments, TokenizerArguments))
    data_args, tok_args = parser.parse_args_into_dataclasses(["--demo", "--output_dir", "out"])
    assert tok_args.vocab_size == 37000 and data_args.demo
    assert "37000" in parser.format_help()


def test_tokenizer_trains_on_an_evenly_spaced_sample_of_a_large_corpus() -> None:
    """`max_pairs` bounds the training text to every k-th pair (the whole corpus spans it, not its
    first pairs): with every 2nd of 10 pairs, the odd pairs' "xy" is never merged."""
    pairs = [{"en": "xyxyxy xyxy" if i % 2 else "abab abab", "de": "cdcd cdcd"} for i in range(10)]
    data = datasets.Dataset.from_dict({"translation": pairs})
    vocab = {
        max_pairs: train_tokenizer_from_dataset(
            data, "en", "de", vocab_size=300, max_pairs=max_pairs
        ).get_vocab()
        for max_pairs in (5, 0)
    }
    assert "ab" in vocab[5] and "xy" not in vocab[5]
    assert "xy" in vocab[0]
    with pytest.raises(ValueError, match="max_pairs"):
        train_tokenizer_from_dataset(data, "en", "de", vocab_size=300, max_pairs=-1)
