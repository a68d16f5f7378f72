"""Loading safety: a checkpoint or model folder is checked before anything in it is loaded.

What this module guarantees, for every function that reads a folder:

* **Nothing is unpickled to check it.** Weights are read from safetensors; a pickled file
  (``optimizer.pt``, ``rng_state.pth``, ``pytorch_model.bin``, ...) is disassembled statically and
  passes only when it holds plain tensors, containers and numpy arrays —
  ``torch.load(weights_only=True)``'s allowlist, which the Trainer itself uses when it resumes. A file
  whose unpickling would import anything else (``os.system``, ``builtins.eval``, a user class) raises
  :class:`UnsafeCheckpointError`. ``training_args.bin`` is a full pickle of the arguments, written for
  reference and read by nothing; it is not checked and must never be ``torch.load``-ed with
  ``weights_only=False``.
* **A damaged file is named, not crashed on** (:func:`verify_model_folder`, :func:`verify_checkpoint`).
  A folder is whole when its ``config.json`` parses, every ``*.safetensors`` file is as long as its
  header says, a Trainer checkpoint's ``trainer_state.json`` (written last) names the folder's step, and
  a ``checksums.sha256`` manifest (:func:`write_checksums`), when present, matches. A failure raises
  :class:`CorruptCheckpointError` naming the file and what to do, instead of a stack trace from inside
  safetensors or pickle.
* **Checked loaders** (:func:`load_pretrained_checked`, the one every command uses) run these checks
  before ``from_pretrained``, then refuse weights that are not finite (:func:`verify_finite_weights`:
  a diverged run saves NaN, which translates into blank lines) and a ``config.json`` that disagrees
  with the weights (:func:`check_loading_info`: a missing, unexpected or mismatched key, which
  ``from_pretrained`` itself only reports while the model translates garbage). The Python API
  (``AutoModelForSeq2SeqLM.from_pretrained``) keeps transformers' behaviour.

Writing checkpoints so that they stay whole, and resuming from them, is
:mod:`hf_vanilla.durability`'s job.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import pickletools
import re
import struct
import uuid
import zipfile
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from transformers import AutoModelForSeq2SeqLM, PreTrainedModel
from transformers.trainer_pt_utils import safe_globals

__all__ = [
    "CHECKPOINT_PATTERN",
    "CHECKSUMS_NAME",
    "PICKLE_SUFFIXES",
    "CheckpointError",
    "ConfigMismatchError",
    "CorruptCheckpointError",
    "NonFiniteWeightsError",
    "UnsafeCheckpointError",
    "check_loading_info",
    "checkpoint_step",
    "damaged_file_hint",
    "load_pretrained_checked",
    "nonfinite_tensors",
    "pickle_globals",
    "refuse_nonfinite",
    "verify_checkpoint",
    "verify_checksums",
    "verify_finite_weights",
    "verify_model_folder",
    "verify_pickle_file",
    "verify_safetensors_file",
    "weights_fingerprint",
    "write_checksums",
]

#: Trainer checkpoint folders: ``checkpoint-<global step>``.
CHECKPOINT_PATTERN = re.compile(r"^checkpoint-(\d+)$")
#: sha256 manifest written into each checkpoint (``sha256sum -c checksums.sha256`` checks it too).
CHECKSUMS_NAME = "checksums.sha256"
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


class NonFiniteWeightsError(CheckpointError):
    """Weights hold NaN or infinity (a diverged run): the model would translate into blank lines."""


class ConfigMismatchError(CheckpointError):
    """``config.json`` describes another model than the weights hold (keys missing, unexpected or of
    another shape)."""


def damaged_file_hint(path: Path) -> str:
    return (
        " The file was probably cut short when a run was killed while saving, or damaged on disk. Resume "
        "from an earlier checkpoint (hf_vanilla.durability.last_complete_checkpoint finds the newest whole "
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
        raise CorruptCheckpointError(f"{str(path)!r} is missing.{damaged_file_hint(path)}")
    size = path.stat().st_size
    with path.open("rb") as handle:
        prefix = handle.read(8)
        if len(prefix) < 8:
            raise CorruptCheckpointError(
                f"{str(path)!r} is not a safetensors file: only {size} bytes long.{damaged_file_hint(path)}"
            )
        (header_len,) = struct.unpack("<Q", prefix)
        if header_len > min(_SAFETENSORS_MAX_HEADER, size - 8):
            raise CorruptCheckpointError(
                f"{str(path)!r} is damaged: its header claims {header_len} bytes but the file has {size} bytes "
                f"in all.{damaged_file_hint(path)}"
            )
        raw_header = handle.read(header_len)
    try:
        header = json.loads(raw_header)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CorruptCheckpointError(
            f"{str(path)!r} is damaged: its header is not valid JSON ({err}).{damaged_file_hint(path)}"
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
                f"{damaged_file_hint(path)}"
            ) from err
        if not 0 <= start <= end or (info["dtype"] in _SAFETENSORS_DTYPE_BYTES and end - start != expected):
            raise CorruptCheckpointError(
                f"{str(path)!r} is damaged: tensor {name!r} has byte range {start}..{end}, which does not fit "
                f"its dtype {info['dtype']} and shape {info['shape']}.{damaged_file_hint(path)}"
            )
        end_max = max(end_max, end)
    if end_max != data_len:
        what = "truncated" if end_max > data_len else "longer than its header says"
        raise CorruptCheckpointError(
            f"{str(path)!r} is {what}: the header describes {end_max} bytes of tensor data, the file holds "
            f"{data_len}.{damaged_file_hint(path)}"
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
        raise CorruptCheckpointError(f"{str(path)!r} is missing.{damaged_file_hint(path)}")
    if path.name == ".metadata":
        try:
            found = pickle_globals(path.read_bytes())
        except Exception as err:  # pickletools raises ValueError and others on damaged data
            raise CorruptCheckpointError(
                f"{str(path)!r} is not a complete pickle ({err}).{damaged_file_hint(path)}"
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
            f"{damaged_file_hint(path)}"
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
                f"{str(path)!r} is damaged: it cannot be read as a torch.save archive ({err}).{damaged_file_hint(path)}"
            ) from err
        if unsafe:
            raise UnsafeCheckpointError(_unsafe_globals_message(path, unsafe))
        if check_contents:
            try:
                torch.load(str(path), map_location="cpu", weights_only=True, mmap=True)
            except Exception as err:  # torch raises RuntimeError/UnpicklingError/EOFError on damage
                raise CorruptCheckpointError(
                    f"{str(path)!r} is damaged: torch.load(weights_only=True) fails with "
                    f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}.{damaged_file_hint(path)}"
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


def weights_fingerprint(folder: str | Path) -> str | None:
    """A sha256 over the weights files of a local model folder (``model*.safetensors``, else
    ``pytorch_model*.bin``: their names and contents, sorted by name), which identifies the weights
    wherever the folder is copied; ``None`` for a name that is not a local folder or a folder without
    weights. Evaluation results record it so that publishing can check which model they scored."""
    folder = Path(folder)
    if not folder.is_dir():
        return None
    weights = sorted(folder.glob("model*.safetensors")) or sorted(folder.glob("pytorch_model*.bin"))
    if not weights:
        return None
    digest = hashlib.sha256()
    for path in weights:
        digest.update(f"{_sha256(path)}  {path.name}\n".encode())
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
                f"checkpoint was saved.{damaged_file_hint(path)}"
            )
    return True


# --------------------------------------------------------------------------------------------------
# whole-folder checks
# --------------------------------------------------------------------------------------------------
def _check_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CorruptCheckpointError(f"{str(path)!r} is damaged: {err}.{damaged_file_hint(path)}") from err


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
                f"{damaged_file_hint(single)}"
            )
        for path in pickled:
            verify_pickle_file(path)
    if checksums:
        verify_checksums(folder)


def checkpoint_step(path: str | Path) -> int | None:
    """The step number of a ``checkpoint-<step>`` folder name, or ``None`` for other names."""
    match = CHECKPOINT_PATTERN.match(Path(path).name)
    return int(match.group(1)) if match else None


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
            f"run was probably killed while saving it.{damaged_file_hint(state_path)}"
        )
    state = _check_json(state_path)
    step = checkpoint_step(folder)
    if step is not None and isinstance(state, dict) and state.get("global_step") != step:
        raise CorruptCheckpointError(
            f"{str(state_path)!r} records global_step {state.get('global_step')!r}, but the folder is named for "
            f"step {step}: the folder mixes files of two saves.{damaged_file_hint(state_path)}"
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
            f"{str(folder)!r} has no model weights (model.safetensors).{damaged_file_hint(state_path)}"
        )
    for path in sorted(folder.rglob("*")):
        if not path.is_file() or path in trusted or path.name in UNREAD_PICKLES:
            continue
        if path.suffix in PICKLE_SUFFIXES or path.name == ".metadata":
            verify_pickle_file(path)
    if checksums:
        verify_checksums(folder)


# --------------------------------------------------------------------------------------------------
# non-finite weights
# --------------------------------------------------------------------------------------------------
def nonfinite_tensors(tensors: Iterable[tuple[str, torch.Tensor]]) -> list[str]:
    """The names of the floating-point tensors among ``tensors`` that hold a NaN or an infinity."""
    return [
        name for name, tensor in tensors if tensor.is_floating_point() and not torch.isfinite(tensor).all()
    ]


def refuse_nonfinite(folder: str | Path, names: Sequence[str]) -> None:
    """Raise :class:`NonFiniteWeightsError` naming ``folder`` and the first of ``names``, if any."""
    if not names:
        return
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    raise NonFiniteWeightsError(
        f"{str(folder)!r} holds weights that are not finite numbers (NaN or inf) in {len(names)} tensor(s): "
        f"{shown}. The training run diverged before it saved them (or the file is damaged); such a model "
        "translates into blank or garbage lines. Use an earlier checkpoint of the run, or train again with a "
        "lower --learning_rate."
    )


def _weight_files(folder: Path) -> list[Path]:
    single, index = folder / "model.safetensors", folder / "model.safetensors.index.json"
    if single.exists():
        return [single]
    if index.exists():
        return [folder / shard for shard in sorted(set(_check_json(index)["weight_map"].values()))]
    return sorted(folder.glob("pytorch_model*.bin"))


def verify_finite_weights(folder: str | Path) -> None:
    """Refuse a model folder whose weights hold NaN or infinity (:class:`NonFiniteWeightsError`, naming
    the first tensors as the files name them). Reads every tensor once; run it after
    :func:`verify_model_folder` (pickled weights are read with ``weights_only=True``)."""
    folder = Path(folder)
    bad: list[str] = []
    for path in _weight_files(folder):
        if path.suffix == ".safetensors":
            with safe_open(str(path), framework="pt", device="cpu") as handle:
                bad += nonfinite_tensors((key, handle.get_tensor(key)) for key in handle.keys())  # noqa: SIM118
        else:
            state = torch.load(str(path), map_location="cpu", weights_only=True, mmap=True)
            bad += nonfinite_tensors(state.items())
    refuse_nonfinite(folder, bad)


# --------------------------------------------------------------------------------------------------
# loading
# --------------------------------------------------------------------------------------------------
def check_loading_info(name: str | Path, info: dict[str, Any]) -> None:
    """Refuse what ``from_pretrained(..., output_loading_info=True)`` reports: weights the model lacks
    (MISSING: left at random initialisation), weights it has no place for (UNEXPECTED: dropped) or of
    another shape (MISMATCHED). Tied weights (the shared ``lm_head``) and non-persistent buffers are not
    saved and not reported. Raises :class:`ConfigMismatchError` naming the keys."""
    problems = []
    for kind, keys in (
        ("missing from the weights", sorted(info.get("missing_keys", ()))),
        ("in the weights but not in the model", sorted(info.get("unexpected_keys", ()))),
        (
            "of another shape in the weights than in the model",
            sorted(
                f"{key} ({tuple(saved)} vs {tuple(model)})"
                for key, saved, model in info.get("mismatched_keys", ())
            ),
        ),
    ):
        if keys:
            shown = ", ".join(keys[:3]) + (f" and {len(keys) - 3} more" if len(keys) > 3 else "")
            problems.append(f"{len(keys)} key(s) {kind}: {shown}")
    if problems:
        raise ConfigMismatchError(
            f"{str(name)!r}: its config.json disagrees with its weights ({'; '.join(problems)}). The config was "
            "edited or comes from another model (e.g. tie_word_embeddings, *_layers, d_model): restore the "
            "config.json saved with these weights."
        )


class _DropLoadReport(logging.Filter):
    """Drops transformers' multi-line LOAD REPORT: :func:`check_loading_info` says it in one line."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "LOAD REPORT" not in str(record.msg)


@contextlib.contextmanager
def _without_load_report() -> Iterator[None]:
    report_logger = logging.getLogger("transformers.modeling_utils")
    drop = _DropLoadReport()
    report_logger.addFilter(drop)
    try:
        yield
    finally:
        report_logger.removeFilter(drop)


def load_pretrained_checked(
    name: str | Path, model_class: Any = AutoModelForSeq2SeqLM, **kwargs: Any
) -> PreTrainedModel:
    """``model_class.from_pretrained(name, **kwargs)`` as every command loads a model: a local folder is
    checked first (:func:`verify_model_folder`: a damaged or unsafe file; :func:`verify_finite_weights`:
    NaN or inf weights), and any missing, unexpected or mismatched key is refused
    (:func:`check_loading_info`) rather than reported while the model computes garbage. Raises a
    :class:`CheckpointError` (a ``ValueError``) naming the folder."""
    if Path(name).is_dir():
        verify_model_folder(name)
        verify_finite_weights(name)
    with _without_load_report():
        model, info = model_class.from_pretrained(
            str(name), output_loading_info=True, ignore_mismatched_sizes=True, **kwargs
        )
    check_loading_info(name, info)
    return model
