"""What a Trainer checkpoint is and where a run's checkpoints are: the ``checkpoint-<step>`` name,
the run's checkpoints in step order, which of them are whole (:func:`verify_checkpoint`), and reading
them while a training run rotates them away (:func:`pinned_checkpoints`, :func:`deleted_while_read`).

This is the one home of checkpoint naming, discovery, ordering and verification: resuming, rotation,
averaging, evaluation and plotting all draw from it. What a training run does with its checkpoints
(rotation, its lock, which one to resume from, whether an optimizer state fits) is
:mod:`hf_vanilla.training.checkpoints`'s.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from hf_vanilla.io.checksums import verify_checksums
from hf_vanilla.io.errors import (
    CheckpointDeletedError,
    CheckpointError,
    CorruptCheckpointError,
    damaged_file_hint,
)
from hf_vanilla.io.json_files import read_json
from hf_vanilla.io.pickles import PICKLE_SUFFIXES, UNREAD_PICKLES, verify_pickle_file
from hf_vanilla.io.safe_loading import verify_model_folder

logger = logging.getLogger(__name__)

__all__ = [
    "CHECKPOINT_PATTERN",
    "TRAINER_STATE_NAME",
    "checkpoint_folders",
    "checkpoint_name",
    "checkpoint_step",
    "deleted_while_read",
    "find_complete_checkpoints",
    "last_complete_checkpoint",
    "pinned_checkpoints",
    "verify_checkpoint",
]

#: Trainer checkpoint folders: ``checkpoint-<global step>``.
CHECKPOINT_PATTERN = re.compile(r"^checkpoint-(\d+)$")

TRAINER_STATE_NAME = "trainer_state.json"


def checkpoint_name(step: int) -> str:
    """The folder name of the Trainer checkpoint of ``step``: ``checkpoint-<step>``."""
    return f"checkpoint-{step}"


def checkpoint_step(path: str | Path) -> int | None:
    """The step number of a ``checkpoint-<step>`` folder name, or ``None`` for other names."""
    match = CHECKPOINT_PATTERN.match(Path(path).name)
    return int(match.group(1)) if match else None


@contextlib.contextmanager
def deleted_while_read(folder: str | Path) -> Iterator[None]:
    """Turn an error raised while reading the Trainer checkpoint ``folder`` (``checkpoint-<step>``) into
    :class:`CheckpointDeletedError` when the folder existed at the start and is gone at the failure: a
    training run rotated it away mid-read, so its files went missing, which is not damage. Other
    folders and errors pass as they are."""
    folder = Path(folder)
    existed = checkpoint_step(folder) is not None and folder.is_dir()
    try:
        yield
    except (OSError, ValueError) as err:
        if existed and not folder.is_dir() and not isinstance(err, CheckpointDeletedError):
            raise CheckpointDeletedError(folder) from err
        raise


def checkpoint_folders(run_dir: str | Path) -> list[Path]:
    """Every ``checkpoint-<step>`` folder of ``run_dir``, whole or not, oldest first by step; ``[]`` if
    ``run_dir`` is not a folder.

    This is the one place that orders a run's checkpoints: by the step in the folder's name, never
    by file times (which reading, evaluating or copying a checkpoint changes). Rotation, resuming,
    averaging and plotting a run's log all draw from it.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return []
    return sorted(
        (p for p in run_dir.iterdir() if p.is_dir() and checkpoint_step(p) is not None), key=checkpoint_step
    )


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
    state = read_json(state_path)
    step = checkpoint_step(folder)
    if step is not None and state.get("global_step") != step:
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


def _complete_checkpoints(run_dir: str | Path, newest_first: bool, **verify_kwargs: Any) -> Iterator[Path]:
    """The ``checkpoint-<step>`` folders of ``run_dir`` that pass :func:`verify_checkpoint`, checked one
    at a time in step order (:func:`checkpoint_folders`) as they are drawn; damaged ones are skipped
    with a warning saying why, and ones deleted while they are checked (a training run rotating its
    checkpoints) with a note saying so."""
    candidates = checkpoint_folders(Path(run_dir))
    for path in reversed(candidates) if newest_first else candidates:
        try:
            verify_checkpoint(path, **verify_kwargs)
        except (CheckpointError, FileNotFoundError) as err:
            if not path.is_dir() or not isinstance(err, CheckpointError):  # a file listed, then gone
                logger.info(
                    "Skipping checkpoint %s: it was deleted while it was being read (a training run rotating "
                    "its checkpoints).",
                    path,
                )
            else:
                logger.warning("Skipping checkpoint %s: %s", path, err)
        else:
            yield path


