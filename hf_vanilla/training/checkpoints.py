"""A training run's own checkpoints: rotation in step order, the run's lock, which checkpoint a run
resumes from, and whether its optimizer and scheduler states fit the run. What a checkpoint is, where a
run's checkpoints are and whether one is whole is :mod:`hf_vanilla.io.checkpoints`'."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import shutil
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from hf_vanilla.io.atomic import refuse_to_replace
from hf_vanilla.io.checkpoints import (
    TRAINER_STATE_NAME,
    checkpoint_folders,
    find_complete_checkpoints,
    last_complete_checkpoint,
    verify_checkpoint,
)
from hf_vanilla.io.errors import CheckpointError

logger = logging.getLogger(__name__)


__all__ = [
    "STAGING_DIR_NAME",
    "RunInUseError",
    "StateMismatchError",
    "check_optimizer_state",
    "check_scheduler_state",
    "hold_run_dir",
    "resolve_resume_checkpoint",
    "rotate_checkpoints_by_step",
]

#: Folder inside the run directory where checkpoints are written before they are renamed into place.
STAGING_DIR_NAME = ".incomplete-checkpoints"


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
    if not (path / TRAINER_STATE_NAME).is_file():
        raise FileNotFoundError(
            f"--resume_from_checkpoint {str(path)!r} is not a Trainer checkpoint (no trainer_state.json). To "
            "start from saved weights without the optimizer state, use --model_name_or_path instead."
        )
    verify_checkpoint(path)  # whole, and plain tensor data only: an error naming the file otherwise
    return str(path)


def _agree_across_processes(flag: bool) -> bool:
    """``True`` if ``flag`` is set on any process (one all-reduce; plain ``flag`` without distribution)."""
    return _largest_across_processes(1.0 if flag else 0.0) > 0


def _largest_across_processes(value: float) -> float:
    """The largest ``value`` of all processes (one all-reduce; ``value`` itself without distribution)."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return value
    from accelerate import PartialState

    largest = torch.tensor([value], dtype=torch.float64, device=PartialState().device)
    torch.distributed.all_reduce(largest, op=torch.distributed.ReduceOp.MAX)
    return float(largest.item())


# --------------------------------------------------------------------------------------------------
# The optimizer and scheduler states a run resumes with
# --------------------------------------------------------------------------------------------------
class StateMismatchError(CheckpointError):
    """A checkpoint's optimizer or scheduler state does not fit the run that would resume with it."""


def _state_mismatch(path: Path, what: str) -> StateMismatchError:
    checkpoint = path.parent
    return StateMismatchError(
        f"{str(path)!r} does not fit the model and optimizer of this run: {what}. It comes from another run "
        "(another --d_model, --layers, vocabulary or --optim) or was edited; nothing was trained. Resume from a "
        f"checkpoint with its own {path.name}, or from another checkpoint, or start afresh from these weights "
        f"with --model_name_or_path {str(checkpoint)!r} (without --resume_from_checkpoint)."
    )


#: Optimizers whose state per parameter is elementwise (torch's, transformers' Adafactor): each of its
#: tensors has the parameter's shape, or that shape less one dimension (a factored second moment).
_ELEMENTWISE_OPTIMIZER_MODULES = ("torch.optim.", "transformers.")


def _fits_parameter(value: torch.Tensor, param: torch.Tensor) -> bool:
    shape, own = tuple(value.shape), tuple(param.shape)
    factored = len(own) >= 2 and any(shape == own[:i] + own[i + 1 :] for i in range(len(own)))
    return shape == own or factored


