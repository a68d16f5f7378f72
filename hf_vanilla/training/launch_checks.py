"""Refuse launches a training run cannot honour, before it writes anything.

Measured with torch 2.13, transformers 5.24 and accelerate 1.15 on a machine without GPUs, each of
these used to exit 0 having done something else than was asked (docs/scaling.md):

* ``torchrun`` or ``accelerate launch`` (with a multi-process config) without ``--use_cpu``: each
  process finds no GPU, sets up no process group and trains alone — N unconnected single-process runs
  writing into the same ``--output_dir``. :func:`check_process_group` refuses them.
* ``accelerate launch --cpu --num_processes N``: one process. Refused by the same check.
* FSDP asked for (an accelerate config with ``distributed_type: FSDP``, or the Trainer's ``--fsdp``)
  on CPU: accelerate enables FSDP only for GPU-type modes and trains plain DDP (``MULTI_CPU``)
  without a word. :func:`check_fsdp_honoured` refuses it.

The choice is to refuse rather than fall back: a run that asked to be sharded and is not may run out
of memory much later, and a DDP run is not what its saved arguments say it was. The messages say
what to run instead.

One more launch hazard is handled rather than refused: ``torchrun``'s elastic agent (also behind
``accelerate launch`` with several processes) starts each worker in a session of its own, so a worker
outlives an agent that is killed (``kill -9``, the OOM killer, a node's launcher stopped): it went on
training with the other nodes, unsupervised, and they never stopped. :func:`exit_with_launcher` makes
the worker die with its agent, as if its node had died, so the other nodes stop (docs/scaling.md).

And one hazard at the end: a process that exits with its gloo process group still alive can abort
in the interpreter's finalization ("terminate called without an active exception", SIGABRT) after
the run has saved everything, so the launcher reports a failed run. :func:`end_process_group`
destroys the group once a run has ended well or has saved the step a signal stopped it at.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

import torch.distributed
from accelerate import Accelerator
from accelerate.utils import DistributedType
from transformers import TrainingArguments

__all__ = [
    "LaunchError",
    "check_fsdp_honoured",
    "check_process_group",
    "end_process_group",
    "exit_with_launcher",
    "fsdp_requested",
]

_NOTHING_WRITTEN = "Nothing was written."
_PR_SET_PDEATHSIG = 1  # linux/prctl.h
#: The process that started this one, read as early as the training code is imported.
_LAUNCHER_PID = os.getppid()


class LaunchError(ValueError):
    """The processes were launched in a way the run cannot honour; the message says what to do.

    A ``ValueError``, so that the commands end it in one line (:func:`hf_vanilla.cli.run_cli`).
    """


def check_process_group(training_args: TrainingArguments) -> None:
    """Refuse a process that a launcher started as one of several but that joined no process group.

    ``WORLD_SIZE`` > 1 (set by ``torchrun`` and by ``accelerate launch`` for several processes) must
    equal the run's world size. ``accelerate launch`` with ``--cpu`` sets ``ACCELERATE_USE_CPU`` and,
    when more than one process was asked for, ``MASTER_ADDR``, but starts only one process.
    """
    world_size = training_args.world_size
    launched = os.environ.get("WORLD_SIZE", "").strip()
    if launched.isdigit() and int(launched) > 1 and world_size != int(launched):
        rank = os.environ.get("RANK", "?")
        raise LaunchError(
            f"This process was started as rank {rank} of WORLD_SIZE={launched}, but it joined no process group "
            f"(world size {world_size}), so the processes would train unconnected copies into one --output_dir. "
            "On a machine without GPUs pass --use_cpu to train over gloo (torchrun --nproc_per_node N "
            "scripts/train.py --use_cpu ...); on GPUs check that every process sees one. "
            f"{_NOTHING_WRITTEN}"
        )
    accelerate_cpu = os.environ.get("ACCELERATE_USE_CPU", "").lower() == "true"
    if accelerate_cpu and "MASTER_ADDR" in os.environ and not launched and world_size == 1:
        raise LaunchError(
            "accelerate launch --cpu was asked for several processes but started only this one (accelerate "
            "1.15 runs --cpu as a single process). For N processes on CPU run `accelerate launch --multi_gpu "
            "--num_processes N scripts/train.py --use_cpu ...` or `torchrun --nproc_per_node N scripts/train.py "
            f"--use_cpu ...`; for one process drop --num_processes. {_NOTHING_WRITTEN}"
        )


def exit_with_launcher() -> None:
    """In a worker of ``torchrun``'s elastic agent (``TORCHELASTIC_RUN_ID`` set; ``torchrun``, ``accelerate
    launch``) on Linux: ask the kernel to SIGKILL this process when the agent that started it exits.

    The agent stops its workers itself when it ends normally or on SIGTERM/SIGINT (after their own
    SIGTERM handling: :class:`~hf_vanilla.training.resilience.SaveOnSignalCallback`); this matters only
    when the agent dies without doing so. Then this worker dies too, as on a node that died, and the
    other nodes' collectives fail at once (the connection closes) instead of training on with it.
    Raises :class:`LaunchError` if the agent is already gone.
    """
    if "TORCHELASTIC_RUN_ID" not in os.environ or not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != _LAUNCHER_PID:  # the agent died before the kernel was asked
        raise LaunchError(
            f"The launcher that started this process (pid {_LAUNCHER_PID}) has exited: run the launch command "
            f"again. {_NOTHING_WRITTEN}"
        )


def end_process_group() -> None:
    """Destroy this process's default process group, if it has one: the last step of a training
    process whose run ended well.

    transformers' ``Trainer`` leaves the group that ``TrainingArguments`` set up alive to the end of the
    process. With gloo its worker threads then meet the interpreter's finalization, which can abort
    the process (SIGABRT, exit -6, "terminate called without an active exception"; pytorch/pytorch
    issue 190489) after the model was saved (CI saw it once, in a two-process test that passes on most
    runs). Called where every process gets with nothing in flight (as ``destroy_process_group``'s
    documentation asks, "near the end of main()"): by ``scripts/train.py`` after a run that ended
    without an exception, and by :class:`~hf_vanilla.training.resilience.SaveOnSignalCallback` after all
    processes saved the step a signal stopped them at. A rank that fails while the others are in a
    collective does not also wait on the group.
    """
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def fsdp_requested(training_args: TrainingArguments) -> str | None:
    """Where FSDP was asked for: the Trainer's ``--fsdp``, accelerate's ``ACCELERATE_USE_FSDP`` (an
    accelerate config with ``distributed_type: FSDP``, or ``--use_fsdp``), or ``None``."""
    if training_args.fsdp:
        return "--fsdp"
    if os.environ.get("ACCELERATE_USE_FSDP", "").lower() == "true":
        return "the accelerate config (distributed_type: FSDP)"
    return None


def check_fsdp_honoured(accelerator: Accelerator, training_args: TrainingArguments) -> None:
    """Refuse a run that asked for FSDP but whose Accelerator does not shard (plain DDP or one process)."""
    asked = fsdp_requested(training_args)
    if asked is None or accelerator.distributed_type == DistributedType.FSDP:
        return
    if accelerator.distributed_type == DistributedType.MULTI_CPU:
        instead = "plain DDP on CPU (accelerate 1.15 enables FSDP only on GPUs and similar accelerators)"
    else:
        instead = (
            f"{accelerator.distributed_type.value} with {accelerator.num_processes} process(es), unsharded"
        )
    raise LaunchError(
        f"FSDP was asked for ({asked}), but this run would train {instead}. Run it on GPUs, or drop the FSDP "
        "setting to train with DDP (configs/accelerate/ddp.yaml, or torchrun --nproc_per_node N scripts/train.py "
        f"--use_cpu ... on CPU). {_NOTHING_WRITTEN}"
    )
