"""Training-run durability: outputs that are whole or absent, and runs that survive being stopped.

The paper trained its big models for 3.5 days (§5.2) and averaged the last 20 checkpoints (§6.1); a
run that long is preempted, killed or crashes, and must resume without changing its result. What this
module guarantees (:mod:`hf_vanilla.training` plugs it into the ``Trainer``; loading checks are
:mod:`hf_vanilla.safe_loading`'s):

* **Write, then rename** (:func:`atomic_directory`, :func:`save_pretrained_atomic`, :func:`atomic_file`,
  :class:`ResilientTrainerMixin`): a folder or file is written under a temporary name next to its final
  place and renamed into place only when complete, so a crash never leaves a half-written output where
  a good one was. The Trainer mixin does this for every ``checkpoint-<step>`` and for the final model.
* **Nothing replaced unasked** (:func:`refuse_to_replace`): a command stops before it would replace an
  output the user did not ask it to (``--overwrite``).
* **Resuming from the newest whole checkpoint** (:func:`resolve_resume_checkpoint`,
  :func:`last_complete_checkpoint`): a folder left half-written by a kill during saving is skipped with
  a warning, where ``transformers.trainer_utils.get_last_checkpoint`` would pick it and fail; the
  checkpoint resumed from is checked first.
* **Checkpoints in step order** (:func:`checkpoint_folders`, :func:`rotate_checkpoints_by_step`): rotation
  (``save_total_limit``), resuming and averaging order a run's checkpoints by the step in their names,
  never by file times, so reading or evaluating a checkpoint never changes which ones are kept.
* **One run per output folder** (:func:`hold_run_dir`): a second run into a folder a live run holds is
  refused; the lock is the kernel's and goes with the process, however it ends.
* **No non-finite state saved** (:class:`ResilientTrainerMixin`): a step with a non-finite loss or
  gradient norm, or non-finite weights at a save, stops the run with :class:`NonFiniteTrainingError`
  naming the step; the checkpoints saved before it are kept.
* **Preemption and Ctrl-C** (:class:`SaveOnSignalCallback`): on SIGTERM (what SLURM, Kubernetes and
  ``torchrun`` send before killing a job) or SIGINT (Ctrl-C) the run finishes its current optimizer
  step, saves a checkpoint and exits; ``--resume_from_checkpoint last`` continues it. All processes
  agree on the step.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import math
import os
import shutil
import signal
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO, Literal, TextIO

import torch
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from hf_vanilla.safe_loading import (
    TRAINER_STATE_NAME,
    CheckpointError,
    CorruptCheckpointError,
    checkpoint_step,
    damaged_file_hint,
    verify_checkpoint,
    verify_safetensors_file,
    write_checksums,
)

logger = logging.getLogger(__name__)

__all__ = [
    "STAGING_DIR_NAME",
    "NonFiniteTrainingError",
    "ResilientTrainerMixin",
    "RunInUseError",
    "SaveOnSignalCallback",
    "atomic_directory",
    "atomic_file",
    "checkpoint_folders",
    "find_complete_checkpoints",
    "hold_run_dir",
    "last_complete_checkpoint",
    "load_full_state_dict_into_sharded",
    "publish_directory",
    "refuse_to_replace",
    "resolve_resume_checkpoint",
    "rotate_checkpoints_by_step",
    "save_pretrained_atomic",
    "tie_state_dict",
]

#: Folder inside the run directory where checkpoints are written before they are renamed into place.
STAGING_DIR_NAME = ".incomplete-checkpoints"


# --------------------------------------------------------------------------------------------------
# resuming
# --------------------------------------------------------------------------------------------------
def checkpoint_folders(run_dir: str | Path) -> list[Path]:
    """Every ``checkpoint-<step>`` folder of ``run_dir``, whole or not, oldest first by step; ``[]`` if
    ``run_dir`` is not a folder.

    This is the one place that orders a run's checkpoints: by the step in the folder's name, never
    by file times (which reading, evaluating or copying a checkpoint changes). Rotation
    (:func:`rotate_checkpoints_by_step`), resuming (:func:`last_complete_checkpoint`), averaging
    (:func:`hf_vanilla.averaging.find_checkpoints`) and plotting a run's log all draw from it.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return []
    return sorted(
        (p for p in run_dir.iterdir() if p.is_dir() and checkpoint_step(p) is not None), key=checkpoint_step
    )


