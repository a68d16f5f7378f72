"""Parallel data for translation: Hub datasets, local files, and an embedded demo task.

Every loader returns a `datasets.DatasetDict` with splits among `train`, `validation` and `test`,
whose examples have one column, `translation`, holding `{source_lang: str, target_lang: str}` — the
convention of the Hub's translation datasets (e.g. `wmt14`, config `de-en`, used in §6.1 of the paper).

Sources (see `DataArguments`):

- **Hub dataset** by name and config, through `datasets.load_dataset`. When the Hub cannot be used
  (offline mode, unreachable endpoint, unknown name) this fails within seconds with an error that says
  how to pass local files instead, rather than after `huggingface_hub`'s ~25-second retry loop.
- **Local files**, per split, with `--train_files/--validation_files/--test_files`:
    * two paths: plain-text source file then target file, one sentence per line (`.gz` accepted);
    * one prefix `PREFIX` such that `PREFIX.{src}` and `PREFIX.{tgt}` exist (each may end in `.gz`),
      e.g. `/data/multi30k/train` for `train.en.gz` + `train.de.gz`;
    * one JSON-lines file (`.jsonl`/`.json`, optionally `.gz`) with a `translation` object per line;
    * one TSV file (`.tsv`, optionally `.gz`), `source<TAB>target` per line.
- **Demo task** (`--demo`): English → German spelled-out numbers, generated at run time, no network.

Whitespace: each sentence loses its line terminator (`\\n` or `\\r\\n`; lines are split on `\\n`
only, so a stray `\\r` or U+2028 inside a sentence stays put) and then leading and trailing whitespace
(`str.strip()`). Whitespace inside a sentence is kept as is. Multi30k has 40 German training lines
ending in a space; they lose it, which changes no word. A UTF-8 byte-order mark at the start of a file
is dropped; a line that is not UTF-8 text is refused naming the file and line.

Memory: local files are read line by line and streamed into an Arrow file in the `datasets` cache
(`Dataset.from_generator`, written batch by batch, then memory-mapped), so no stage holds the corpus
in Python objects; the file is keyed by the paths, sizes and modification times of the text files and
reused by a later load of the same files (delete `$HF_DATASETS_CACHE/generator` to free the space, about
the size of the text). A pipe (bash's `<(...)`) is read into memory instead (see `load_local_files`).
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import json
import logging
import os
import stat
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import datasets
import pyarrow as pa
import pyarrow.compute as pc

from hf_vanilla.data.numbers import make_demo_splits
from hf_vanilla.data.options import DataArguments
from hf_vanilla.data.text import text_lines

logger = logging.getLogger(__name__)

SPLITS = ("train", "validation", "test")
#: Bump when the reading rules (whitespace, formats) change: text cached by older rules is then not used.
TEXT_FORMAT = 1

_LOCAL_FILES_HELP = (
    "To use local files instead, pass them per split, e.g. "
    "`--train_files PREFIX` (for PREFIX.{src} and PREFIX.{tgt}, each optionally .gz), "
    "`--train_files train.{src} train.{tgt}` (plain text, one sentence per line), "
    "`--train_files train.jsonl` (a `translation` object per line) or `--train_files train.tsv` "
    "(source<TAB>target), likewise `--validation_files` and `--test_files`, together with "
    "`--source_lang {src} --target_lang {tgt}`; or use `--demo` for the embedded number-translation task. "
    "In Python: `load_local_files({{'train': [...], 'validation': [...]}}, source_lang='{src}', "
    "target_lang='{tgt}')`."
)


def load_from_args(args: DataArguments) -> datasets.DatasetDict:
    """Load the parallel data described by `args` (see `DataArguments`)."""
    if args.source_lang == args.target_lang:
        raise ValueError(
            f"source_lang and target_lang are both {args.source_lang!r}; pass two different language codes."
        )
    local = args.local_files()
    chosen = [
        name
        for name, used in (
            ("--dataset_name", args.dataset_name),
            ("local files", local),
            ("--demo", args.demo),
        )
        if used
    ]
    if len(chosen) != 1:
        raise ValueError(
            f"Give exactly one data source; got {len(chosen)} ({', '.join(chosen) or 'none'}). Use "
            "`--dataset_name NAME --dataset_config_name CONFIG` for the Hub, or local files, or `--demo`. "
            + _LOCAL_FILES_HELP.format(src=args.source_lang, tgt=args.target_lang)
        )
    if (args.source_column or args.target_column) and not args.dataset_name:
        raise ValueError(
            "--source_column/--target_column name columns of a --dataset_name dataset; none was given."
        )
    if args.dataset_name:
        data = load_hub_dataset(
            args.dataset_name,
            args.dataset_config_name,
            args.source_lang,
            args.target_lang,
            source_column=args.source_column,
            target_column=args.target_column,
        )
    elif local:
        data = load_local_files(local, args.source_lang, args.target_lang)
    else:
        if (args.source_lang, args.target_lang) != ("en", "de"):
            raise ValueError(
                f"The demo task translates en → de; got --source_lang {args.source_lang} "
                f"--target_lang {args.target_lang}. Pass --source_lang en --target_lang de."
            )
        data = make_demo_splits(
            args.demo_train_size,
            args.demo_validation_size,
            args.demo_test_size,
            args.demo_max_number,
            args.demo_seed,
        )
    return truncate_splits(data, args.max_train_samples, args.max_eval_samples)


def truncate_splits(
    data: datasets.DatasetDict, max_train_samples: int | None, max_eval_samples: int | None
) -> datasets.DatasetDict:
    """Keep the first `max_train_samples` training and `max_eval_samples` validation/test pairs."""
    out = {}
    for split, ds in data.items():
        limit = max_train_samples if split == "train" else max_eval_samples
        out[split] = ds.select(range(min(limit, len(ds)))) if limit is not None else ds
    return datasets.DatasetDict(out)


def translation_features(source_lang: str, target_lang: str) -> datasets.Features:
    """The `translation` feature, as in the Hub's translation datasets."""
    return datasets.Features({"translation": datasets.Translation(languages=[source_lang, target_lang])})


