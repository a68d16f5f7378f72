"""Fault tolerance for long training runs: checkpoints that are whole, safe to load, and never lost.

The paper trained its big models for 3.5 days (§5.2) and averaged the last 20 checkpoints (§6.1); a
run that long is preempted, killed or crashes, and must resume without changing its result. This
module provides the pieces; :mod:`hf_vanilla.training` plugs them into the ``Trainer``.

* **Checks before loading** (:func:`verify_checkpoint`, :func:`verify_model_folder`). A checkpoint
  is whole when its ``trainer_state.json`` (the Trainer writes it last) names the folder's step, every
  ``*.safetensors`` file is as long as its header says, every pickled file (``optimizer.pt``,
  ``rng_state.pth``, ...) opens as plain tensor data, and a ``checksums.sha256`` manifest, when
  present, matches. A failure raises :class:`CorruptCheckpointError` or :class:`UnsafeCheckpointError`
  naming the file and what to do, instead of a stack trace from inside safetensors or pickle.
* **Untrusted files.** Weights are read from safetensors; anything pickled is checked by static
  disassembly (nothing is executed) and only plain tensors, containers and numpy arrays pass —
  ``torch.load(weights_only=True)``'s allowlist, which the Trainer itself uses when it resumes. A file
  whose unpickling would import anything else (``os.system``, ``builtins.eval``, a user class) is
  refused. ``training_args.bin`` is a full pickle of the arguments, written for reference and read
  by nothing; it is not checked and must never be ``torch.load``-ed with ``weights_only=False``.
* **Resuming from the newest whole checkpoint** (:func:`last_complete_checkpoint`): a folder left
  half-written by a kill during saving is skipped with a warning, where
  ``transformers.trainer_utils.get_last_checkpoint`` would pick it and fail.
* **Write, then rename** (:func:`atomic_directory`, :func:`save_pretrained_atomic`,
  :class:`ResilientTrainerMixin`): a folder is written under a temporary name next to its final place
  and renamed into place only when complete, so a crash never leaves a half-written folder where a
  good one was. The Trainer mixin does this for every ``checkpoint-<step>`` and for the final model.
  :func:`atomic_file` does the same for one file; :func:`refuse_to_replace` stops a command before
  it would replace an output the user did not ask it to (``--overwrite``).
* **Preemption and Ctrl-C** (:class:`SaveOnSignalCallback`): on SIGTERM (what SLURM, Kubernetes and
  ``torchrun`` send before killing a job) or SIGINT (Ctrl-C) the run finishes its current optimizer
  step, saves a checkpoint and exits; ``--resume_from_checkpoint last`` continues it. All processes
  agree on the step.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import pickletools
import shutil
import signal
import struct
import threading
import uuid
import zipfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO, TextIO

import torch
from transformers import (
    AutoModelForSeq2SeqLM,
    PreTrainedModel,
    TrainerCallback,
    TrainerControl,
    TrainerState,
    TrainingArguments,
)
from transformers.trainer_pt_utils import safe_globals
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, rotate_checkpoints

logger = logging.getLogger(__name__)

__all__ = [
    "CHECKSUMS_NAME",
    "STAGING_DIR_NAME",
    "CheckpointError",
    "CorruptCheckpointError",
    "ResilientTrainerMixin",
    "SaveOnSignalCallback",
    "UnsafeCheckpointError",
    "atomic_directory",
    "atomic_file",
    "find_complete_checkpoints",
    "last_complete_checkpoint",
    "load_full_state_dict_into_sharded",
    "load_pretrained_checked",
    "pickle_globals",
    "publish_directory",
    "refuse_to_replace",
    "save_pretrained_atomic",
    "tie_state_dict",
    "verify_checkpoint",
    "verify_checksums",
    "verify_model_folder",
    "verify_pickle_file",
    "verify_safetensors_file",
    "write_checksums",
]

#: sha256 manifest written into each checkpoint (``sha256sum -c checksums.sha256`` checks it too).
CHECKSUMS_NAME = "checksums.sha256"
#: Folder inside the run directory where checkpoints are written before they are renamed into place.
STAGING_DIR_NAME = ".incomplete-checkpoints"
TRAINER_STATE_NAME = "trainer_state.json"
#: Written by the Trainer for reference, a full pickle of the arguments, never loaded by anything.
UNREAD_PICKLES = frozenset({"training_args.bin"})
PICKLE_SUFFIXES = frozenset({".pt", ".pth", ".bin", ".pkl", ".pickle", ".ckpt"})
#: Globals a torch.distributed.checkpoint ``.metadata`` pickle may name (its dataclasses and torch types).
_DCP_MODULE_PREFIXES = ("torch.distributed.checkpoint.",)
_DCP_EXTRA_GLOBALS = frozenset(
    {
        "torch.Size",
        "torch.device",
        "torch.layout",
        "torch.memory_format",
        "torch.serialization._get_layout",
        "collections.OrderedDict",
        "builtins.set",
        "builtins.frozenset",
        "builtins.slice",
        "pathlib.PosixPath",
        "pathlib.PurePosixPath",
        "pathlib.WindowsPath",
        "pathlib.PureWindowsPath",
    }
    | {f"torch.{name}" for name in dir(torch) if isinstance(getattr(torch, name, None), torch.dtype)}
)  # constructors of plain values: none of them has side effects
_SAFETENSORS_MAX_HEADER = 100 * 1024 * 1024
_SAFETENSORS_DTYPE_BYTES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1, "I16": 2, "U16": 2, "F16": 2,
    "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8, "C64": 8,
}  # fmt: skip


class CheckpointError(ValueError):
    """A checkpoint or model folder that must not be loaded; the message names the file."""


class CorruptCheckpointError(CheckpointError):
    """A file is truncated, damaged, or missing: the folder was not written completely."""


class UnsafeCheckpointError(CheckpointError):
    """A pickled file would run code (import something other than plain tensor data) when loaded."""


def _earlier_hint(path: Path) -> str:
    return (
        " The file was probably cut short when a run was killed while saving, or damaged on disk. Resume "
        "from an earlier checkpoint (hf_vanilla.checkpointing.last_complete_checkpoint finds the newest whole "
        f"one), or delete {str(path.parent)!r}."
    )


# --------------------------------------------------------------------------------------------------
# safetensors
# --------------------------------------------------------------------------------------------------
def verify_safetensors_file(path: str | Path) -> None:
    """Check a ``.safetensors`` file's header and length without reading the tensors.

    The format is an 8-byte little-endian header length, a JSON header giving each tensor's dtype,
    shape and byte range, then the bytes. A file cut short, with a damaged header, or whose tensors
    do not exactly cover the data raises :class:`CorruptCheckpointError` naming the file.
    """
    path = Path(path)
    if not path.is_file():
        raise CorruptCheckpointError(f"{str(path)!r} is missing.{_earlier_hint(path)}")
    size = path.stat().st_size
    with path.open("rb") as handle:
        prefix = handle.read(8)
        if len(prefix) < 8:
            raise CorruptCheckpointError(
                f"{str(path)!r} is not a safetensors file: only {size} bytes long.{_earlier_hint(path)}"
            )
        (header_len,) = struct.unpack("<Q", prefix)
        if header_len > min(_SAFETENSORS_MAX_HEADER, size - 8):
            raise CorruptCheckpointError(
                f"{str(path)!r} is damaged: its header claims {header_len} bytes but the file has {size} bytes "
                f"in all.{_earlier_hint(path)}"
            )
        raw_header = handle.read(header_len)
    try:
        header = json.loads(raw_header)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CorruptCheckpointError(
            f"{str(path)!r} is damaged: its header is not valid JSON ({err}).{_earlier_hint(path)}"
        ) from err
    if not isinstance(header, dict):
        raise CorruptCheckpointError(f"{str(path)!r} is damaged: its header is not a JSON object.")
    data_len = size - 8 - header_len
    end_max = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            start, end = (int(x) for x in info["data_offsets"])
            count = 1
            for dim in info["shape"]:
                count *= int(dim)
            expected = count * _SAFETENSORS_DTYPE_BYTES.get(info["dtype"], 0)
        except (KeyError, TypeError, ValueError) as err:
            raise CorruptCheckpointError(
                f"{str(path)!r} is damaged: the header entry of tensor {name!r} is malformed ({info!r})."
                f"{_earlier_hint(path)}"
            ) from err
        if not 0 <= start <= end or (info["dtype"] in _SAFETENSORS_DTYPE_BYTES and end - start != expected):
            raise CorruptCheckpointError(
                f"{str(path)!r} is damaged: tensor {name!r} has byte range {start}..{end}, which does not fit "
                f"its dtype {info['dtype']} and shape {info['shape']}.{_earlier_hint(path)}"
            )
        end_max = max(end_max, end)
    if end_max != data_len:
        what = "truncated" if end_max > data_len else "longer than its header says"
        raise CorruptCheckpointError(
            f"{str(path)!r} is {what}: the header describes {end_max} bytes of tensor data, the file holds "
            f"{data_len}.{_earlier_hint(path)}"
        )


# --------------------------------------------------------------------------------------------------
# pickles
# --------------------------------------------------------------------------------------------------
_STRING_OPS = frozenset(
    {"SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE", "SHORT_BINSTRING", "BINSTRING", "STRING"}
)


def pickle_globals(data: bytes) -> set[str]:
    """The ``module.name`` globals a pickle would import, found by disassembly (nothing is executed).

    Handles ``GLOBAL``/``INST`` and protocol-4 ``STACK_GLOBAL`` (whose two strings may come from the
    memo). Raises :class:`pickle.UnpicklingError`-like ``ValueError`` from ``pickletools`` for data that
    is not a complete pickle.
    """
    found: set[str] = set()
    memo: dict[int, Any] = {}
    recent: list[Any] = []  # values pushed most recently (strings and placeholders)
    for opcode, arg, _ in pickletools.genops(data):
        name = opcode.name
        if name in ("GLOBAL", "INST"):
            module, _, attr = str(arg).partition(" ")
            found.add(f"{module}.{attr}")
            recent.append(None)
        elif name == "STACK_GLOBAL":
            module, attr = (recent[-2], recent[-1]) if len(recent) >= 2 else (None, None)
            if not isinstance(module, str) or not isinstance(attr, str):
                found.add("<unresolved STACK_GLOBAL>")
            else:
                found.add(f"{module}.{attr}")
            recent.append(None)
        elif name in _STRING_OPS:
            recent.append(arg if isinstance(arg, str) else bytes(arg).decode("latin-1"))
        elif name in ("PUT", "BINPUT", "LONG_BINPUT"):
            memo[int(arg)] = recent[-1] if recent else None
        elif name == "MEMOIZE":
            memo[len(memo)] = recent[-1] if recent else None
        elif name in ("GET", "BINGET", "LONG_BINGET"):
            recent.append(memo.get(int(arg)))
        else:
            recent.append(None)
        del recent[:-4]
    return found


def _unsafe_globals_message(path: Path, unsafe: Iterable[str]) -> str:
    names = ", ".join(sorted(unsafe)[:5])
    return (
        f"Refusing to load {str(path)!r}: it is a pickle that would import {names} when loaded, which is not "
        "plain tensor data (torch.load(weights_only=True) rejects it) and can run arbitrary code. If you did not "
        "write this file yourself, delete it; never open it with weights_only=False."
    )


def verify_pickle_file(path: str | Path, *, check_contents: bool = True) -> None:
    """Check that a pickled checkpoint file (``optimizer.pt``, ``rng_state.pth``, ``pytorch_model.bin``,
    a torch.distributed.checkpoint ``.metadata``) holds plain data only, without executing it.

    ``torch.save`` archives must name only globals on ``torch.load(weights_only=True)``'s allowlist
    (plus the numpy types the Trainer allows for RNG states); with ``check_contents`` they are then
    opened with ``weights_only=True`` and ``mmap=True`` (cheap) to catch truncation. A DCP
    ``.metadata`` may name only ``torch.distributed.checkpoint`` classes and torch types. Anything
    else — a raw pickle under a ``.pt`` name, a legacy-format file — is refused.
    """
    path = Path(path)
    if not path.is_file():
        raise CorruptCheckpointError(f"{str(path)!r} is missing.{_earlier_hint(path)}")
    if path.name == ".metadata":
        try:
            found = pickle_globals(path.read_bytes())
        except Exception as err:  # pickletools raises ValueError and others on damaged data
            raise CorruptCheckpointError(
                f"{str(path)!r} is not a complete pickle ({err}).{_earlier_hint(path)}"
            ) from err
        unsafe = {g for g in found if not g.startswith(_DCP_MODULE_PREFIXES) and g not in _DCP_EXTRA_GLOBALS}
        if unsafe:
            raise UnsafeCheckpointError(_unsafe_globals_message(path, unsafe))
        return
    with path.open("rb") as handle:
        is_zip_archive = handle.read(4) == b"PK\x03\x04"  # torch.save writes a zip archive
    if is_zip_archive and not zipfile.is_zipfile(path):
        raise CorruptCheckpointError(
            f"{str(path)!r} is damaged: a torch.save archive without its zip directory, so it was cut short."
            f"{_earlier_hint(path)}"
        )
    if not is_zip_archive:
        data = path.read_bytes()
        try:
            found = pickle_globals(data)
        except Exception:
            found = set()
        detail = f" that would import {', '.join(sorted(found)[:5])}" if found else ""
        raise UnsafeCheckpointError(
            f"Refusing to load {str(path)!r}: it is not a torch.save archive but a raw or legacy pickle{detail}. "
            "Such files can run arbitrary code when loaded and are never read by hf_vanilla; if you did not "
            "write this file yourself, delete it."
        )
    with safe_globals():
        try:
            unsafe = torch.serialization.get_unsafe_globals_in_checkpoint(str(path))
        except Exception as err:  # a damaged archive: zip or pickle errors of several kinds
            raise CorruptCheckpointError(
                f"{str(path)!r} is damaged: it cannot be read as a torch.save archive ({err}).{_earlier_hint(path)}"
            ) from err
        if unsafe:
            raise UnsafeCheckpointError(_unsafe_globals_message(path, unsafe))
        if check_contents:
            try:
                torch.load(str(path), map_location="cpu", weights_only=True, mmap=True)
            except Exception as err:  # torch raises RuntimeError/UnpicklingError/EOFError on damage
                raise CorruptCheckpointError(
                    f"{str(path)!r} is damaged: torch.load(weights_only=True) fails with "
                    f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}.{_earlier_hint(path)}"
                ) from err


# --------------------------------------------------------------------------------------------------
# checksums
# --------------------------------------------------------------------------------------------------
def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _files_under(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.name != CHECKSUMS_NAME)


def write_checksums(folder: str | Path) -> Path:
    """Write ``checksums.sha256`` (``sha256sum`` format) for every file under ``folder``; returns its path.

    Truncation is caught without it, but bytes damaged in place (a bad disk, a partial copy that kept
    the size) are only caught by a checksum.
    """
    folder = Path(folder)
    lines = [f"{_sha256(p)}  {p.relative_to(folder).as_posix()}\n" for p in _files_under(folder)]
    target = folder / CHECKSUMS_NAME
    temporary = folder / f".{CHECKSUMS_NAME}.{uuid.uuid4().hex}"
    temporary.write_text("".join(lines), encoding="utf-8")
    os.replace(temporary, target)
    return target


def verify_checksums(folder: str | Path) -> bool:
    """Check the files of ``folder`` against its ``checksums.sha256``; ``False`` if it has no manifest.

    Raises :class:`CorruptCheckpointError` naming the first file that is missing or differs.
    """
    folder = Path(folder)
    manifest = folder / CHECKSUMS_NAME
    if not manifest.is_file():
        return False
    for number, line in enumerate(manifest.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        digest, sep, name = line.partition("  ")
        if not sep or len(digest) != 64:
            raise CorruptCheckpointError(f"{str(manifest)!r} line {number} is damaged: {line!r}.")
        path = folder / name
        if not path.is_file():
            raise CorruptCheckpointError(f"{str(path)!r} is listed in {CHECKSUMS_NAME} but missing.")
        if _sha256(path) != digest:
            raise CorruptCheckpointError(
                f"{str(path)!r} is damaged: its sha256 differs from the one recorded in {CHECKSUMS_NAME} when the "
                f"checkpoint was saved.{_earlier_hint(path)}"
            )
    return True


# --------------------------------------------------------------------------------------------------
# whole-folder checks
# --------------------------------------------------------------------------------------------------
def _check_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CorruptCheckpointError(f"{str(path)!r} is damaged: {err}.{_earlier_hint(path)}") from err


def verify_model_folder(folder: str | Path, *, checksums: bool = True) -> None:
    """Check a ``save_pretrained`` folder before ``from_pretrained`` reads it.

    ``config.json`` must parse; the weights must be ``model.safetensors`` or a safetensors index with
    all its shards, each whole (:func:`verify_safetensors_file`); pickled weights
    (``pytorch_model*.bin``), when there are no safetensors, must be plain tensors. With
    ``checksums``, a ``checksums.sha256`` manifest is checked too.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"Model folder {str(folder)!r} does not exist.")
    if not (folder / "config.json").is_file():
        raise CorruptCheckpointError(f"{str(folder)!r} has no config.json: it is not a saved model folder.")
    _check_json(folder / "config.json")
    single, index = folder / "model.safetensors", folder / "model.safetensors.index.json"
    if single.exists():
        verify_safetensors_file(single)
    elif index.exists():
        weight_map = _check_json(index).get("weight_map")
        if not isinstance(weight_map, dict):
            raise CorruptCheckpointError(f"{str(index)!r} is damaged: it has no weight_map.")
        for shard in sorted(set(weight_map.values())):
            verify_safetensors_file(folder / shard)
    else:
        pickled = sorted(folder.glob("pytorch_model*.bin"))
        if not pickled:
            raise CorruptCheckpointError(
                f"{str(folder)!r} holds no weights (no model.safetensors, index or pytorch_model.bin)."
                f"{_earlier_hint(single)}"
            )
        for path in pickled:
            verify_pickle_file(path)
    if checksums:
        verify_checksums(folder)