def _complete_checkpoints(run_dir: str | Path, newest_first: bool, **verify_kwargs: Any) -> Iterator[Path]:
    """The ``checkpoint-<step>`` folders of ``run_dir`` that pass :func:`verify_checkpoint`, checked one
    at a time in step order (:func:`checkpoint_folders`) as they are drawn; damaged ones are skipped
    with a warning saying why."""
    candidates = checkpoint_folders(Path(run_dir))
    for path in reversed(candidates) if newest_first else candidates:
        try:
            verify_checkpoint(path, **verify_kwargs)
        except CheckpointError as err:
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


def rotate_checkpoints_by_step(
    run_dir: str | Path, save_total_limit: int | None, best_model_checkpoint: str | None = None
) -> list[Path]:
    """``--save_total_limit``: delete the oldest (by step) whole checkpoints of ``run_dir`` until
    ``save_total_limit`` are left, never the newest nor ``best_model_checkpoint``. Returns the deleted
    folders.

    ``transformers.trainer_utils.rotate_checkpoints(use_mtime=True)``, which the Trainer calls, orders
    by modification time, so a checkpoint that anything wrote into (an evaluation's output, say)
    counted as the newest and newer ones were deleted. Damaged folders are not counted and not
    deleted (a warning names them); checksums are not recomputed here, as they are before resuming.
    """
    if save_total_limit is None or save_total_limit <= 0:
        return []
    complete = find_complete_checkpoints(run_dir, checksums=False)
    protected = set(complete[-1:])
    if best_model_checkpoint is not None:
        protected.add(Path(run_dir) / Path(best_model_checkpoint).name)
    deleted = []
    surplus = len(complete) - max(save_total_limit, len(protected))
    for path in complete:
        if surplus <= 0:
            break
        if path not in protected:
            shutil.rmtree(path)
            deleted.append(path)
            surplus -= 1
    return deleted


class NonFiniteTrainingError(ValueError):
    """A training step gave a non-finite loss or gradient norm, or the weights to be saved are not finite."""


class RunInUseError(OSError):
    """Another training run holds the output folder (:func:`hold_run_dir`)."""


