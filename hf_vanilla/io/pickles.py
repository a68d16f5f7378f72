"""Pickle files read without running them: their globals listed from the opcodes, only those
``torch.load(weights_only=True)`` and torch's distributed checkpoints need let through."""

from __future__ import annotations

import pickletools
import zipfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from transformers.trainer_pt_utils import safe_globals

from hf_vanilla.io.errors import CorruptCheckpointError, UnsafeCheckpointError, damaged_file_hint

__all__ = ["PICKLE_SUFFIXES", "pickle_globals", "verify_pickle_file"]

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