def find_complete_checkpoints(run_dir: str | Path, **verify_kwargs: Any) -> list[Path]:
    """The ``checkpoint-<step>`` folders of ``run_dir`` that pass :func:`verify_checkpoint`, oldest
    first by step (``checkpoint-900`` before ``checkpoint-1000``, whatever the file times); damaged
    ones are skipped with a warning saying why."""
    return list(_complete_checkpoints(run_dir, newest_first=False, **verify_kwargs))


def last_complete_checkpoint(run_dir: str | Path, **verify_kwargs: Any) -> Path | None:
    """The newest (by step) whole checkpoint of ``run_dir`` (``None`` if there is none), checking
    newest first.

    Use it instead of ``get_last_checkpoint``, which returns the newest folder even when a kill
    during saving left it half-written.
    """
    return next(_complete_checkpoints(run_dir, newest_first=True, **verify_kwargs), None)


@contextlib.contextmanager
def pinned_checkpoints(checkpoints: Sequence[str | Path]) -> Iterator[list[Path]]:
    """Private snapshots of ``checkpoints``, each checked with :func:`verify_checkpoint` (weights,
    pickles, ``checksums.sha256``: what ``--run_dir`` and resuming check; a model folder that is no
    Trainer checkpoint, such as a final model, with :func:`verify_model_folder`), to read instead of them.

    A training run with ``--save_total_limit`` deletes old checkpoints (``shutil.rmtree``) whenever it
    saves, and a command reading one meanwhile found files missing halfway. Every file of each checkpoint
    is hard-linked into a hidden folder beside it (``.checkpoint-<step>.pinned-…``; a copy in the system's
    temporary folder where the run folder cannot be written or linked in): a link keeps the bytes whatever
    becomes of the original name. The snapshots are deleted after the block. A checkpoint deleted before
    it is pinned, or while it is checked, raises :class:`CheckpointDeletedError` ("deleted while it was
    being read"), never "damaged". Errors raised by the checks and in the block name the original
    folders, not the snapshots.
    """
    originals = [Path(c) for c in checkpoints]
    holders: list[Path] = []
    try:
        pinned = []
        for original in originals:
            holders.append(_pin_holder(original))
            snapshot = holders[-1] / original.name
            linked = _pin(original, snapshot)
            try:
                if checkpoint_step(original) is not None or (original / TRAINER_STATE_NAME).is_file():
                    verify_checkpoint(snapshot)
                else:  # a model folder (a final model, another average): its weights and manifest
                    verify_model_folder(snapshot)
            except (CheckpointError, FileNotFoundError) as err:
                if not original.is_dir() or (linked and _unlinked_since(snapshot)):
                    raise CheckpointDeletedError(original) from err
                raise
            pinned.append(snapshot)
        yield pinned
    except (CheckpointError, FileNotFoundError) as err:
        if isinstance(err, CheckpointDeletedError):
            raise
        message = str(err)
        for holder, original in zip(holders, originals, strict=False):
            message = message.replace(str(holder / original.name), str(original))
        if message == str(err):
            raise
        raise type(err)(message) from err
    finally:
        for holder in holders:
            shutil.rmtree(holder, ignore_errors=True)


def _pin_holder(checkpoint: Path) -> Path:
    """A new private folder beside ``checkpoint`` (same file system: links work), else in ``TMPDIR``."""
    prefix = f".{checkpoint.name}.pinned-"
    try:
        return Path(tempfile.mkdtemp(prefix=prefix, dir=checkpoint.parent))
    except OSError:  # a run folder we may not write into
        return Path(tempfile.mkdtemp(prefix=prefix))


def _pin(checkpoint: Path, snapshot: Path) -> bool:
    """Hard-link (else copy) every file of ``checkpoint`` into ``snapshot``; ``True`` if all were linked.
    A file listed and gone when it is linked means the checkpoint is being deleted."""
    linked = True
    try:
        entries = sorted(checkpoint.rglob("*"))
        snapshot.mkdir()
        for source in entries:
            target = snapshot / source.relative_to(checkpoint)
            if source.is_dir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(source, target)
            except FileNotFoundError:
                raise
            except OSError:  # another file system, or one without hard links
                shutil.copy2(source, target)
                linked = False
    except FileNotFoundError:
        raise CheckpointDeletedError(checkpoint) from None
    if not checkpoint.is_dir():
        raise CheckpointDeletedError(checkpoint)
    return linked


def _unlinked_since(snapshot: Path) -> bool:
    """Whether a file of the hard-linked ``snapshot`` lost its original name (only the link is left)."""
    return any(p.is_file() and p.stat().st_nlink < 2 for p in snapshot.rglob("*"))
