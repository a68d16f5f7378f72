"""A disk cache of tokenized data, so that a restart or a resume does not tokenize the corpus again.

Tokenizing WMT 2014 EN-DE (4.5 M pairs) takes minutes; without a cache every launch, every resume and
every rank of a data-parallel run would do it again. Here the tokenized splits are written once, as
Arrow files by `datasets.Dataset.map(cache_file_name=...)` (batch by batch, so memory does not grow with
the corpus), into a folder named by a fingerprint of everything the result depends on:

- the data: local files by path, size and modification time (not read, so a warm start does not read
  the text at all); a Hub dataset by the `datasets` fingerprint of each split; the demo task by its
  arguments; the languages and `max_train_samples`/`max_eval_samples`;
- the tokenizer: its full serialization (`tokenizer.json` of a fast tokenizer);
- the settings: `max_source_length`, `max_target_length`, and :data:`CACHE_FORMAT`.

A later launch with the same inputs finds the folder and memory-maps its Arrow files
(`datasets.Dataset.from_file`): nothing is tokenized and nothing is held in memory. Any change of the
inputs gives another folder; old folders are left for the user to delete (`rm -r` the cache root).

The folder is built in a temporary sibling and renamed into place when complete, so a killed launch
leaves no half-written cache that a later one would trust. Under data parallelism only the main process
of each node builds it, the others wait (`TrainingArguments.main_process_first`) and then read it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import socket
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import datasets
from transformers import PreTrainedTokenizerBase

from hf_vanilla.data.options import DataArguments
from hf_vanilla.io.atomic import TEMPORARY_REMOVED, full_disk_named
from hf_vanilla.io.errors import CorruptCheckpointError
from hf_vanilla.io.json_files import read_json

logger = logging.getLogger(__name__)

#: Bump when the layout or the meaning of the cached columns changes: older folders are then not used.
CACHE_FORMAT = 1
_MANIFEST = "hf_vanilla_tokenized.json"


def default_cache_root() -> Path:
    """`$HF_DATASETS_CACHE/hf_vanilla_tokenized` (by default ``~/.cache/huggingface/datasets/...``)."""
    return Path(datasets.config.HF_DATASETS_CACHE) / "hf_vanilla_tokenized"


def _file_stamp(path: str) -> list[Any] | None:
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return [os.path.abspath(path), stat.st_size, stat.st_mtime_ns]


def _tokenizer_digest(tokenizer: PreTrainedTokenizerBase) -> str:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        text = backend.to_str() + json.dumps(tokenizer.special_tokens_map, sort_keys=True)
        return hashlib.sha256(text.encode("utf-8")).hexdigest()
    return datasets.fingerprint.Hasher.hash(tokenizer)


def data_fingerprint(
    data_args: DataArguments,
    tokenizer: PreTrainedTokenizerBase,
    max_source_length: int | None,
    max_target_length: int | None,
    data: datasets.DatasetDict | None = None,
) -> str:
    """The cache key of the tokenized data (see the module docstring). ``data`` is needed for a Hub dataset
    only (its splits' fingerprints); local files and the demo task are keyed without reading them."""
    source: dict[str, Any]
    if data_args.local_files():
        source = {
            "files": data_args.local_files(),
            "stamps": [stamp for path in data_args.input_paths() if (stamp := _file_stamp(path))],
        }
    elif data_args.demo:
        source = {
            name: getattr(data_args, name)
            for name in ("demo_max_number", "demo_train_size", "demo_validation_size", "demo_test_size")
        } | {"demo_seed": data_args.demo_seed}
    else:
        if data is None:
            raise ValueError("A Hub dataset is keyed by its loaded splits: pass `data`.")
        source = {
            "hub": [data_args.dataset_name, data_args.dataset_config_name],
            "splits": {split: ds._fingerprint for split, ds in data.items()},
        }
    key = {
        "format": CACHE_FORMAT,
        "source": source,
        "langs": [data_args.source_lang, data_args.target_lang],
        "samples": [data_args.max_train_samples, data_args.max_eval_samples],
        "lengths": [max_source_length, max_target_length],
        "tokenizer": _tokenizer_digest(tokenizer),
    }
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode("utf-8")).hexdigest()[:32]


def load_cached(folder: str | Path) -> datasets.DatasetDict | None:
    """The tokenized splits cached in ``folder`` (memory-mapped), or None if it holds no complete cache."""
    folder = Path(folder)
    manifest = folder / _MANIFEST
    if not manifest.is_file():
        return None
    rebuild = f"Delete the cache folder {str(folder)!r}: the next run tokenizes the data again."
    splits = read_json(manifest, hint=rebuild).get("splits")
    if not isinstance(splits, list):
        raise CorruptCheckpointError(f"{str(manifest)!r} is damaged: it names no splits. {rebuild}")
    return datasets.DatasetDict(
        {split: datasets.Dataset.from_file(str(folder / f"{split}.arrow")) for split in splits}
    )


def build_cache(
    folder: str | Path,
    data: datasets.DatasetDict,
    tokenize: Callable[..., datasets.DatasetDict],
) -> datasets.DatasetDict:
    """Tokenize ``data`` split by split with ``tokenize(dataset, cache_file_name=...)`` into a temporary
    sibling of ``folder``, then rename it to ``folder``; returns the cached splits, memory-mapped."""
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    partial = folder.with_name(f"{folder.name}.partial-{socket.gethostname()}-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir()
    try:
        kept = f"no cache was written (the data is tokenized again next time), {TEMPORARY_REMOVED}"
        with full_disk_named(folder, kept):
            for split, dataset in data.items():
                tokenize(dataset, cache_file_name=str(partial / f"{split}.arrow"))
            (partial / _MANIFEST).write_text(json.dumps({"splits": list(data)}), encoding="utf-8")
        try:
            partial.rename(folder)
        except OSError:  # another node's main process finished the same cache first (shared file system)
            if load_cached(folder) is None:
                raise
            shutil.rmtree(partial)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    cached = load_cached(folder)
    if cached is None:  # renamed above, so it is complete
        raise RuntimeError(f"The tokenized-data cache {str(folder)!r} vanished while it was being built.")
    return cached


@contextlib.contextmanager
def _nothing() -> Iterator[None]:
    yield


def cached_tokenization(
    cache_root: str | Path,
    fingerprint: str,
    load_data: Callable[[], datasets.DatasetDict],
    tokenize: Callable[..., datasets.DatasetDict],
    main_process_first: AbstractContextManager[Any] | None = None,
) -> datasets.DatasetDict:
    """The tokenized data from ``cache_root/fingerprint`` if it is there, else ``load_data()`` tokenized
    into it by ``tokenize`` (see :func:`build_cache`). ``main_process_first`` (e.g.
    ``training_args.main_process_first(desc=...)``) lets the main process build the cache while the other
    processes wait; they then find it and only read it."""
    folder = Path(cache_root) / fingerprint
    with main_process_first if main_process_first is not None else _nothing():
        cached = load_cached(folder)
        if cached is not None:
            logger.info("Using the tokenized data cached in %s", folder)
            return cached
        logger.info("Tokenizing the data into the cache %s", folder)
        return build_cache(folder, load_data(), tokenize)
