"""The data commands' options (where the parallel data comes from, how to train the tokenizer),
importable without datasets or torch so that a command's ``--help`` needs no torch;
:mod:`hf_vanilla.data.loading` and :mod:`hf_vanilla.data.tokenization` use them."""

from __future__ import annotations

from dataclasses import dataclass, field

from hf_vanilla.io.atomic import OVERWRITE_HELP
from hf_vanilla.io.numbers import Bounds, refuse_out_of_bounds

__all__ = ["TOKENIZER_SAMPLE_PAIRS", "DataArguments", "TokenizerArguments"]

#: Pairs the tokenizer is trained on by default: all of Multi30k, a strided 1 M-pair sample of WMT14's 4.5 M.
TOKENIZER_SAMPLE_PAIRS = 1_000_000


#: The values :class:`DataArguments`' number options can honour.
_DATA_BOUNDS = {
    "demo_max_number": Bounds(0),
    "demo_train_size": Bounds(0, what="pairs"),
    "demo_validation_size": Bounds(0, what="pairs"),
    "demo_test_size": Bounds(0, what="pairs"),
    "max_train_samples": Bounds(0, what="pairs"),
    "max_eval_samples": Bounds(0, what="pairs; 0: no validation or test"),
}


@dataclass
class DataArguments:
    """Where the parallel data comes from. Exactly one source: `dataset_name`, local files, or `demo`."""

    source_lang: str = field(
        default="en", metadata={"help": "Source language code (a key of `translation`)."}
    )
    target_lang: str = field(
        default="de", metadata={"help": "Target language code (a key of `translation`)."}
    )
    dataset_name: str | None = field(
        default=None,
        metadata={
            "help": "Hub dataset name, e.g. `wmt14` (the paper's WMT 2014 English-German, §5.1). "
            "Needs the Hub or a cached copy (HF_HUB_OFFLINE=1 uses the cache only)."
        },
    )
    dataset_config_name: str | None = field(
        default=None, metadata={"help": "Hub dataset config, e.g. `de-en` for `wmt14`."}
    )
    source_column: str | None = field(
        default=None,
        metadata={
            "help": "With --dataset_name: the column holding source sentences, for a dataset without a "
            "`translation` column (give --target_column too)."
        },
    )
    target_column: str | None = field(
        default=None, metadata={"help": "With --dataset_name: the column holding target sentences."}
    )
    train_files: list[str] | None = field(
        default=None,
        metadata={
            "help": "Local training data: SRC_FILE TGT_FILE (plain text, one sentence per line, .gz ok), "
            "or PREFIX (PREFIX.<source_lang> and PREFIX.<target_lang>, .gz ok), or one .jsonl file "
            "(`translation` object per line) or one .tsv file (source<TAB>target)."
        },
    )
    validation_files: list[str] | None = field(
        default=None, metadata={"help": "Local validation data, same forms as --train_files."}
    )
    test_files: list[str] | None = field(
        default=None, metadata={"help": "Local test data, same forms as --train_files."}
    )
    demo: bool = field(
        default=False,
        metadata={
            "help": "Use the embedded demo task: English → German spelled-out numbers (no files needed)."
        },
    )
    demo_max_number: int = field(
        default=9999, metadata={"help": "Demo task: largest number (at most 999999); numbers are 0..max."}
    )
    demo_train_size: int = field(default=6000, metadata={"help": "Demo task: number of training pairs."})
    demo_validation_size: int = field(
        default=500, metadata={"help": "Demo task: number of validation pairs."}
    )
    demo_test_size: int = field(default=500, metadata={"help": "Demo task: number of test pairs."})
    max_train_samples: int | None = field(
        default=None, metadata={"help": "Keep only the first N training pairs (for quick runs)."}
    )
    max_eval_samples: int | None = field(
        default=None, metadata={"help": "Keep only the first N validation and test pairs (for quick runs)."}
    )
    demo_seed: int = field(
        default=42, metadata={"help": "Demo task: seed for the choice of numbers per split."}
    )
    tokenized_cache_dir: str | None = field(
        default=None,
        metadata={
            "help": "Where to cache the tokenized data, in a folder per fingerprint of the data files, tokenizer "
            "and lengths, so that a restart or resume does not tokenize again (default: "
            "$HF_DATASETS_CACHE/hf_vanilla_tokenized). Delete it to free the disk space."
        },
    )

    def __post_init__(self) -> None:
        refuse_out_of_bounds(self, _DATA_BOUNDS)

    def local_files(self) -> dict[str, list[str]]:
        """The local file arguments given, by split name."""
        given = {"train": self.train_files, "validation": self.validation_files, "test": self.test_files}
        return {split: files for split, files in given.items() if files}

    def input_paths(self) -> list[str]:
        """Every local path the data arguments may read (a prefix's language files included), for the
        check that no output replaces an input (:func:`hf_vanilla.io.atomic.refuse_to_replace`)."""
        langs = (self.source_lang, self.target_lang)
        return [
            name
            for files in self.local_files().values()
            for file in files
            for name in (file, *(f"{file}.{lang}{gz}" for lang in langs for gz in ("", ".gz")))
        ]


@dataclass
class TokenizerArguments:
    """How to train the shared BPE tokenizer (§5.1)."""

    output_dir: str = field(metadata={"help": "Where to save the tokenizer (save_pretrained format)."})
    vocab_size: int = field(
        default=37000,
        metadata={
            "help": "Shared source+target vocabulary size, special tokens included (paper §5.1: ~37000)."
        },
    )
    min_frequency: int = field(default=2, metadata={"help": "Minimum count of a pair to be merged."})
    split: str = field(default="train", metadata={"help": "Which split to train the tokenizer on."})
    max_pairs: int = field(
        default=TOKENIZER_SAMPLE_PAIRS,
        metadata={
            "help": "Train on at most this many pairs, taken evenly spaced over the split (every k-th pair), to "
            "bound time and memory on large corpora; 0 = all pairs."
        },
    )
    overwrite: bool = field(default=False, metadata={"help": OVERWRITE_HELP})