# ----------------------------------------------------------------------------------------------------
# Hub
# ----------------------------------------------------------------------------------------------------


def hub_offline() -> bool:
    """Whether offline mode is on (environment or already-imported `huggingface_hub`/`datasets` constants)."""
    import huggingface_hub.constants

    env = any(
        os.environ.get(var, "").strip().upper() in {"1", "ON", "YES", "TRUE"}
        for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
    )
    return env or bool(huggingface_hub.constants.HF_HUB_OFFLINE) or bool(datasets.config.HF_HUB_OFFLINE)


def _hub_unreachable_reason(timeout: float = 5.0) -> str | None:
    """One HEAD request to the Hub endpoint without retries; why it failed, or None if the Hub answered."""
    import urllib.error
    import urllib.request

    import huggingface_hub.constants

    endpoint = huggingface_hub.constants.ENDPOINT
    try:
        urllib.request.urlopen(urllib.request.Request(endpoint, method="HEAD"), timeout=timeout).close()
    except urllib.error.HTTPError:
        return None  # the server answered (any status): reachable
    except OSError as err:  # URLError, DNS failure, refused connection, timeout
        return f"{endpoint} is unreachable ({err})"
    return None


def load_hub_dataset(
    name: str,
    config_name: str | None,
    source_lang: str,
    target_lang: str,
    source_column: str | None = None,
    target_column: str | None = None,
    **load_kwargs: Any,
) -> datasets.DatasetDict:
    """`datasets.load_dataset(name, config_name)`, failing fast with a useful message when it cannot work.

    Offline mode is checked first: if `datasets` itself runs offline, only its cache is consulted (fast);
    if offline mode was switched on after `datasets` was imported, the Hub is not contacted at all. Online,
    the endpoint is probed once without retries before loading. Connection and not-found errors are re-raised
    as `ValueError` naming the local-file arguments. A dataset without a `translation` column is read from
    `source_column` and `target_column` (both or neither) into one.
    """
    if (source_column is None) != (target_column is None):
        raise ValueError(
            "Give both --source_column and --target_column, or neither (for a `translation` column)."
        )
    how = _LOCAL_FILES_HELP.format(src=source_lang, tgt=target_lang)
    label = name + (f" (config {config_name!r})" if config_name else "")
    is_local = os.path.exists(name)
    if not is_local and hub_offline() and not datasets.config.HF_HUB_OFFLINE:
        raise ValueError(
            f"Cannot load Hub dataset {label}: offline mode is on (HF_HUB_OFFLINE/HF_DATASETS_OFFLINE) but was "
            f"set after `datasets` was imported, so its cache cannot be used safely. {how}"
        )
    if not is_local and not hub_offline() and (reason := _hub_unreachable_reason()) is not None:
        raise ValueError(
            f"Cannot load Hub dataset {label}: {reason}. If it is cached, set HF_HUB_OFFLINE=1 to use the "
            f"cache. {how}"
        )
    try:
        data = datasets.load_dataset(name, config_name, **load_kwargs)
    except (ConnectionError, FileNotFoundError, datasets.exceptions.DatasetNotFoundError) as err:
        mode = " (offline mode is on and it is not in the cache)" if hub_offline() else ""
        raise ValueError(f"Cannot load Hub dataset {label}{mode}: {err}. {how}") from err
    if not isinstance(data, datasets.DatasetDict):
        raise ValueError(f"Hub dataset {label} gave {type(data).__name__}, expected a DatasetDict of splits.")
    if source_column is not None:
        data = _columns_to_translation(data, label, source_column, target_column, source_lang, target_lang)
    for split, ds in data.items():
        if "translation" not in ds.column_names:
            raise ValueError(
                f"Hub dataset {label}, split {split!r}, has columns {ds.column_names} but no `translation` "
                f"column; name the sentence columns with --source_column and --target_column, or use local "
                f"files. {how}"
            )
        first = ds[0]["translation"] if len(ds) else {}
        missing = [lang for lang in (source_lang, target_lang) if lang not in first]
        if missing:
            raise ValueError(
                f"Hub dataset {label}, split {split!r}: `translation` has languages {sorted(first)}, not "
                f"{missing}. Check --source_lang/--target_lang or --dataset_config_name."
            )
    return data