@contextlib.contextmanager
def hold_run_dir(output_dir: str | Path, hold: bool = True) -> Iterator[None]:
    """One training run per output folder: an exclusive, non-blocking ``flock`` on the folder itself,
    held for the block (creating the folder if needed; a folder created here and still empty when
    the block fails is removed again).

    A second run into the held folder raises :class:`RunInUseError` at once. The lock is the
    kernel's, tied to the open folder: it goes when the process ends, however it ends (SIGKILL
    included), so a killed run never leaves it stuck and there is no lock file to clean up. Under
    ``torchrun`` only the main process of the launch takes it (``hold``), and every process of the
    launch raises together when it is refused (one all-reduce). Local file systems only: ``flock``
    over NFS is not reliable on every system.
    """
    output_dir = Path(output_dir)
    created = not output_dir.exists()
    refused = False
    fd = None
    if hold:
        output_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(output_dir, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            if err.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                os.close(fd)
                raise
            os.close(fd)
            fd = None
            refused = True
    try:
        if _agree_across_processes(refused):
            raise RunInUseError(
                f"--output_dir {str(output_dir)!r} is in use by another training run (still running); nothing was "
                "changed. Wait for it to end, or choose another --output_dir; to continue a run that ended, use "
                "--resume_from_checkpoint last."
            )
        yield
    except BaseException:
        if hold and created and not refused:
            with contextlib.suppress(OSError):  # not empty: the run wrote something, which stays
                output_dir.rmdir()
        raise
    finally:
        if fd is not None:
            os.close(fd)  # releases the lock


def _no_complete_checkpoint(asked: str, output_dir: Path) -> str:
    """Why there is nothing to resume from in ``output_dir``: no checkpoint folder, or only damaged ones."""
    damaged = [p.name for p in checkpoint_folders(output_dir)]
    if not damaged:
        return (
            f"{asked}: no checkpoint-<step> folder in {str(output_dir)!r}. Check --output_dir, or drop "
            "--resume_from_checkpoint to start afresh."
        )
    return (
        f"{asked}: {str(output_dir)!r} holds checkpoints ({', '.join(damaged)}) but none is complete (the "
        "warnings above say what is wrong with each). Restore a good copy of one, or move them away and start "
        "afresh without --resume_from_checkpoint (nothing was changed)."
    )


def resolve_resume_checkpoint(
    resume_from_checkpoint: str | None, output_dir: str | Path, overwrite: bool = False
) -> str | None:
    """The checkpoint to resume from, checked before any work is done.

    ``None`` starts afresh, but only into an ``output_dir`` that is absent or empty, or, with
    ``overwrite``, holds no checkpoints (a new run would mix its checkpoints with the old run's, and
    resuming or averaging would pick from both); ``"last"`` (or ``"true"``) picks the newest whole
    ``checkpoint-<step>`` in ``output_dir``; anything else must be a checkpoint folder written by the
    Trainer.
    """
    output_dir = Path(output_dir)
    if resume_from_checkpoint is None or str(resume_from_checkpoint).lower() in ("false", ""):
        if checkpoint_folders(output_dir):
            raise FileExistsError(
                f"{str(output_dir)!r} already holds checkpoints. Continue that run with "
                "--resume_from_checkpoint last, or choose a new --output_dir (nothing was overwritten; "
                "--overwrite does not apply to another run's checkpoints: delete them yourself to start afresh)."
            )
        if not overwrite:
            refuse_to_replace(output_dir, overwrite, "--output_dir")
        return None
    if str(resume_from_checkpoint).lower() in ("last", "true"):
        last = last_complete_checkpoint(output_dir)  # whole ones only
        if last is None:
            raise FileNotFoundError(
                _no_complete_checkpoint(f"--resume_from_checkpoint {resume_from_checkpoint}", output_dir)
            )
        return str(last)
    path = Path(resume_from_checkpoint)
    if not path.is_dir():
        raise FileNotFoundError(
            f"--resume_from_checkpoint {str(path)!r} does not exist. Give a checkpoint-<step> folder of an "
            "earlier run, or 'last' for the newest one in --output_dir."
        )
    if not (path / "trainer_state.json").is_file():
        raise FileNotFoundError(
            f"--resume_from_checkpoint {str(path)!r} is not a Trainer checkpoint (no trainer_state.json). To "
            "start from saved weights without the optimizer state, use --model_name_or_path instead."
        )
    verify_checkpoint(path)  # whole, and plain tensor data only: an error naming the file otherwise
    return str(path)


# --------------------------------------------------------------------------------------------------
# write, then rename
# --------------------------------------------------------------------------------------------------
def publish_directory(staged: str | Path, final: str | Path) -> Path:
    """Move the complete folder ``staged`` to ``final`` (same file system), replacing an old ``final``.

    ``final`` is at every moment either the old complete folder, absent (between two renames), or
    the new complete folder — never a mixture. Only a folder is replaced: anything else at ``final``
    (a file, a symbolic link) raises ``FileExistsError`` and stays as it was. Returns ``final``.
    """
    staged, final = Path(staged), Path(final)
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
    count).
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
    if overwrite or not path.exists() or (path.is_dir() and not any(path.iterdir())):
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
    the new one is complete. Folders made for it are removed again if the block fails."""
    final = Path(final)
    with _new_parents(final):
        staged = final.with_name(f".{final.name}.tmp-{uuid.uuid4().hex[:8]}")
        try:
            with staged.open("wb") if binary else staged.open("w", encoding="utf-8") as handle:
                yield handle
                handle.flush()
                os.fsync(handle.fileno())
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
                        f"{str(path)!r} has no tensor {name!r}.{damaged_file_hint(Path(path))}"
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
    * Inside a checkpoint, the model folder is written and checked (no pickle in it) before any Trainer
      state: every process waits after the model is saved, so the others add their
      ``rng_state_<rank>.pth`` only then, as one process adds ``rng_state.pth`` and ``optimizer.pt``.
    * Old checkpoints are deleted by step (:func:`rotate_checkpoints_by_step`), not by the file times
      the Trainer's ``rotate_checkpoints(use_mtime=True)`` goes by.
    * The loss of every micro-step and the gradient norm of every step are checked for inf and nan
      where they are (no host synchronisation per step); the first bad step is read before anything
      is logged, evaluated or saved and when the run stops, and every save (checkpoints, the final
      model, the save on SIGTERM) first checks the weights: :class:`NonFiniteTrainingError` then
      stops the run with nothing written.
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
    #: The first step with a non-finite loss or gradient norm, kept where the values are (no host
    #: synchronisation per step) and read only before a log, evaluation, save or stop.
    _first_nonfinite: torch.Tensor | None = None
    _first_nonfinite_host: float = math.inf

    def _note_nonfinite(self, value: torch.Tensor | float | None, step: int) -> None:
        if isinstance(value, torch.Tensor):
            bad = ~torch.isfinite(value.detach()).all()
            at = torch.where(bad, float(step), math.inf).to(value.device)
            first = self._first_nonfinite
            self._first_nonfinite = at if first is None else torch.minimum(first, at)
        elif value is not None and not math.isfinite(value):
            self._first_nonfinite_host = min(self._first_nonfinite_host, step)

    def _last_good_checkpoint(self) -> str:
        """What is left to continue from, and how (the end of a :class:`NonFiniteTrainingError`)."""
        last = last_complete_checkpoint(self.args.output_dir, checksums=False)  # type: ignore[attr-defined]
        if last is None:
            return "No checkpoint was saved before it: start again with a lower --learning_rate."
        return (
            f"The last checkpoint, {str(last)!r}, is kept: continue from it with --resume_from_checkpoint "
            "last and a lower --learning_rate."
        )

    def _stop_if_nonfinite(self) -> None:
        """Raise :class:`NonFiniteTrainingError` if a step so far gave a non-finite loss or gradient norm
        on any process (one all-reduce under distribution)."""
        first = torch.tensor([self._first_nonfinite_host], dtype=torch.float64)
        if self._first_nonfinite is not None:
            first = torch.minimum(first, self._first_nonfinite.detach().double().cpu().reshape(1))
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            from accelerate import PartialState

            first = first.to(PartialState().device)
            torch.distributed.all_reduce(first, op=torch.distributed.ReduceOp.MIN)
        step = float(first.item())
        if math.isfinite(step):
            raise NonFiniteTrainingError(
                f"Training step {int(step)} gave a non-finite loss or gradient norm (inf or nan); the run stopped at "
                f"step {self.state.global_step} without saving (the learning rate is probably too high, "  # type: ignore[attr-defined]
                f"--learning_rate {self.args.learning_rate:g}). {self._last_good_checkpoint()}"  # type: ignore[attr-defined]
            )

    def _stop_if_weights_nonfinite(self) -> None:
        """Raise :class:`NonFiniteTrainingError` if any weight is inf or nan (before anything is saved)."""
        model = self.model  # type: ignore[attr-defined]
        count = torch.zeros((), dtype=torch.int64)
        for param in model.parameters():
            local = param.to_local() if hasattr(param, "to_local") else param
            count = count.to(local.device) + (~torch.isfinite(local.detach())).sum()
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            from accelerate import PartialState

            count = count.to(PartialState().device)
            torch.distributed.all_reduce(count)
        bad = int(count.item())
        if bad:
            raise NonFiniteTrainingError(
                f"After training step {self.state.global_step} the weights hold {bad} non-finite values (inf or "  # type: ignore[attr-defined]
                f"nan): they were not saved (the learning rate is probably too high, --learning_rate "
                f"{self.args.learning_rate:g}). {self._last_good_checkpoint()}"  # type: ignore[attr-defined]
            )

    def training_step(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        loss = super().training_step(*args, **kwargs)  # type: ignore[misc]
        self._note_nonfinite(loss, self.state.global_step + 1)  # type: ignore[attr-defined]
        return loss

    def _maybe_log_save_evaluate(self, tr_loss: Any, grad_norm: Any, *args: Any, **kwargs: Any) -> None:
        """Before anything is logged, evaluated or saved, and when the run stops (``max_steps``, a
        signal), stop with :class:`NonFiniteTrainingError` if a step gave a non-finite loss or
        gradient norm. The Trainer's own ``logging_nan_inf_filter`` would otherwise log the average
        of earlier losses in place of ``nan``, and the checkpoint would hold the damaged weights."""
        self._note_nonfinite(grad_norm, self.state.global_step)  # type: ignore[attr-defined]
        control = self.control  # type: ignore[attr-defined]
        if (
            control.should_log
            or control.should_evaluate
            or control.should_save
            or control.should_training_stop
        ):
            self._stop_if_nonfinite()
        super()._maybe_log_save_evaluate(tr_loss, grad_norm, *args, **kwargs)  # type: ignore[misc]

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
        self._stop_if_nonfinite()
        self._stop_if_weights_nonfinite()
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
            rotate_checkpoints_by_step(run_dir, args.save_total_limit, state.best_model_checkpoint)
        accelerator.wait_for_everyone()

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        args = self.args  # type: ignore[attr-defined]
        if _internal_call or args.push_to_hub:  # a checkpoint (staged whole), or uploaded from output_dir
            super().save_model(output_dir, _internal_call=_internal_call)  # type: ignore[misc]
            if _internal_call:
                # The Trainer's _save_checkpoint goes on to the optimizer, scheduler and RNG states; under
                # DDP a process other than the main one reaches _save_rng_state at once and would write
                # rng_state_<rank>.pth into the folder while the main process still writes and checks
                # the model there (hf_vanilla.training's _save refuses a model folder holding a pickle).
                self.accelerator.wait_for_everyone()  # type: ignore[attr-defined]
            return
        self._stop_if_nonfinite()
        self._stop_if_weights_nonfinite()
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
                    _no_complete_checkpoint("resume_from_checkpoint=True", Path(output_dir))
                )
            resume_from_checkpoint = str(found)
        elif isinstance(resume_from_checkpoint, str | os.PathLike):
            verify_checkpoint(resume_from_checkpoint, trusted_patterns=self._trusted_patterns())
        try:
            return super().train(resume_from_checkpoint, *args, **kwargs)  # type: ignore[misc]
        finally:  # also after an exception: no signal handler of a finished run stays installed
            for callback in self.callback_handler.callbacks:  # type: ignore[attr-defined]
                if isinstance(callback, SaveOnSignalCallback):
                    callback.restore_handlers()


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
        self.restore_handlers()

    def restore_handlers(self) -> None:
        """Put back the handlers this callback replaced. ``on_train_end`` does it after a run that ends
        normally; :class:`ResilientTrainerMixin` after any end of ``train()``, an exception included (a
        stale handler would swallow the next Ctrl-C of a notebook or a later run in the process)."""
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous.clear()