def _step_of(path: Path) -> int | None:
    prefix = f"{PREFIX_CHECKPOINT_DIR}-"
    if path.name.startswith(prefix) and path.name[len(prefix) :].isdigit():
        return int(path.name[len(prefix) :])
    return None


def verify_checkpoint(
    folder: str | Path,
    *,
    trusted_patterns: Iterable[str] = (),
    checksums: bool = True,
) -> None:
    """Check a Trainer ``checkpoint-<step>`` folder before resuming from it (nothing is unpickled).

    * ``trainer_state.json`` exists (the Trainer writes it last) and its ``global_step`` is the step
      in the folder's name;
    * the model weights are whole (:func:`verify_model_folder`) — or, for a sharded FSDP checkpoint,
      its ``.metadata`` is plain data;
    * every pickled file (``optimizer.pt``, ``scheduler.pt``, ``rng_state*.pth``, ``scaler.pt``, ...)
      holds plain tensor data only (:func:`verify_pickle_file`); ``training_args.bin`` is skipped (it is
      never read) as are files matching ``trusted_patterns`` (globs relative to the folder, e.g.
      DeepSpeed's ``global_step*/*``, which DeepSpeed itself loads with full unpickling);
    * the ``checksums.sha256`` manifest, if any, matches.

    Raises :class:`CorruptCheckpointError` or :class:`UnsafeCheckpointError` naming the file.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"Checkpoint folder {str(folder)!r} does not exist.")
    state_path = folder / TRAINER_STATE_NAME
    if not state_path.is_file():
        raise CorruptCheckpointError(
            f"{str(folder)!r} is incomplete: it has no {TRAINER_STATE_NAME}, which the Trainer writes last. The "
            f"run was probably killed while saving it.{_earlier_hint(state_path)}"
        )
    state = _check_json(state_path)
    step = _step_of(folder)
    if step is not None and isinstance(state, dict) and state.get("global_step") != step:
        raise CorruptCheckpointError(
            f"{str(state_path)!r} records global_step {state.get('global_step')!r}, but the folder is named for "
            f"step {step}: the folder mixes files of two saves.{_earlier_hint(state_path)}"
        )
    trusted = {p for pattern in trusted_patterns for p in folder.glob(pattern)}
    has_weights = any(
        (folder / name).exists()
        for name in ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
    )
    if has_weights:
        verify_model_folder(folder, checksums=False)
    elif not any(p.is_dir() for p in folder.glob("pytorch_model_fsdp*")) and not trusted:
        raise CorruptCheckpointError(
            f"{str(folder)!r} has no model weights (model.safetensors).{_earlier_hint(state_path)}"
        )
    for path in sorted(folder.rglob("*")):
        if not path.is_file() or path in trusted or path.name in UNREAD_PICKLES:
            continue
        if path.suffix in PICKLE_SUFFIXES or path.name == ".metadata":
            verify_pickle_file(path)
    if checksums:
        verify_checksums(folder)


def find_complete_checkpoints(run_dir: str | Path, **verify_kwargs: Any) -> list[Path]:
    """The ``checkpoint-<step>`` folders of ``run_dir`` that pass :func:`verify_checkpoint`, oldest
    first; damaged ones are skipped with a warning saying why."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return []
    candidates = sorted(
        (p for p in run_dir.iterdir() if p.is_dir() and _step_of(p) is not None), key=_step_of
    )
    good = []
    for path in candidates:
        try:
            verify_checkpoint(path, **verify_kwargs)
        except CheckpointError as err:
            logger.warning("Skipping checkpoint %s: %s", path, err)
        else:
            good.append(path)
    return good