def _columns_to_translation(
    data: datasets.DatasetDict,
    label: str,
    source_column: str,
    target_column: str,
    source_lang: str,
    target_lang: str,
) -> datasets.DatasetDict:
    """Each split as one `translation` column of `{source_lang: source_column, target_lang: target_column}`."""
    out = {}
    for split, ds in data.items():
        missing = [column for column in (source_column, target_column) if column not in ds.column_names]
        if missing:
            raise ValueError(
                f"Hub dataset {label}, split {split!r}, has no column {missing[0]!r}; its columns are "
                f"{ds.column_names}. Check --source_column/--target_column."
            )
        out[split] = ds.map(
            lambda row: {"translation": {source_lang: row[source_column], target_lang: row[target_column]}},
            remove_columns=ds.column_names,
            features=translation_features(source_lang, target_lang),
        )
    return datasets.DatasetDict(out)


# ----------------------------------------------------------------------------------------------------
# Local files
# ----------------------------------------------------------------------------------------------------


def _open_bytes(path: Path):
    """Open a file (gzip if it ends in .gz) for reading bytes; iterating it splits lines on b'\\n' only."""
    if path.suffix == ".gz":
        return gzip.open(path, "rb")
    return open(path, "rb")


def _check_file(path: Path) -> None:
    """A data file is read once, so a pipe (bash's ``<(...)``) does as well as a file; a folder does not."""
    if not path.exists():
        raise FileNotFoundError(f"Data file {str(path)!r} does not exist. Check the path.")
    if path.is_dir():
        raise IsADirectoryError(f"Data file {str(path)!r} is a folder; give the file in it.")