def check_optimizer_state(
    state_dict: Any,
    optimizer: torch.optim.Optimizer,
    path: str | Path,
    names: Mapping[int, str] | None = None,
) -> None:
    """Refuse an optimizer state (``optimizer.pt``, read from ``path``) that does not fit ``optimizer``,
    before it is loaded: raises :class:`StateMismatchError` naming the file (and the parameter, by its
    name in ``names``, keyed by ``id(parameter)``).

    The numbers of parameter groups and of parameters in each must be the optimizer's (torch checks
    these too, without naming the file), every state must belong to one of its parameters, and the
    parameters of one rank must hold the same entries. For torch's optimizers and transformers'
    Adafactor, each tensor entry must also have its parameter's shape (or, factored, that shape less one
    dimension; ``step`` a single number) and a floating-point dtype for a floating-point parameter:
    torch's load would otherwise accept moments of another model, and the fused Adam step reads past
    their end (a segmentation fault) or trains on with the wrong moments. An optimizer of another kind
    keeps its own state layout, so only the counts are checked for it.
    """
    path = Path(path)
    if not isinstance(state_dict, Mapping) or not {"state", "param_groups"} <= state_dict.keys():
        raise _state_mismatch(path, "it is not an optimizer state (no 'state' and 'param_groups')")
    saved_groups, groups = state_dict["param_groups"], optimizer.param_groups
    if not isinstance(state_dict["state"], Mapping) or not all(
        isinstance(group, Mapping) and isinstance(group.get("params"), list) for group in saved_groups
    ):
        raise _state_mismatch(path, "its 'state' or 'param_groups' are not those of an optimizer")
    if len(saved_groups) != len(groups):
        raise _state_mismatch(
            path, f"it has {len(saved_groups)} parameter group(s), the optimizer {len(groups)}"
        )
    params: dict[Any, tuple[str, torch.Tensor]] = {}
    for number, (saved, own) in enumerate(zip(saved_groups, groups, strict=True)):
        names_here = [(names or {}).get(id(param), f"parameter {i}") for i, param in enumerate(own["params"])]
        if len(saved["params"]) != len(own["params"]):
            raise _state_mismatch(
                path,
                f"parameter group {number} has {len(saved['params'])} parameters, the model's {len(own['params'])}",
            )
        params.update(zip(saved["params"], zip(names_here, own["params"], strict=True), strict=True))
    elementwise = type(optimizer).__module__.startswith(_ELEMENTWISE_OPTIMIZER_MODULES)
    entries: dict[int, tuple[str, set[str]]] = {}
    for index, state in state_dict["state"].items():
        if index not in params:
            raise _state_mismatch(
                path, f"it holds a state for parameter {index!r}, which the optimizer does not have"
            )
        if not isinstance(state, Mapping):
            raise _state_mismatch(
                path, f"the state of parameter {index!r} is {type(state).__name__}, not entries"
            )
        name, param = params[index]
        first = entries.setdefault(param.dim(), (name, set(state)))
        if set(state) != first[1]:
            raise _state_mismatch(
                path, f"{name} holds the entries {sorted(state)}, {first[0]} {sorted(first[1])}"
            )
        if not elementwise:
            continue
        for key, value in state.items():
            if not isinstance(value, torch.Tensor):
                continue
            if key == "step":
                if value.numel() != 1:
                    raise _state_mismatch(path, f"the step of {name} has {value.numel()} values, not one")
            elif not _fits_parameter(value, param):
                raise _state_mismatch(
                    path, f"{key} of {name} has shape {list(value.shape)}, the parameter {list(param.shape)}"
                )
            elif param.is_floating_point() and not value.is_floating_point():
                raise _state_mismatch(path, f"{key} of {name} is {value.dtype}, not a floating-point tensor")


def _structure_difference(saved: Any, own: Any, where: str) -> str | None:
    """Where ``saved`` differs in structure from ``own`` (lengths of lists, kinds of values, entries of
    both), or ``None``."""
    if isinstance(own, Mapping):
        if not isinstance(saved, Mapping):
            return f"{where} is {type(saved).__name__}, not a mapping"
        missing = [key for key, value in own.items() if isinstance(value, list | tuple) and key not in saved]
        if missing:
            return f"{where} has no {missing[0]!r}"
        shared = [key for key in own if key in saved]  # other entries may come and go between torch versions
        return next(
            (d for key in shared if (d := _structure_difference(saved[key], own[key], f"{where}[{key!r}]"))),
            None,
        )
    if isinstance(own, list | tuple):
        if not isinstance(saved, list | tuple) or len(saved) != len(own):
            size = len(saved) if isinstance(saved, list | tuple) else type(saved).__name__
            return f"{where} has {size} entries, this run's {len(own)}"
        return next(
            (
                d
                for i, (s, o) in enumerate(zip(saved, own, strict=True))
                if (d := _structure_difference(s, o, f"{where}[{i}]"))
            ),
            None,
        )
    if own is None or saved is None:
        return None if own is saved else f"{where} is {saved!r}, this run's {own!r}"
    number = (int, float, torch.Tensor)
    if isinstance(own, number) and not isinstance(own, bool):
        ok = isinstance(saved, number) and not isinstance(saved, bool)
        return None if ok else f"{where} is {type(saved).__name__}, not a number"
    return (
        None
        if isinstance(saved, type(own))
        else f"{where} is {type(saved).__name__}, this run's {type(own).__name__}"
    )


def check_scheduler_state(
    state_dict: Any, scheduler: torch.optim.lr_scheduler.LRScheduler, path: str | Path
) -> None:
    """Refuse a scheduler state (``scheduler.pt``, read from ``path``) that does not fit ``scheduler``,
    before it is loaded: its per-group lists (learning rates, schedules) as long as the scheduler's, and
    each entry both have of the same kind (numbers where it has numbers). Raises
    :class:`StateMismatchError` naming the file."""
    difference = _structure_difference(state_dict, scheduler.state_dict(), "the state")
    if difference is not None:
        raise _state_mismatch(Path(path), difference)
