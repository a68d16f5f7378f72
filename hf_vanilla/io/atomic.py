"""Atomic writes: a file or folder is written under a temporary name and renamed into place when
complete, and nothing that exists is replaced without ``overwrite``.

Without ``overwrite``, :func:`refuse_to_replace` checks an output before any work and records it as
new; the final rename of :func:`atomic_file` and :func:`publish_directory` (so :func:`atomic_directory`
and :func:`save_pretrained_atomic`) keeps that promise atomically: a file or folder that appeared at the
path while the command ran (another command writing the same output) is never replaced. The result is
then kept beside it under a new name, and :class:`OutputAppearedError` says where.

A write that fails for want of space (:func:`is_disk_full`) raises :class:`DiskFullError`, one message
naming the output and what was kept, after the partial temporary is removed: every writer here, and
the checkpoint writer of :mod:`hf_vanilla.training.resilience`, goes through :func:`full_disk_named`.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO, Literal, TextIO

from hf_vanilla.io.checksums import write_checksums

__all__ = [
    "OVERWRITE_HELP",
    "TEMPORARY_REMOVED",
    "DiskFullError",
    "OutputAppearedError",
    "atomic_directory",
    "atomic_file",
    "full_disk_named",
    "is_disk_full",
    "publish_directory",
    "refuse_to_replace",
    "save_pretrained_atomic",
]


# --------------------------------------------------------------------------------------------------
# write, then rename
# --------------------------------------------------------------------------------------------------
def publish_directory(staged: str | Path, final: str | Path) -> Path:
    """Move the complete folder ``staged`` to ``final`` (same file system), replacing an old ``final``.

    ``final`` is at every moment either the old complete folder, absent (between two renames), or
    the new complete folder — never a mixture. Only a folder is replaced: anything else at ``final``
    (a file, a symbolic link) raises ``FileExistsError`` and stays as it was. A ``final`` that
    :func:`refuse_to_replace` found new (no ``overwrite``) is not replaced unless it is an empty folder:
    :class:`OutputAppearedError`. Returns ``final``.
    """
    staged, final = Path(staged), Path(final)
    if _claimed(final):
        _publish_new(staged, final, os.rename)  # replaces an empty folder only, atomically
        _fsync_dir(final.parent)
        return final
    old = None
    if os.path.lexists(final):
        found = _kind_of(final)
        if found != "folder":
            raise FileExistsError(
                f"{str(final)!r} is a {found}, not a folder; it was left as it is and nothing was written. "
                "Choose another path, or move it away first."
            )
        old = final.with_name(f".{final.name}.old-{uuid.uuid4().hex[:8]}")
        os.replace(final, old)
    os.replace(staged, final)
    if old is not None:
        shutil.rmtree(old)
    _fsync_dir(final.parent)
    return final


def _kind_of(path: Path) -> str:
    """What ``path`` (which exists) is, in the words of the refusals."""
    if path.is_symlink():
        return "symbolic link"
    if path.is_dir():
        return "folder"
    return "file" if path.is_file() else "pipe or device"


#: Outputs that :func:`refuse_to_replace` found absent (or an empty folder) without ``overwrite``, by
#: absolute path, with what its messages call them; each is dropped when written.
_NEW_OUTPUTS: dict[Path, str] = {}


class OutputAppearedError(FileExistsError):
    """An output that was new when the command started exists when its result is ready; ``kept`` is
    where the result was put instead."""

    def __init__(self, what: str, final: Path, kept: Path) -> None:
        self.final, self.kept = final, kept
        super().__init__(
            f"{what} {str(final)!r} appeared while this command ran (another command wrote it?) and was left as "
            f"it is; this command's result was kept as {str(kept)!r}. Move one of them away, or run again "
            "with --overwrite to replace it."
        )


def _claimed(final: Path) -> bool:
    return final.absolute() in _NEW_OUTPUTS


def forget_new_outputs() -> None:
    """Forget which outputs :func:`refuse_to_replace` recorded as new (:func:`hf_vanilla.cli.run_cli`
    calls it when a command ends, so that commands run in one process do not share them)."""
    _NEW_OUTPUTS.clear()


def _link(staged: Path, final: Path) -> None:
    """Give the file ``staged`` the name ``final`` too, failing with ``FileExistsError`` if it exists."""
    try:
        os.link(staged, final)
    except OSError as err:  # a file system without hard links: check, then rename (a narrow window)
        if err.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.EMLINK, errno.ENOSYS):
            raise
        if os.path.lexists(final):
            raise FileExistsError(errno.EEXIST, "exists", str(final)) from None
        os.replace(staged, final)
        return
    staged.unlink()


def _publish_new(staged: Path, final: Path, move: Callable[[Path, Path], None]) -> None:
    """``move(staged, final)``, which must fail with ``OSError`` where ``final`` holds something; then
    keep ``staged`` under a new name beside ``final`` and raise :class:`OutputAppearedError`."""
    what = _NEW_OUTPUTS.pop(final.absolute())
    try:
        move(staged, final)
    except OSError as err:
        if err.errno not in (errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR, errno.EISDIR):
            raise
        kept = final.with_name(f"{final.name}.new-{uuid.uuid4().hex[:8]}")
        os.rename(staged, kept)
        raise OutputAppearedError(what, final, kept) from None


def refuse_to_replace(
    path: str | Path,
    overwrite: bool,
    what: str = "The output",
    *,
    kind: Literal["folder", "file"] = "folder",
    inputs: Iterable[str | Path | None] = (),
) -> None:
    """Check before any work that the command may write the output ``path`` (a ``kind``), or raise.

    Commands call it before doing any work, so a refused run changes nothing and costs nothing. It
    refuses, whatever ``overwrite`` says: a ``path`` that is or holds one of the command's ``inputs``
    (replacing it would delete the input; ``None``, ``"-"`` and paths that do not exist locally, such
    as Hub ids, are skipped), a folder that is or holds the current folder, an existing path of another kind (``--overwrite`` never replaces a file
    with a folder or the reverse, nor a symbolic link or a pipe), and a file name ending in ``/``.
    Without ``overwrite`` it raises ``FileExistsError`` if ``path`` exists (an empty folder does not
    count), and records ``path`` as new: the final rename of :func:`atomic_file` or
    :func:`publish_directory` will not replace what appears there meanwhile.
    """
    text = str(path)
    path = Path(path)
    if kind == "file" and text.endswith(("/", os.sep)):
        raise IsADirectoryError(
            f"{what} {text!r} ends with '/', so it names a folder, and a file is written there; nothing was "
            f"changed. Name the file, e.g. {str(path / 'output.txt')!r}."
        )
    _refuse_own_input(path, what, inputs)
    cwd = Path.cwd()
    if kind == "folder" and (path.resolve() == cwd or path.resolve() in cwd.parents):
        raise ValueError(
            f"{what} {text!r} {'is' if path.resolve() == cwd else 'holds'} the current folder {str(cwd)!r}: "
            "replacing it would delete what is in it; nothing was changed. Choose a new folder, e.g. "
            f"{str(path / 'out')!r}."
        )
    if os.path.lexists(path):
        found = _kind_of(path)
        if found == "symbolic link" and kind == "file" and path.is_file():
            found = "file"  # the link is replaced by the new file; what it points to stays as it was
        if found != kind:
            fix = (
                "write to stdout ('-') and redirect it"
                if found == "pipe or device"
                else f"move the {found} away"
            )
            raise FileExistsError(
                f"{what} {text!r} is a {found}, and this command writes a {kind} there; nothing was changed "
                f"(--overwrite never replaces a {found} with a {kind}). Choose another path, or {fix}."
            )
    if overwrite:
        _NEW_OUTPUTS.pop(path.absolute(), None)
        return
    if not path.exists() or (path.is_dir() and not any(path.iterdir())):
        _NEW_OUTPUTS.setdefault(path.absolute(), what)  # the first check names the flag
        return
    raise FileExistsError(
        f"{what} {text!r} already exists (a {kind}); nothing was changed. Choose another path, or pass "
        "--overwrite to replace it."
    )


def _refuse_own_input(output: Path, what: str, inputs: Iterable[str | Path | None]) -> None:
    resolved = output.resolve()
    for source in inputs:
        if source is None or str(source) in ("", "-") or not os.path.lexists(source):
            continue
        real = Path(source).resolve()
        if resolved == real or resolved in real.parents:
            relation = "is" if resolved == real else "holds"
            raise ValueError(
                f"{what} {str(output)!r} {relation} the input {str(source)!r}: writing it would delete the "
                "input; nothing was changed. Choose an output path outside the input."
            )


@contextlib.contextmanager
def atomic_file(final: str | Path, binary: bool = False) -> Iterator[TextIO | BinaryIO]:
    """A file (UTF-8 text, or bytes with ``binary``) written under a temporary name beside ``final``
    and renamed to ``final`` only if the block succeeds: ``final`` is the old file (or absent) until
    the new one is complete. Folders made for it are removed again if the block fails. A ``final``
    that :func:`refuse_to_replace` found new (no ``overwrite``) is never replaced: see
    :class:`OutputAppearedError`."""
    final = Path(final)
    with _new_parents(final):
        staged = final.with_name(f".{final.name}.tmp-{uuid.uuid4().hex[:8]}")
        try:
            with (
                full_disk_named(final, _what_stays(final)),
                staged.open("wb") if binary else staged.open("w", encoding="utf-8") as handle,
            ):
                yield handle
                handle.flush()
                os.fsync(handle.fileno())
            if _claimed(final):
                _publish_new(staged, final, _link)
            else:
                os.replace(staged, final)
        finally:
            staged.unlink(missing_ok=True)


@contextlib.contextmanager
def _new_parents(final: Path) -> Iterator[None]:
    """Make the missing folders above ``final``; remove them again (if still empty) when the block fails,
    so a failed or interrupted command leaves no trace."""
    made = [parent for parent in final.parents if not parent.exists()]
    final.parent.mkdir(parents=True, exist_ok=True)
    try:
        yield
    except BaseException:
        for parent in made:  # innermost first
            with contextlib.suppress(OSError):  # not empty: something else wrote there meanwhile
                parent.rmdir()
        raise


class DiskFullError(OSError):
    """No space was left on the disk while an output was written; the message names the output and
    what was kept. ``errno`` is ``ENOSPC``."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.errno = errno.ENOSPC