def last_complete_checkpoint(run_dir: str | Path, **verify_kwargs: Any) -> Path | None:
    """The newest whole checkpoint of ``run_dir`` (``None`` if there is none), checking newest first.

    Use it instead of ``get_last_checkpoint``, which returns the newest folder even when a kill
    during saving left it half-written.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return None
    candidates = sorted(
        (p for p in run_dir.iterdir() if p.is_dir() and _step_of(p) is not None), key=_step_of, reverse=True
    )
    for path in candidates:
        try:
            verify_checkpoint(path, **verify_kwargs)
        except CheckpointError as err:
            logger.warning("Skipping checkpoint %s: %s", path, err)
        else:
            return path
    return None


def load_pretrained_checked(
    folder: str | Path, model_class: Any = AutoModelForSeq2SeqLM, **kwargs: Any
) -> PreTrainedModel:
    """``model_class.from_pretrained(folder, **kwargs)`` after :func:`verify_model_folder`, so that a
    damaged or unsafe folder gives an error naming the file."""
    verify_model_folder(folder)
    return model_class.from_pretrained(str(folder), **kwargs)


# --------------------------------------------------------------------------------------------------
# write, then rename
# --------------------------------------------------------------------------------------------------
def publish_directory(staged: str | Path, final: str | Path) -> Path:
    """Move the complete folder ``staged`` to ``final`` (same file system), replacing an old ``final``.

    ``final`` is at every moment either the old complete folder, absent (between two renames), or
    the new complete folder — never a mixture. Returns ``final``.
    """
    staged, final = Path(staged), Path(final)
    old = None
    if final.exists():
        old = final.with_name(f".{final.name}.old-{uuid.uuid4().hex[:8]}")
        os.replace(final, old)
    os.replace(staged, final)
    if old is not None:
        shutil.rmtree(old)
    _fsync_dir(final.parent)
    return final


def refuse_to_replace(path: str | Path, overwrite: bool, what: str = "The output") -> None:
    """Raise ``FileExistsError`` if ``path`` exists (an empty folder does not count) and not ``overwrite``.

    Commands call it before doing any work, so a refused run changes nothing and costs nothing.
    """
    path = Path(path)
    if overwrite or not path.exists() or (path.is_dir() and not any(path.iterdir())):
        return
    kind = "folder" if path.is_dir() else "file"
    raise FileExistsError(
        f"{what} {str(path)!r} already exists (a {kind}); nothing was changed. Choose another path, or pass "
        "--overwrite to replace it."
    )


@contextlib.contextmanager
def atomic_file(final: str | Path, binary: bool = False) -> Iterator[TextIO | BinaryIO]:
    """A file (UTF-8 text, or bytes with ``binary``) written under a temporary name beside ``final``
    and renamed to ``final`` only if the block succeeds: ``final`` is the old file (or absent) until
    the new one is complete."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    staged = final.with_name(f".{final.name}.tmp-{uuid.uuid4().hex[:8]}")
    try:
        with staged.open("wb") if binary else staged.open("w", encoding="utf-8") as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(staged, final)
    finally:
        staged.unlink(missing_ok=True)