def _read_lines(path: Path) -> Iterator[str]:
    """Lines of a text file without their terminator (see the module docstring on whitespace)."""
    _check_file(path)
    try:
        with _open_bytes(path) as handle:
            yield from text_lines(handle, str(path))
    except (OSError, EOFError) as err:
        raise ValueError(
            f"Cannot read {str(path)!r}{' as gzip' if path.suffix == '.gz' else ''}: {err}"
        ) from err


def _clean(text: str) -> str:
    return text.strip()


Pair = tuple[str, str]


def _lists(pairs: Iterable[Pair]) -> tuple[list[str], list[str]]:
    sources: list[str] = []
    targets: list[str] = []
    for source, target in pairs:
        sources.append(source)
        targets.append(target)
    return sources, targets


def _iter_parallel_text(source_path: Path, target_path: Path) -> Iterator[Pair]:
    """The pairs of two plain-text files read in step; the files' emptiness and line counts are checked
    when both are read (the longer one to its end, to name both counts)."""
    sources, targets = _read_lines(source_path), _read_lines(target_path)
    pairs = 0
    while True:
        source, target = next(sources, None), next(targets, None)
        if source is None or target is None:
            break
        pairs += 1
        yield _clean(source), _clean(target)
    source_count = pairs + (source is not None) + sum(1 for _ in sources)
    target_count = pairs + (target is not None) + sum(1 for _ in targets)
    for path, count in ((source_path, source_count), (target_path, target_count)):
        if not count:
            raise ValueError(f"Data file {str(path)!r} is empty; it needs one sentence per line.")
    if source_count != target_count:
        raise ValueError(
            f"Parallel files differ in length: {str(source_path)!r} has {source_count} lines but "
            f"{str(target_path)!r} has {target_count}. Line i of one must translate line i of the other."
        )


def _iter_tsv(path: Path) -> Iterator[Pair]:
    pairs = 0
    for number, line in enumerate(_read_lines(path), start=1):
        fields = line.split("\t")
        if len(fields) != 2:
            raise ValueError(
                f"{str(path)!r}, line {number}: expected exactly one tab (source<TAB>target), found "
                f"{len(fields) - 1}: {line[:80]!r}"
            )
        pairs += 1
        yield _clean(fields[0]), _clean(fields[1])
    if not pairs:
        raise ValueError(f"Data file {str(path)!r} is empty; it needs one source<TAB>target pair per line.")


