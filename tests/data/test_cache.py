"""The tokenized-data cache (hf_vanilla.data.cache): reused when nothing changed, rebuilt when the data,
the tokenizer or the lengths change, and read, not rebuilt, by a second data-parallel process."""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import datasets
import pytest
from helpers import word_tokenizer
from transformers import PreTrainedTokenizerFast

from hf_vanilla.data.cache import cached_tokenization, data_fingerprint, load_cached
from hf_vanilla.data.loading import load_from_args
from hf_vanilla.data.options import DataArguments
from hf_vanilla.data.tokenization import tokenize_translations


def _write(folder: Path, words: list[str]) -> DataArguments:
    (folder / "train.en").write_text("".join(f"{w} w1\n" for w in words), encoding="utf-8")
    (folder / "train.de").write_text("".join(f"w2 {w}\n" for w in words), encoding="utf-8")
    return DataArguments(train_files=[str(folder / "train")])


class Counting:
    """`load_data` and `tokenize` for `cached_tokenization` that count their calls."""

    def __init__(
        self, args: DataArguments, tokenizer: PreTrainedTokenizerFast, max_length: int | None
    ) -> None:
        self.args, self.loads, self.tokenizations = args, 0, 0
        self.tokenize_split = functools.partial(
            tokenize_translations,
            tokenizer=tokenizer,
            source_lang="en",
            target_lang="de",
            max_source_length=max_length,
        )
        self.key = data_fingerprint(args, tokenizer, max_length, None)

    def load(self) -> datasets.DatasetDict:
        self.loads += 1
        return load_from_args(self.args)

    def tokenize(self, dataset: datasets.Dataset, **kwargs: str) -> datasets.Dataset:
        self.tokenizations += 1
        return self.tokenize_split(dataset, **kwargs)

    def run(self, root: Path, main_process_first: contextlib.AbstractContextManager | None = None):
        return cached_tokenization(root, self.key, self.load, self.tokenize, main_process_first)


def test_cache_is_reused_and_invalidated(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    args = _write(tmp_path, ["w3", "w4 w5", "w6"])
    first = Counting(args, word_tokenizer(), None)
    built = first.run(root)["train"]
    assert (first.loads, first.tokenizations) == (1, 1)

    again = Counting(args, word_tokenizer(), None)  # a restart: same files, tokenizer and lengths
    reused = again.run(root)["train"]
    assert (again.loads, again.tokenizations) == (0, 0)
    assert reused.to_dict() == built.to_dict() and reused["labels"][1] == [6, 8, 9, 2]
    assert all(Path(f["filename"]).parent == root / first.key for f in reused.cache_files)  # memory-mapped

    changed = {
        "tokenizer": Counting(args, word_tokenizer(words=97), None),
        "lengths": Counting(args, word_tokenizer(), 2),
    }
    for what, run in changed.items():
        run.run(root)
        assert (run.loads, run.tokenizations) == (1, 1), what
    os.utime(tmp_path / "train.de", ns=(1, 1))  # an edited data file (its modification time changes)
    edited = Counting(args, word_tokenizer(), None)
    edited.run(root)
    assert (edited.loads, edited.tokenizations) == (1, 1)
    assert len(list(root.iterdir())) == 4  # one folder per fingerprint, no temporary folder left


def test_a_second_process_reads_the_cache_the_main_process_wrote(tmp_path: Path) -> None:
    """Simulates `TrainingArguments.main_process_first` under DDP with two threads: rank 1 waits until
    rank 0 leaves the block, then finds the complete cache and neither reads the text nor tokenizes."""
    root, args = tmp_path / "cache", _write(tmp_path, ["w3", "w4 w5", "w6"])
    main_done = threading.Event()

    @contextlib.contextmanager
    def main_process_first(rank: int) -> Iterator[None]:
        if rank != 0:
            main_done.wait(timeout=60)
        try:
            yield
        finally:
            if rank == 0:
                main_done.set()

    ranks = [Counting(args, word_tokenizer(), None) for _ in range(2)]
    results: dict[int, datasets.DatasetDict] = {}
    threads = [
        threading.Thread(target=lambda r=r: results.setdefault(r, ranks[r].run(root, main_process_first(r))))
        for r in (1, 0)  # the other rank starts first: it must still wait for the main one
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert [(rank.loads, rank.tokenizations) for rank in ranks] == [(1, 1), (0, 0)]
    assert results[1]["train"].to_dict() == results[0]["train"].to_dict()


def test_a_killed_build_leaves_no_cache(tmp_path: Path) -> None:
    root, args = tmp_path / "cache", _write(tmp_path, ["w3"])
    run = Counting(args, word_tokenizer(), None)

    def interrupted(dataset: datasets.Dataset, **kwargs: str) -> datasets.Dataset:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        cached_tokenization(root, run.key, run.load, interrupted)
    assert list(root.iterdir()) == []
    run.run(root)
    assert run.tokenizations == 1


@pytest.mark.parametrize("content", ["{not json", "[]", '{"splits": 3}'])
def test_a_damaged_cache_record_is_named_with_what_to_do(content: str, tmp_path: Path) -> None:
    (tmp_path / "hf_vanilla_tokenized.json").write_text(content, encoding="utf-8")
    with pytest.raises(ValueError, match=r"hf_vanilla_tokenized\.json' is damaged.*Delete the cache folder"):
        load_cached(tmp_path)
