"""SHA-256 checksums of a saved folder (``checksums.sha256``), written and verified."""

from __future__ import annotations

import fnmatch
import hashlib
import os
import uuid
from collections.abc import Iterable, Sequence
from pathlib import Path

from hf_vanilla.io.errors import CorruptCheckpointError, restore_hint

__all__ = [
    "CHECKSUMS_NAME",
    "copy_hashing",
    "file_sha256",
    "fingerprint_of_digests",
    "verify_checksums",
    "weights_fingerprint",
    "write_checksums",
]

#: sha256 manifest written into each checkpoint (``sha256sum -c checksums.sha256`` checks it too).
CHECKSUMS_NAME = "checksums.sha256"


# --------------------------------------------------------------------------------------------------
# checksums
# --------------------------------------------------------------------------------------------------
def file_sha256(path: Path) -> str:
    """The SHA-256 of the file ``path``, read block by block."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def copy_hashing(source: Path, target: Path) -> str:
    """Copy ``source`` to ``target`` block by block and return the sha256 of the bytes written: the
    digest is that of ``target``'s content even if ``source`` changes meanwhile."""
    digest = hashlib.sha256()
    with source.open("rb") as reader, target.open("wb") as writer:
        for block in iter(lambda: reader.read(1 << 20), b""):
            digest.update(block)
            writer.write(block)
    return digest.hexdigest()


def fingerprint_of_digests(digests: dict[str, str]) -> str:
    """The weights fingerprint (:func:`weights_fingerprint`) of files given by name and sha256."""
    digest = hashlib.sha256()
    for name in sorted(digests):
        digest.update(f"{digests[name]}  {name}\n".encode())
    return digest.hexdigest()


def weights_fingerprint(folder: str | Path) -> str | None:
    """A sha256 over the weights files of a local model folder (``model*.safetensors``, else
    ``pytorch_model*.bin``: their names and contents, sorted by name), which identifies the weights
    wherever the folder is copied; ``None`` for a name that is not a local folder or a folder without
    weights. Evaluation results record it so that publishing can check which model they scored; a loaded
    model carries the one of the bytes it was built from
    (:func:`hf_vanilla.io.checked_loading.loaded_weights_fingerprint`)."""
    folder = Path(folder)
    if not folder.is_dir():
        return None
    weights = sorted(folder.glob("model*.safetensors")) or sorted(folder.glob("pytorch_model*.bin"))
    if not weights:
        return None
    return fingerprint_of_digests({path.name: file_sha256(path) for path in weights})


def _files_under(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.name != CHECKSUMS_NAME)


def write_checksums(folder: str | Path, files: Iterable[Path] | None = None) -> Path:
    """Write ``checksums.sha256`` (``sha256sum`` format) for every file under ``folder`` (or for ``files``,
    paths inside it); returns its path.

    Truncation is caught without it, but bytes damaged in place (a bad disk, a partial copy that kept
    the size) are only caught by a checksum.
    """
    folder = Path(folder)
    listed = _files_under(folder) if files is None else sorted(files)
    lines = [f"{file_sha256(p)}  {p.relative_to(folder).as_posix()}\n" for p in listed]
    target = folder / CHECKSUMS_NAME
    temporary = folder / f".{CHECKSUMS_NAME}.{uuid.uuid4().hex}"
    temporary.write_text("".join(lines), encoding="utf-8")
    os.replace(temporary, target)
    return target


def verify_checksums(folder: str | Path, patterns: Sequence[str] | None = None) -> bool:
    """Check the files of ``folder`` against its ``checksums.sha256`` (only those whose names match one of
    ``patterns``, when given); ``False`` if it has no manifest.

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
        if patterns is not None and not any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns):
            continue
        path = folder / name
        if not path.is_file():
            raise CorruptCheckpointError(
                f"{str(path)!r} is listed in {CHECKSUMS_NAME} but missing.{restore_hint(path)}"
            )
        if file_sha256(path) != digest:
            raise CorruptCheckpointError(
                f"{str(path)!r} is damaged: its sha256 differs from the one recorded in {CHECKSUMS_NAME} when the "
                f"folder was saved.{restore_hint(path, saved_over=True)}"
            )
    return True