def _iter_jsonl(path: Path, source_lang: str, target_lang: str) -> Iterator[Pair]:
    pairs = 0
    for number, line in enumerate(_read_lines(path), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(
                f"{str(path)!r}, line {number}: not valid JSON ({err}). A .jsonl or .json data file holds one "
                f'JSON object per line, like {{"translation": {{"{source_lang}": "...", "{target_lang}": "..."}}}}; '
                "a JSON array over several lines is not read."
            ) from err
        pair = record.get("translation") if isinstance(record, dict) else None
        if not isinstance(pair, dict) or not all(
            isinstance(pair.get(k), str) for k in (source_lang, target_lang)
        ):
            raise ValueError(
                f"{str(path)!r}, line {number}: expected an object like "
                f'{{"translation": {{"{source_lang}": "...", "{target_lang}": "..."}}}}, got {line[:80]!r}'
            )
        pairs += 1
        yield _clean(pair[source_lang]), _clean(pair[target_lang])
    if not pairs:
        raise ValueError(f"Data file {str(path)!r} is empty; it needs one JSON object per line.")


def read_parallel_text(source_path: str | Path, target_path: str | Path) -> tuple[list[str], list[str]]:
    """Two plain-text files, one sentence per line; line i of one translates line i of the other."""
    return _lists(_iter_parallel_text(Path(source_path), Path(target_path)))


def _resolve_prefix(prefix: str, lang: str) -> Path | None:
    for candidate in (Path(f"{prefix}.{lang}"), Path(f"{prefix}.{lang}.gz")):
        if candidate.is_file():
            return candidate
    return None


def _format_of(path: Path) -> str | None:
    suffixes = [s.lower() for s in path.suffixes]
    if suffixes and suffixes[-1] == ".gz":
        suffixes = suffixes[:-1]
    if suffixes and suffixes[-1] in (".jsonl", ".json"):
        return "jsonl"
    if suffixes and suffixes[-1] == ".tsv":
        return "tsv"
    return None


def _split_reader(
    files: Sequence[str], source_lang: str, target_lang: str
) -> tuple[list[Path], Callable[[], Iterator[Pair]]]:
    """The files of one split given in any of the local forms (see the module docstring), and a function
    that iterates over its (source, target) pairs, reading the files as it goes. The form is checked here;
    the content (encoding, tabs, JSON, line counts) as it is read."""
    files = list(files)
    if len(files) == 2:
        source, target = Path(files[0]), Path(files[1])
        # Catch swapped files: a name ending in `.{target_lang}` given as the source, or vice versa.
        for path, own, other in ((source, source_lang, target_lang), (target, target_lang, source_lang)):
            stem = path.name[:-3] if path.name.endswith(".gz") else path.name
            if stem.endswith(f".{other}") and not stem.endswith(f".{own}"):
                raise ValueError(
                    f"{str(path)!r} looks like a {other!r} file but is given as the "
                    f"{'source' if own == source_lang else 'target'} ({own!r}). Give the source file first, "
                    f"then the target file, or swap --source_lang/--target_lang."
                )
        return [source, target], functools.partial(_iter_parallel_text, source, target)
    if len(files) != 1:
        raise ValueError(
            f"Expected one path (a prefix, a .jsonl or a .tsv file) or two paths (source, target), got "
            f"{len(files)}: {files}."
        )
    path = Path(files[0])
    kind = _format_of(path)
    if kind == "jsonl":
        return [path], functools.partial(_iter_jsonl, path, source_lang, target_lang)
    if kind == "tsv":
        return [path], functools.partial(_iter_tsv, path)
    source, target = _resolve_prefix(files[0], source_lang), _resolve_prefix(files[0], target_lang)
    if source is not None and target is not None:
        return [source, target], functools.partial(_iter_parallel_text, source, target)
    if path.is_file():
        raise ValueError(
            f"{str(path)!r} is neither .jsonl nor .tsv (optionally .gz). For plain text, give two paths "
            f"(source file, then target file) or a prefix PREFIX with PREFIX.{source_lang} and PREFIX.{target_lang}."
        )
    missing = [
        f"{files[0]}.{lang}[.gz]"
        for lang, found in ((source_lang, source), (target_lang, target))
        if found is None
    ]
    raise FileNotFoundError(
        f"No data found for {files[0]!r}: it is not a file, and as a prefix these are missing: {', '.join(missing)}."
    )


def read_split_files(files: Sequence[str], source_lang: str, target_lang: str) -> tuple[list[str], list[str]]:
    """Read one split given in any of the local forms (see the module docstring) into two lists."""
    return _lists(_split_reader(files, source_lang, target_lang)[1]())


def pair_location(files: Sequence[str], source_lang: str, target_lang: str, index: int) -> str:
    """Where pair ``index`` (0-based) of a split read by :func:`read_split_files` from ``files`` is:
    ``"<source file>, line <n>"`` (a .jsonl file's blank lines are skipped when reading, and counted here)."""
    files = list(files)
    if len(files) == 2:
        return f"{files[0]}, line {index + 1}"
    path = Path(files[0])
    kind = _format_of(path)
    if kind is None:
        source = _resolve_prefix(files[0], source_lang)
        return f"{source or path}, line {index + 1}"
    if kind == "jsonl":
        seen = -1
        for number, line in enumerate(_read_lines(path), start=1):
            seen += bool(line.strip())
            if seen == index:
                return f"{path}, line {number}"
    return f"{path}, line {index + 1}"


def _text_fingerprint(paths: Sequence[Path], split: str, source_lang: str, target_lang: str) -> str:
    """The key of a split's text in the `datasets` cache: each file's path, size and modification time
    (as the tokenized-data cache keys them, hf_vanilla.data.cache), the split and the languages."""
    stamps = [[str(path.resolve()), (info := path.stat()).st_size, info.st_mtime_ns] for path in paths]
    key = {"format": TEXT_FORMAT, "files": stamps, "split": split, "langs": [source_lang, target_lang]}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode("utf-8")).hexdigest()[:32]


