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

And one hazard at the end, where a run that saved everything can still be reported failed:
transformers' ``Trainer`` leaves the process group alive, and with gloo both ways of ending it that
come first to mind can abort or hang the process. :func:`end_process_group` ends it in the one order
that is safe (its docstring says why).
"""

from __future__ import annotations

import ctypes
import gc
import os
import signal
import sys

import torch.distributed
from accelerate import Accelerator
from accelerate.utils import DistributedType
from torch.nn.parallel import DistributedDataParallel
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
    """Destroy this process's default process group, if it has one, once nothing uses it: the last step
    of a training process. Call it after the ``Trainer`` is dropped; with a
    ``DistributedDataParallel`` model still alive it raises ``RuntimeError`` and leaves the group as it is.

    Why, and why in this order (torch 2.13, gloo; seen in the 2-process stock-``Trainer`` test of
    ``tests/data/test_batching.py``, explained by ``py-spy dump --native`` of the hung processes; rates
    in docs/scaling.md): after a collective returns, the gloo worker thread that ran it may not yet have released the
    work's tensors (the ``all_gather`` of ``Trainer.store_flos`` at the end of ``train()``), and freeing
    a tensor that Python already dropped takes the GIL.

    * Left alive, the group is torn down in the interpreter's finalization, where that thread cannot
      take the GIL: SIGABRT, exit -6, "terminate called without an active exception"
      (pytorch/pytorch PR 179291 describes it).
    * Destroyed while the DDP wrapper lives (what ``destroy_process_group()`` at the end of a script
      does), the group's last owner becomes the wrapper's C++ reducer. Freeing the wrapper later joins
      gloo's threads with the GIL held while that thread waits for the GIL: the process hangs
      (``~Reducer`` → ``~ProcessGroupGloo`` → ``thread::join`` in the main thread,
      ``~AsyncAllgatherWork`` → ``gil_scoped_acquire`` in the worker; https://github.com/pytorch/pytorch/issues/56297).
    * Destroyed after the wrapper is gone, the last owner is torch's Python ``ProcessGroup``, whose
      destructor releases the GIL while it joins the threads: the worker finishes and the group ends.

    So this collects the reference cycles that keep a dropped ``Trainer`` (and its wrapper) alive,
    refuses if a wrapper is still reachable, then destroys the group. Called only where every process
    gets with nothing in flight, as torch asks: by ``scripts/train.py`` after a run that ended well,
    or that a signal stopped once every process had saved
    (:class:`~hf_vanilla.training.resilience.StoppedBySignal`). A process that fails with an exception
    skips it and does not wait on the group.
    """
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return
    gc.collect()
    if any(issubclass(type(obj), DistributedDataParallel) for obj in gc.get_objects()):
        raise RuntimeError(
            "A DistributedDataParallel model is still referenced, so ending the process group now could "
            "hang this process when the model is freed. Drop the Trainer and the wrapped model first "
            "(del trainer), then call end_process_group()."
        )
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