def _fsync_dir(path: Path) -> None:
    if hasattr(os, "O_DIRECTORY"):
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@contextlib.contextmanager
def atomic_directory(final: str | Path, *, checksums: bool = False) -> Iterator[Path]:
    """Write a folder under a temporary name and rename it to ``final`` only if the block succeeds.

    ``with atomic_directory(out) as tmp: model.save_pretrained(tmp)`` leaves ``out`` untouched (old
    contents, or absent) if saving fails or the process dies; on success ``out`` holds exactly what
    was written to ``tmp`` (plus ``checksums.sha256`` with ``checksums=True``).
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    staged = final.with_name(f".{final.name}.tmp-{uuid.uuid4().hex[:8]}")
    staged.mkdir()
    try:
        yield staged
        if checksums:
            write_checksums(staged)
        publish_directory(staged, final)
    finally:
        if staged.exists():
            shutil.rmtree(staged)


def save_pretrained_atomic(folder: str | Path, *objects: Any, checksums: bool = False, **kwargs: Any) -> Path:
    """``obj.save_pretrained(folder, **kwargs)`` for each object (model, tokenizer, generation config)
    into a temporary folder renamed to ``folder`` when all are written (:func:`atomic_directory`)."""
    if not objects:
        raise ValueError(
            "Nothing to save: pass a model (and optionally a tokenizer) to save_pretrained_atomic."
        )
    with atomic_directory(folder, checksums=checksums) as staged:
        for obj in objects:
            obj.save_pretrained(staged, **kwargs)
    return Path(folder)


# --------------------------------------------------------------------------------------------------
# tied weights in gathered state dicts (FSDP, DeepSpeed ZeRO-3)
# --------------------------------------------------------------------------------------------------
def tie_state_dict(model: torch.nn.Module, state_dict: dict[str, Any]) -> dict[str, Any]:
    """``state_dict`` with each tied weight (``model.all_tied_weights_keys``, e.g. §3.4's
    ``lm_head.weight`` → ``model.shared.weight``) made the *same* tensor as its source again.

    A state dict gathered from shards (FSDP's full state dict, DeepSpeed ZeRO-3's consolidated one)
    holds a separate copy for every name of a shared parameter, so ``save_pretrained`` — which finds
    tied weights by storage — would write the shared matrix four times. Re-tied, it writes it once,
    as an unsharded save does. A pair whose values differ is left alone (the model is not tied).
    """
    tied = dict(state_dict)
    for target, source in getattr(model, "all_tied_weights_keys", {}).items():
        if target in tied and source in tied and torch.equal(tied[target], tied[source]):
            tied[target] = tied[source]
    return tied


def load_full_state_dict_into_sharded(model: torch.nn.Module, path: str | Path) -> None:
    """Load a consolidated ``model.safetensors`` into an FSDP2-sharded ``model`` (every process
    calls it): the main process reads the file, and each tensor is scattered from it
    (``distribute_tensor(..., src_data_rank=0)``) into the parameter's own placement; unsharded
    tensors are broadcast.

    A shared parameter (§3.4's embedding / pre-softmax matrix) is loaded once, under the name the
    model's state dict lists first. torch 2.13's ``set_model_state_dict(full_state_dict=True,
    broadcast_from_rank0=True)`` fails on the other names (a ``KeyError``, or a copy that mixes
    ``Tensor`` and ``DTensor``), which is why the Trainer's own FSDP resume breaks for this model.
    """
    from safetensors.torch import load_file
    from torch.distributed.tensor import DTensor, distribute_tensor

    main = torch.distributed.get_rank() == 0
    if main:
        verify_safetensors_file(path)
    saved = load_file(str(path)) if main else {}
    aliases = {target: source for target, source in getattr(model, "all_tied_weights_keys", {}).items()}
    with torch.no_grad():
        for name, value in model.state_dict().items():
            if name in aliases:
                continue  # the same parameter as its source, loaded under the source's name
            local = value.to_local() if isinstance(value, DTensor) else value
            if main:
                if name not in saved:
                    raise CorruptCheckpointError(
                        f"{str(path)!r} has no tensor {name!r}.{_earlier_hint(Path(path))}"
                    )
                full = saved[name].to(device=local.device, dtype=value.dtype)
            else:
                full = torch.empty(value.shape, dtype=value.dtype, device=local.device)
            if isinstance(value, DTensor):
                value.copy_(distribute_tensor(full, value.device_mesh, value.placements, src_data_rank=0))
            else:
                torch.distributed.broadcast(full, src=0)
                value.copy_(full)


# --------------------------------------------------------------------------------------------------
# Trainer integration
# --------------------------------------------------------------------------------------------------
class ResilientTrainerMixin:
    """A ``Trainer`` mixin (put it first among the bases): checkpoints written, then renamed; checks
    before resuming; ``resume_from_checkpoint=True`` means the newest *whole* checkpoint.

    * ``checkpoint-<step>`` is written by all processes into ``<output_dir>/.incomplete-checkpoints/``;
      after a barrier the saving process adds ``checksums.sha256`` (``checkpoint_checksums``), renames
      the folder into ``output_dir`` (replacing a stale one of the same step left by an earlier,
      killed run) and only then deletes old checkpoints (``save_total_limit``).
    * ``save_model()`` into a folder (the final model) writes to a temporary folder and moves each
      file into place with an atomic ``os.replace``.
    * ``train(resume_from_checkpoint=...)`` runs :func:`verify_checkpoint` first, so a damaged or
      unsafe checkpoint fails at once with the file's name; ``True`` picks
      :func:`last_complete_checkpoint`. DeepSpeed's own files (``global_step*/``) are trusted, with
      a warning: DeepSpeed loads them with full unpickling.

    With ``push_to_hub`` the Trainer uploads from the checkpoint folder in the background, so
    checkpoints are then written in place, as the plain Trainer does.
    """

    checkpoint_checksums: bool = True
    _staging_run_dir: str | None = None

    def _trusted_patterns(self) -> tuple[str, ...]:
        if getattr(self, "is_deepspeed_enabled", False):
            logger.warning(
                "DeepSpeed checkpoint files (global_step*/) are loaded by DeepSpeed with full unpickling and "
                "are not checked; resume only from DeepSpeed checkpoints you wrote yourself."
            )
            return ("global_step*/*",)
        return ()

    def _get_output_dir(self, trial: Any) -> str:
        if self._staging_run_dir is not None:
            return self._staging_run_dir
        return super()._get_output_dir(trial)  # type: ignore[misc]

    def _save_checkpoint(self, model: torch.nn.Module, trial: Any) -> None:
        args = self.args  # type: ignore[attr-defined]
        if args.push_to_hub:
            super()._save_checkpoint(model, trial)  # type: ignore[misc]
            return
        state = self.state  # type: ignore[attr-defined]
        accelerator = self.accelerator  # type: ignore[attr-defined]
        run_dir = Path(super()._get_output_dir(trial))  # type: ignore[misc]
        name = f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"
        staging_root = run_dir / STAGING_DIR_NAME
        staged, final = staging_root / name, run_dir / name
        if args.should_save:
            if staged.exists():
                shutil.rmtree(staged)  # left by a run killed while saving this step
            staging_root.mkdir(parents=True, exist_ok=True)
        accelerator.wait_for_everyone()
        self._staging_run_dir = str(staging_root)
        try:
            super()._save_checkpoint(model, trial)  # type: ignore[misc]
        finally:
            self._staging_run_dir = None
        accelerator.wait_for_everyone()
        if args.should_save:
            best = state.best_model_checkpoint
            if best is not None and Path(best).parent == staging_root:
                state.best_model_checkpoint = str(run_dir / Path(best).name)
                state.save_to_json(str(staged / TRAINER_STATE_NAME))
            if self.checkpoint_checksums:
                write_checksums(staged)
            publish_directory(staged, final)
            with contextlib.suppress(OSError):  # not empty: another save is staged; left for later
                staging_root.rmdir()
            rotate_checkpoints(
                output_dir=str(run_dir),
                save_total_limit=args.save_total_limit,
                best_model_checkpoint=state.best_model_checkpoint,
                use_mtime=True,
            )
        accelerator.wait_for_everyone()

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        args = self.args  # type: ignore[attr-defined]
        if _internal_call or args.push_to_hub:  # a checkpoint (staged whole), or uploaded from output_dir
            super().save_model(output_dir, _internal_call=_internal_call)  # type: ignore[misc]
            return
        target = Path(output_dir if output_dir is not None else args.output_dir)
        staged = target / f".save-{self.state.global_step}.tmp"  # type: ignore[attr-defined]
        if args.should_save and staged.exists():
            shutil.rmtree(staged)
        self.accelerator.wait_for_everyone()  # type: ignore[attr-defined]
        super().save_model(str(staged), _internal_call=False)  # type: ignore[misc]
        self.accelerator.wait_for_everyone()  # type: ignore[attr-defined]
        if args.should_save:
            for path in sorted(staged.rglob("*"), key=lambda p: len(p.parts), reverse=True):
                if path.is_file():
                    destination = target / path.relative_to(staged)
                    destination.parent.mkdir(parents=True, exist_ok=True)
                    os.replace(path, destination)  # each file replaced whole, never half-written
            shutil.rmtree(staged)
        self.accelerator.wait_for_everyone()  # type: ignore[attr-defined]

    def _save(self, output_dir: str | None = None, state_dict: dict[str, Any] | None = None) -> None:
        if state_dict is not None:  # gathered from shards: one copy per name of the shared matrix
            model = self.accelerator.unwrap_model(self.model)  # type: ignore[attr-defined]
            state_dict = tie_state_dict(model, state_dict)
        super()._save(output_dir, state_dict=state_dict)  # type: ignore[misc]

    def _fsdp2_full_state_dict(self) -> bool:
        accelerator = self.accelerator  # type: ignore[attr-defined]
        return (
            getattr(self, "is_fsdp_enabled", False)
            and accelerator.is_fsdp2
            and "FULL_STATE_DICT" in str(accelerator.state.fsdp_plugin.state_dict_type)
        )

    def _load_from_checkpoint(
        self, resume_from_checkpoint: str, model: torch.nn.Module | None = None
    ) -> None:
        """Under FSDP2 with ``FULL_STATE_DICT``, the weights are read from the checkpoint's
        ``model.safetensors`` (:func:`load_full_state_dict_into_sharded`) instead of the pickled
        ``pytorch_model_fsdp.bin``; the optimizer state is loaded by the Trainer as usual."""
        if not self._fsdp2_full_state_dict():
            super()._load_from_checkpoint(resume_from_checkpoint, model)  # type: ignore[misc]
            return
        logger.info("Loading the sharded model from %s/model.safetensors", resume_from_checkpoint)
        target = model if model is not None else self.model  # type: ignore[attr-defined]
        load_full_state_dict_into_sharded(target, Path(resume_from_checkpoint) / "model.safetensors")

    def train(self, resume_from_checkpoint: str | bool | None = None, *args: Any, **kwargs: Any) -> Any:
        output_dir = self.args.output_dir  # type: ignore[attr-defined]
        if resume_from_checkpoint is True:
            found = last_complete_checkpoint(output_dir, trusted_patterns=self._trusted_patterns())
            if found is None:
                raise FileNotFoundError(
                    f"resume_from_checkpoint=True, but {str(output_dir)!r} has no whole checkpoint-<step> folder. "
                    "Start afresh, or give a checkpoint folder."
                )
            resume_from_checkpoint = str(found)
        elif isinstance(resume_from_checkpoint, str | os.PathLike):
            verify_checkpoint(resume_from_checkpoint, trusted_patterns=self._trusted_patterns())
        return super().train(resume_from_checkpoint, *args, **kwargs)  # type: ignore[misc]


def _agree_across_processes(flag: bool) -> bool:
    """``True`` if ``flag`` is set on any process (one all-reduce; plain ``flag`` without distribution)."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return flag
    from accelerate import PartialState

    value = torch.tensor([1 if flag else 0], device=PartialState().device)
    torch.distributed.all_reduce(value, op=torch.distributed.ReduceOp.MAX)
    return bool(value.item())


class SaveOnSignalCallback(TrainerCallback):
    """On SIGTERM or SIGINT (Ctrl-C), finish the current optimizer step, save a checkpoint, and exit
    (preemption, §5.2's days-long runs on shared clusters; an interrupted run loses no steps).

    At every step end all processes agree (one all-reduce of a flag) whether any of them has received
    the signal, so they save the same step together. After the checkpoint is written the process exits
    with status ``128 + signal`` (143 for SIGTERM, 130 for SIGINT), which schedulers and shells read as
    "terminated by signal"; ``--resume_from_checkpoint last`` then continues the run. A second signal
    acts at once: the previous handlers are restored after the first (SIGTERM's default kills the
    process, Python's SIGINT handler raises ``KeyboardInterrupt``). A signal that arrives during
    evaluation or saving takes effect at the next step end. ``torchrun`` forwards SIGTERM to every
    worker and waits up to 30 s before SIGKILL, which bounds the time left to finish the step and save.
    """

    def __init__(
        self,
        signals: Iterable[int] = (signal.SIGTERM, signal.SIGINT),
        exit_fn: Callable[[int], None] | None = None,
    ) -> None:
        self.signals = tuple(signals)
        self.received: int | None = None
        self.stopped_at: int | None = None
        self._exit = exit_fn
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: Any) -> None:
        self.received = signum
        logger.warning(
            "Received %s: finishing this step, saving a checkpoint and stopping (send it again to stop at once).",
            signal.Signals(signum).name,
        )
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)  # a second signal acts at once

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if threading.current_thread() is not threading.main_thread():
            logger.warning("SaveOnSignalCallback: not in the main thread, so no signal handler is installed.")
            return
        for sig in self.signals:
            self._previous[sig] = signal.signal(sig, self._handle)

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if _agree_across_processes(self.received is not None):
            self.stopped_at = state.global_step
            control.should_save = True
            control.should_training_stop = True

    def on_save(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if self.stopped_at is None or self.stopped_at != state.global_step:
            return
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.barrier()  # nobody exits (and makes torchrun kill the rest) before all saved
        signum = self.received if self.received is not None else signal.SIGTERM
        logger.warning(
            "Saved checkpoint-%d after %s; exiting. Continue with --resume_from_checkpoint last.",
            state.global_step,
            signal.Signals(signum).name,
        )
        if self._exit is not None:
            self._exit(128 + signum)
            return
        raise SystemExit(128 + signum)

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous.clear()