def _stream_to_arrow(
    pairs: Callable[[], Iterator[Pair]],
    fingerprint: str,
    split: str,
    source_lang: str,
    target_lang: str,
) -> datasets.Dataset:
    """`datasets.Dataset.from_generator` over ``pairs()``: written to an Arrow file in the `datasets`
    cache batch by batch and memory-mapped, or found there by ``fingerprint``. A reading error (a bad
    line, files of unequal length) is raised as itself, not as `datasets`' generation error."""

    def examples() -> Iterator[dict[str, dict[str, str]]]:
        for source, target in pairs():
            yield {"translation": {source_lang: source, target_lang: target}}

    bars = not datasets.utils.are_progress_bars_disabled()
    if bars:  # a bad line must give one line of error, not a half-drawn progress bar before it
        datasets.utils.disable_progress_bars()
    try:
        return datasets.Dataset.from_generator(
            examples,
            features=translation_features(source_lang, target_lang),
            split=datasets.NamedSplit(split),
            fingerprint=fingerprint,
        )
    except datasets.exceptions.DatasetGenerationError as err:
        if not isinstance(err.__cause__, ValueError | OSError):
            raise
        failure = err.__cause__
    finally:
        if bars:
            datasets.utils.enable_progress_bars()
    raise failure


def _regular_files(paths: Sequence[Path]) -> bool:
    """Whether every path is a regular file (not a pipe); a missing path or a folder raises."""
    for path in paths:
        _check_file(path)
    return all(stat.S_ISREG(path.stat().st_mode) for path in paths)


def load_local_files(
    split_files: dict[str, Sequence[str]], source_lang: str, target_lang: str
) -> datasets.DatasetDict:
    """Build a `DatasetDict` from local files, e.g. `{"train": ["train.en.gz", "train.de.gz"], "validation": ["val"]}`.

    The text of regular files is streamed into an Arrow file in the `datasets` cache
    (`$HF_DATASETS_CACHE/generator/`), keyed by the files' paths, sizes and modification times, and
    memory-mapped: no stage holds the corpus in Python objects, and loading the same files again reuses
    it. A pipe (bash's `<(...)`) can be read only once and has no stable key: it is read into memory.
    """
    unknown = set(split_files) - set(SPLITS)
    if unknown:
        raise ValueError(f"Unknown split names {sorted(unknown)}; use {list(SPLITS)}.")
    out = {}
    for split, files in split_files.items():
        paths, pairs = _split_reader(files, source_lang, target_lang)
        if _regular_files(paths):
            fingerprint = _text_fingerprint(paths, split, source_lang, target_lang)
            dataset = _stream_to_arrow(pairs, fingerprint, split, source_lang, target_lang)
        else:
            sources, targets = _lists(pairs())
            # One Arrow struct column built from the two lists: no Python dict per pair.
            column = pa.StructArray.from_arrays(
                [pa.array(sources, pa.string()), pa.array(targets, pa.string())],
                names=[source_lang, target_lang],
            )
            del sources, targets
            features = translation_features(source_lang, target_lang)
            dataset = datasets.Dataset.from_dict({"translation": column}, features=features)
        empty = sum(
            pc.sum(
                pc.or_(pc.equal(chunk.field(source_lang), ""), pc.equal(chunk.field(target_lang), ""))
            ).as_py()
            for chunk in dataset.data.column("translation").chunks
        )
        if empty:
            logger.warning("%s (%s): %d pairs have an empty side.", split, files, empty)
        out[split] = dataset
        logger.info("Loaded %d %s pairs from %s", len(dataset), split, files)
    return datasets.DatasetDict(out)
