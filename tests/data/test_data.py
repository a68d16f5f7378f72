"""Parallel data loading (hf_vanilla/data/loading.py): local formats, clear errors, Hub failure, the demo task."""

from __future__ import annotations

import gzip
import json
import tracemalloc
from pathlib import Path

import datasets
import pytest
from helpers import fed_pipes
from transformers import HfArgumentParser

from hf_vanilla.data import loading as data
from hf_vanilla.data.loading import load_from_args, load_local_files
from hf_vanilla.data.numbers import english_number, german_number, make_demo_splits, make_number_pairs
from hf_vanilla.data.options import DataArguments

SRC = ["A man rides a bike.", "Two  dogs play ", "Größe?"]
TGT = ["Ein Mann fährt Fahrrad.", "Zwei  Hunde spielen", "Straße!"]


def write(path: Path, lines: list[str], gz: bool = False) -> Path:
    text = "".join(line + "\n" for line in lines)
    if gz:
        with gzip.open(path, "wt", encoding="utf-8") as handle:
            handle.write(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def pairs_of(ds) -> list[tuple[str, str]]:
    return [(row["translation"]["en"], row["translation"]["de"]) for row in ds]


EXPECTED = [(s.strip(), t.strip()) for s, t in zip(SRC, TGT, strict=True)]


# ---------------------------------------------------------------- local formats


@pytest.mark.parametrize("gz", [False, True])
def test_plain_text_pair_and_prefix(tmp_path: Path, gz: bool) -> None:
    ext = ".gz" if gz else ""
    write(tmp_path / f"train.en{ext}", SRC, gz)
    write(tmp_path / f"train.de{ext}", TGT, gz)
    by_pair = load_local_files(
        {"train": [str(tmp_path / f"train.en{ext}"), str(tmp_path / f"train.de{ext}")]}, "en", "de"
    )
    by_prefix = load_local_files({"validation": [str(tmp_path / "train")]}, "en", "de")
    assert pairs_of(by_pair["train"]) == EXPECTED
    assert pairs_of(by_prefix["validation"]) == EXPECTED
    # Same feature type as the Hub's translation datasets.
    assert type(by_pair["train"].features["translation"]).__name__ == "Translation"


def test_whitespace_only_ends_are_stripped(tmp_path: Path) -> None:
    # A CRLF ending goes; a stray \r or U+2028 inside a line does not split it; inner spaces stay.
    (tmp_path / "a.en").write_bytes(b"one\r\ntwo\rthree  four \n")
    (tmp_path / "a.de").write_bytes("eins\ndrei\u2028vier\n".encode())
    ds = load_local_files({"train": [str(tmp_path / "a")]}, "en", "de")["train"]
    assert pairs_of(ds) == [("one", "eins"), ("two\rthree  four", "drei\u2028vier")]


def test_jsonl_and_tsv(tmp_path: Path) -> None:
    jsonl = tmp_path / "d.jsonl.gz"
    with gzip.open(jsonl, "wt", encoding="utf-8") as handle:
        for s, t in zip(SRC, TGT, strict=True):
            handle.write(json.dumps({"translation": {"en": s, "de": t}, "id": 1}, ensure_ascii=False) + "\n")
        handle.write("\n")  # blank lines are skipped
    tsv = write(tmp_path / "d.tsv", [f"{s}\t{t}" for s, t in zip(SRC, TGT, strict=True)])
    loaded = load_local_files({"train": [str(jsonl)], "test": [str(tsv)]}, "en", "de")
    assert pairs_of(loaded["train"]) == EXPECTED
    assert pairs_of(loaded["test"]) == EXPECTED


# ---------------------------------------------------------------- errors name the file and the fix


def test_missing_file(tmp_path: Path) -> None:
    write(tmp_path / "x.en", SRC)
    with pytest.raises(FileNotFoundError, match=r"x\.de"):
        load_local_files({"train": [str(tmp_path / "x.en"), str(tmp_path / "x.de")]}, "en", "de")
    with pytest.raises(FileNotFoundError, match=r"nothere\.de\[\.gz\]"):
        load_local_files({"train": [str(tmp_path / "nothere")]}, "en", "de")


def test_empty_file(tmp_path: Path) -> None:
    write(tmp_path / "x.en", SRC)
    (tmp_path / "x.de").write_text("")
    with pytest.raises(ValueError, match=r"x\.de.*is empty"):
        load_local_files({"train": [str(tmp_path / "x")]}, "en", "de")


def test_line_counts_differ(tmp_path: Path) -> None:
    write(tmp_path / "x.en", SRC)
    write(tmp_path / "x.de", TGT[:2])
    with pytest.raises(ValueError, match=r"x\.en.*has 3 lines.*x\.de.*has 2"):
        load_local_files({"train": [str(tmp_path / "x")]}, "en", "de")


def test_tsv_tabs(tmp_path: Path) -> None:
    bad = write(tmp_path / "bad.tsv", ["a\tb", "c\td\te"])
    with pytest.raises(ValueError, match=r"bad\.tsv.*line 2.*found 2"):
        load_local_files({"train": [str(bad)]}, "en", "de")
    none = write(tmp_path / "none.tsv", ["no tab here"])
    with pytest.raises(ValueError, match=r"none\.tsv.*line 1.*found 0"):
        load_local_files({"train": [str(none)]}, "en", "de")


def test_bad_jsonl(tmp_path: Path) -> None:
    path = write(tmp_path / "x.jsonl", [json.dumps({"translation": {"en": "a", "fr": "b"}})])
    with pytest.raises(ValueError, match=r"x\.jsonl.*line 1.*\"de\""):
        load_local_files({"train": [str(path)]}, "en", "de")
    array = write(tmp_path / "a.json", ["[", json.dumps({"translation": {"en": "a", "de": "b"}}), "]"])
    with pytest.raises(ValueError, match=r"a\.json', line 1: not valid JSON .*one JSON object per line"):
        load_local_files({"train": [str(array)]}, "en", "de")


def test_swapped_files_are_caught(tmp_path: Path) -> None:
    write(tmp_path / "x.en", SRC)
    write(tmp_path / "x.de", TGT)
    with pytest.raises(ValueError, match="source file first"):
        load_local_files({"train": [str(tmp_path / "x.de"), str(tmp_path / "x.en")]}, "en", "de")


# ---------------------------------------------------------------- the text streamed into Arrow


def test_local_text_is_streamed_into_a_memory_mapped_arrow_file(tmp_path: Path) -> None:
    """The text goes pair by pair into an Arrow file in the `datasets` cache and is read memory-mapped:
    what Python allocates while loading stays below the text's size (two lists of its lines took ~3.4×
    the text), and what it does allocate is per batch, so a WMT-sized corpus need not fit in memory."""
    lines = 20_000
    english = [f"sentence number {i} in english" for i in range(lines)]
    german = [f"satz nummer {i} auf deutsch" for i in range(lines)]
    write(tmp_path / "big.en", english)
    write(tmp_path / "big.de", german)
    text_bytes = sum((tmp_path / f"big.{lang}").stat().st_size for lang in ("en", "de"))
    tracemalloc.start()
    try:
        train = load_local_files({"train": [str(tmp_path / "big")]}, "en", "de")["train"]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(train) == lines
    assert train[lines - 1]["translation"] == {"en": english[-1], "de": german[-1]}
    cache = Path(datasets.config.HF_DATASETS_CACHE)
    assert [Path(f["filename"]).is_relative_to(cache) for f in train.cache_files] == [True]
    assert peak < text_bytes, (peak, text_bytes)


def test_the_streamed_text_is_reused_until_a_file_changes(tmp_path: Path) -> None:
    """Loading the same files again reuses their Arrow file; changing a file (size, modification time)
    reads it again, so the cache never serves old text."""
    write(tmp_path / "x.en", SRC)
    write(tmp_path / "x.de", TGT)
    first = load_local_files({"train": [str(tmp_path / "x")]}, "en", "de")["train"]
    again = load_local_files({"train": [str(tmp_path / "x")]}, "en", "de")["train"]
    assert first.cache_files and again.cache_files == first.cache_files
    write(tmp_path / "x.de", ["eins", "zwei", "drei"])
    changed = load_local_files({"train": [str(tmp_path / "x")]}, "en", "de")["train"]
    assert changed.cache_files != first.cache_files
    assert [pair["de"] for pair in changed["translation"]] == ["eins", "zwei", "drei"]


def test_pipes_are_read_into_memory_not_cached(tmp_path: Path) -> None:
    """A pipe (bash's `<(...)`) can be read once and its name says nothing of its content: its pairs are
    loaded in memory and nothing is written to the `datasets` cache under a key a later pipe could hit."""
    with fed_pipes(tmp_path, ("w1 w2\nw3\n", "w2 w1\nw3\n")) as pipes:
        train = load_local_files({"train": [str(p) for p in pipes]}, "en", "de")["train"]
    assert pairs_of(train) == [("w1 w2", "w2 w1"), ("w3", "w3")]
    assert train.cache_files == []


# ---------------------------------------------------------------- arguments and the Hub


def test_data_arguments_parse_and_load(tmp_path: Path) -> None:
    write(tmp_path / "train.en", SRC)
    write(tmp_path / "train.de.gz", TGT, gz=True)
    (args,) = HfArgumentParser(DataArguments).parse_args_into_dataclasses(
        ["--train_files", str(tmp_path / "train"), "--max_train_samples", "2"]
    )
    loaded = load_from_args(args)
    assert list(loaded) == ["train"]
    assert pairs_of(loaded["train"]) == EXPECTED[:2]


def test_exactly_one_source() -> None:
    with pytest.raises(ValueError, match=r"exactly one data source.*none"):
        load_from_args(DataArguments())
    with pytest.raises(ValueError, match="exactly one data source"):
        load_from_args(DataArguments(demo=True, dataset_name="wmt14"))


def _count_urlopen(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Record the timeout of every ``urllib.request.urlopen`` call, which still runs."""
    import urllib.request

    calls, urlopen = [], urllib.request.urlopen

    def counted(*args: object, timeout: float, **kwargs: object) -> object:
        calls.append(timeout)
        return urlopen(*args, timeout=timeout, **kwargs)

    monkeypatch.setattr(urllib.request, "urlopen", counted)
    return calls


def _no_load_dataset(*args: object, **kwargs: object) -> None:
    raise AssertionError("datasets.load_dataset (and its retry loop) was reached")


def test_hub_offline_fails_fast_with_local_file_help(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fast by construction: no request at all (datasets only looks in its cache)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    calls = _count_urlopen(monkeypatch)
    with pytest.raises(ValueError) as info:
        load_from_args(DataArguments(dataset_name="wmt14", dataset_config_name="de-en"))
    assert calls == []
    message = str(info.value)
    assert "wmt14" in message and "offline" in message
    for argument in ("--train_files", "--validation_files", "--source_lang", "--demo"):
        assert argument in message


def test_hub_unreachable_fails_fast(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fast by construction: one request with a bounded timeout, no retries, and datasets' own retry
    loop is never reached."""
    import huggingface_hub.constants

    # The probe itself: a closed local port answers at once.
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", "http://127.0.0.1:9")
    calls = _count_urlopen(monkeypatch)
    reason = data._hub_unreachable_reason(timeout=2)
    assert reason is not None and "127.0.0.1:9" in reason
    assert calls == [2]
    # And load_hub_dataset stops there, before datasets' retry loop.
    monkeypatch.setattr(data, "hub_offline", lambda: False)
    monkeypatch.setattr(data.datasets, "load_dataset", _no_load_dataset)
    calls.clear()
    with pytest.raises(ValueError, match=r"unreachable.*HF_HUB_OFFLINE=1.*--train_files"):
        data.load_hub_dataset("wmt14", "de-en", "en", "de")
    assert calls == [5.0]  # the one probe, at its default timeout


# ---------------------------------------------------------------- demo task

# Hand-checked: German numbers are one word; "eins" only at the end, "ein" inside; "einhundert", "eintausend".
NUMBER_TABLE = [
    (0, "zero", "null"),
    (1, "one", "eins"),
    (7, "seven", "sieben"),
    (11, "eleven", "elf"),
    (12, "twelve", "zwölf"),
    (13, "thirteen", "dreizehn"),
    (16, "sixteen", "sechzehn"),
    (17, "seventeen", "siebzehn"),
    (20, "twenty", "zwanzig"),
    (21, "twenty-one", "einundzwanzig"),
    (30, "thirty", "dreißig"),
    (31, "thirty-one", "einunddreißig"),
    (42, "forty-two", "zweiundvierzig"),
    (60, "sixty", "sechzig"),
    (66, "sixty-six", "sechsundsechzig"),
    (70, "seventy", "siebzig"),
    (77, "seventy-seven", "siebenundsiebzig"),
    (99, "ninety-nine", "neunundneunzig"),
    (100, "one hundred", "einhundert"),
    (101, "one hundred one", "einhunderteins"),
    (111, "one hundred eleven", "einhundertelf"),
    (116, "one hundred sixteen", "einhundertsechzehn"),
    (121, "one hundred twenty-one", "einhunderteinundzwanzig"),
    (200, "two hundred", "zweihundert"),
    (999, "nine hundred ninety-nine", "neunhundertneunundneunzig"),
    (1000, "one thousand", "eintausend"),
    (1001, "one thousand one", "eintausendeins"),
    (1100, "one thousand one hundred", "eintausendeinhundert"),
    (2021, "two thousand twenty-one", "zweitausendeinundzwanzig"),
    (3421, "three thousand four hundred twenty-one", "dreitausendvierhunderteinundzwanzig"),
    (7017, "seven thousand seventeen", "siebentausendsiebzehn"),
    (9999, "nine thousand nine hundred ninety-nine", "neuntausendneunhundertneunundneunzig"),
    (10000, "ten thousand", "zehntausend"),
    (21000, "twenty-one thousand", "einundzwanzigtausend"),
    (101000, "one hundred one thousand", "einhunderteintausend"),
    (
        123456,
        "one hundred twenty-three thousand four hundred fifty-six",
        "einhundertdreiundzwanzigtausendvierhundertsechsundfünfzig",
    ),
    (201001, "two hundred one thousand one", "zweihunderteintausendeins"),
    (
        999999,
        "nine hundred ninety-nine thousand nine hundred ninety-nine",
        "neunhundertneunundneunzigtausendneunhundertneunundneunzig",
    ),
]


@pytest.mark.parametrize(("number", "english", "german"), NUMBER_TABLE)
def test_number_words(number: int, english: str, german: str) -> None:
    assert english_number(number) == english
    assert german_number(number) == german
    assert make_number_pairs([number]) == [{"en": english, "de": german}]


def test_number_words_are_distinct_and_bounded() -> None:
    numbers = range(0, 20000)
    assert len({german_number(n) for n in numbers}) == len(numbers)
    assert len({english_number(n) for n in numbers}) == len(numbers)
    for bad in (-1, 1_000_000, 2.0):
        with pytest.raises(ValueError, match=r"0\.\.999999"):
            german_number(bad)  # type: ignore[arg-type]


def test_demo_splits_are_disjoint_and_seeded() -> None:
    demo = make_demo_splits(300, 50, 40, max_number=999, seed=3)
    assert {k: len(v) for k, v in demo.items()} == {"train": 300, "validation": 50, "test": 40}
    sets = {split: {row["translation"]["de"] for row in ds} for split, ds in demo.items()}
    assert not sets["train"] & sets["validation"] and not sets["train"] & sets["test"]
    assert not sets["validation"] & sets["test"]
    assert pairs_of(make_demo_splits(300, 50, 40, 999, seed=3)["train"]) == pairs_of(demo["train"])
    assert pairs_of(make_demo_splits(300, 50, 40, 999, seed=4)["train"]) != pairs_of(demo["train"])
    with pytest.raises(ValueError, match="only 100"):
        make_demo_splits(90, 10, 1, max_number=99)


def test_demo_from_args() -> None:
    args = DataArguments(demo=True, demo_train_size=20, demo_validation_size=5, demo_test_size=5)
    loaded = load_from_args(args)
    row = loaded["train"][0]["translation"]
    assert set(row) == {"en", "de"}
    with pytest.raises(ValueError, match="en → de"):
        load_from_args(DataArguments(demo=True, source_lang="de", target_lang="en"))


def test_a_hub_dataset_without_translation_column_takes_source_and_target_columns(tmp_path: Path) -> None:
    """A dataset folder as `datasets` writes it (parquet per split), loaded through --dataset_name."""
    import datasets

    folder = tmp_path / "plain_columns"
    folder.mkdir()
    for split in ("train", "validation"):
        columns = {"id": [0, 1, 2], "english": SRC, "german": TGT}
        datasets.Dataset.from_dict(columns).to_parquet(str(folder / f"{split}.parquet"))
    args = DataArguments(dataset_name=str(folder), source_column="english", target_column="german")
    loaded = load_from_args(args)
    assert sorted(loaded) == ["train", "validation"]
    assert loaded["train"].column_names == ["translation"]
    assert pairs_of(loaded["validation"]) == list(zip(SRC, TGT, strict=True))
    with pytest.raises(
        ValueError, match="no `translation` column; name the sentence columns with --source_column"
    ):
        load_from_args(DataArguments(dataset_name=str(folder)))
    with pytest.raises(
        ValueError, match=r"no column 'englisch'; its columns are \['id', 'english', 'german'\]"
    ):
        load_from_args(
            DataArguments(dataset_name=str(folder), source_column="englisch", target_column="german")
        )
    with pytest.raises(ValueError, match="Give both --source_column and --target_column"):
        load_from_args(DataArguments(dataset_name=str(folder), source_column="english"))