#: What torch's checkpoint writer (its zip writer, ``inline_container.cc``) says when a write fails; it
#: does not say why.
_TORCH_WRITE_FAILED = ("inline_container", "file write failed", "PytorchStreamWriter failed")

#: Free space below which a write failure that does not say why is taken for a full disk.
_NEARLY_FULL = 1 << 20


def is_disk_full(error: BaseException, folder: str | Path) -> bool:
    """Whether ``error``, raised while writing into ``folder``, comes from a full disk: an ``OSError``
    ``ENOSPC`` or ``EDQUOT`` in its chain, a message saying "No space left on device" (safetensors'
    ``SafetensorError`` wraps the ``OSError`` so), or torch's zip writer failing (:data:`_TORCH_WRITE_FAILED`)
    while the file system of ``folder`` has less than 1 MiB free."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        text = str(current)
        if isinstance(current, OSError) and current.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if "No space left on device" in text or "os error 28" in text:
            return True
        if isinstance(current, RuntimeError) and any(sign in text for sign in _TORCH_WRITE_FAILED):
            with contextlib.suppress(OSError):
                stats = os.statvfs(_existing(Path(folder)))
                if stats.f_bavail * stats.f_frsize < _NEARLY_FULL:
                    return True
        current = current.__cause__ or current.__context__
    return False


def _existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


#: The end of what :func:`full_disk_named` says was kept, where a partial temporary copy is removed.
TEMPORARY_REMOVED = "and the partial temporary copy was removed"


def _what_stays(final: Path) -> str:
    if os.path.lexists(final):
        return f"the old {_kind_of(final)} there is untouched, {TEMPORARY_REMOVED}"
    return f"nothing was written there, {TEMPORARY_REMOVED}"


@contextlib.contextmanager
def full_disk_named(target: str | Path, kept: str) -> Iterator[None]:
    """Turn an error of the block that comes from a full disk (:func:`is_disk_full`) into
    :class:`DiskFullError` naming ``target`` (the file or folder being written) and saying ``kept`` (what
    stays as it was and what was removed, e.g. "the previous checkpoints are untouched, and the partial
    temporary copy was removed"). Use it inside the block that removes the partial temporary, so that
    the free space is judged before it is freed."""
    try:
        yield
    except DiskFullError:
        raise
    except Exception as error:
        if not is_disk_full(error, Path(target).parent):
            raise
        raise DiskFullError(
            f"No space left on the disk while writing {str(target)!r} (the disk is full): {kept}. Free some "
            "space, or write elsewhere, and run again."
        ) from error


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
    was written to ``tmp`` (plus ``checksums.sha256`` with ``checksums=True``); folders made above
    ``out`` are removed again on failure.
    """
    final = Path(final)
    with _new_parents(final):
        staged = final.with_name(f".{final.name}.tmp-{uuid.uuid4().hex[:8]}")
        staged.mkdir()
        try:
            with full_disk_named(final, _what_stays(final)):
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


#: Help text of every command's ``--overwrite`` flag.
OVERWRITE_HELP = (
    "Replace an existing output of the same kind (a folder with a folder, a file with a file). Without it an "
    "existing output is never touched: the command stops first. An output that is or holds an input is "
    "always refused. Either way the output is written under a temporary name and moved into place only "
    "when complete."
)
