"""Runs ``scripts/train.py`` unchanged, with a recording Trainer, for the multi-process and fault tests.

Launched by tests/training/test_distributed.py and tests/training/test_faults.py as ``python``, ``torchrun`` or
``accelerate launch`` ``tests/train_driver.py <train.py arguments>``. It swaps
``hf_vanilla.training.trainer.PaperSeq2SeqTrainer`` for a subclass that adds observation only, then runs the
script as ``__main__``. Controlled by environment variables:

* ``HF_VANILLA_RECORD_DIR``: each process writes ``rank-<r>.json`` (rank, world size, pid, tokenizer
  hash, Accelerate's distributed type, whether the parameters are sharded) when training starts,
  appends its logs to ``logs-rank<r>.jsonl``, saves its (whole) parameters to
  ``params-rank<r>.safetensors`` when training ends, and writes the decoded predictions and
  references that ``compute_metrics`` receives (after the cross-process gather) to
  ``eval-rank<r>-<call>.json``; as the script ends, ``exit-rank<r>.json`` says whether the process
  still holds a process group and how many gloo worker threads it still runs.
* ``HF_VANILLA_BLOCK_AT_STEP=N``: after optimizer step N, write ``blocked`` into the record folder, print
  ``train_driver: blocked after step N`` and wait until a signal arrives (the fault tests then send
  SIGTERM, SIGINT or SIGKILL).
* ``HF_VANILLA_TEST_FSDP_ON_CPU=1``: a test-only shim (:func:`allow_fsdp_on_cpu`) that lets Accelerate
  apply FSDP to a CPU (gloo) run, which accelerate 1.15 enables only for GPU-type modes.
"""

from __future__ import annotations

import hashlib
import json
import os
import runpy
import select
import signal
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch.distributed
from accelerate.state import AcceleratorState
from accelerate.utils import DistributedType
from helpers import gloo_threads
from safetensors.torch import save_file
from torch.distributed.tensor import DTensor
from transformers import TrainerCallback

import hf_vanilla.training.run as training
from hf_vanilla.training.resilience import SaveOnSignalCallback

ROOT = Path(__file__).resolve().parents[1]
RECORD_DIR = os.environ.get("HF_VANILLA_RECORD_DIR")
BLOCK_AT_STEP = int(os.environ.get("HF_VANILLA_BLOCK_AT_STEP", "0"))


def allow_fsdp_on_cpu() -> None:
    """Test only: make ``AcceleratorState`` honour an FSDP plugin on ``MULTI_CPU`` (gloo).

    accelerate 1.15 switches to ``DistributedType.FSDP`` only for GPU-type modes and silently keeps DDP
    on CPU (which the training script refuses). ``torch.distributed.fsdp.fully_shard`` itself works on
    CPU with gloo, so this shim does exactly what accelerate does for a GPU mode, on ``MULTI_CPU``.
    """
    original = AcceleratorState.__init__

    def init(self: AcceleratorState, *args: Any, fsdp_plugin: Any = None, **kwargs: Any) -> None:
        original(self, *args, fsdp_plugin=fsdp_plugin, **kwargs)
        # Every AcceleratorState() copies PartialState's MULTI_CPU back in: set FSDP again each time.
        plugin = fsdp_plugin if fsdp_plugin is not None else getattr(self, "fsdp_plugin", None)
        if plugin is not None and self.distributed_type == DistributedType.MULTI_CPU:
            self.distributed_type = DistributedType.FSDP
            if fsdp_plugin is not None and self._mixed_precision != "no":
                fsdp_plugin.set_mixed_precision(self._mixed_precision)
            self.fsdp_plugin = plugin

    AcceleratorState.__init__ = init


class Recorder(TrainerCallback):
    def __init__(self, trainer: Any, record_dir: Path) -> None:
        self.trainer, self.dir = trainer, record_dir
        self.rank = trainer.args.process_index

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        backend = self.trainer.processing_class.backend_tokenizer.to_str()
        info = {
            "rank": args.process_index,
            "world_size": args.world_size,
            "pid": os.getpid(),
            "tokenizer_sha256": hashlib.sha256(backend.encode()).hexdigest(),
            "distributed_type": str(self.trainer.accelerator.distributed_type),
            "sharded": any(isinstance(p, DTensor) for p in kwargs["model"].parameters()),
        }
        (self.dir / f"rank-{self.rank}.json").write_text(json.dumps(info))

    def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None, **kwargs: Any) -> None:
        with (self.dir / f"logs-rank{self.rank}.jsonl").open("a") as handle:
            handle.write(json.dumps({"step": state.global_step, **(logs or {})}) + "\n")

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        model = kwargs["model"]
        params = {  # an FSDP-sharded parameter (DTensor) is gathered whole, by every rank together
            k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().to("cpu").clone().contiguous()
            for k, v in model.state_dict().items()
        }
        save_file(params, str(self.dir / f"params-rank{self.rank}.safetensors"))


class BlockAtStep(TrainerCallback):
    """Stops the run after step N until a signal arrives (then SaveOnSignalCallback acts, if present)."""

    def __init__(self, trainer: Any, record_dir: Path, step: int) -> None:
        self.trainer, self.dir, self.step = trainer, record_dir, step

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step != self.step:
            return
        savers = [
            cb for cb in self.trainer.callback_handler.callbacks if isinstance(cb, SaveOnSignalCallback)
        ]
        # The interpreter writes the number of every signal that arrives into the wakeup pipe (a signal
        # sent before select() waits is still there), and runs the Python handler before returning.
        read_end, write_end = os.pipe()
        os.set_blocking(write_end, False)
        previous = signal.set_wakeup_fd(write_end)
        try:
            (self.dir / "blocked").write_text(str(os.getpid()))
            print(f"train_driver: blocked after step {self.step}", flush=True)
            deadline = time.monotonic() + 300
            while not any(cb.received is not None for cb in savers):
                if not select.select([read_end], [], [], max(deadline - time.monotonic(), 0))[0]:
                    raise TimeoutError("train_driver: nobody sent the signal within 300 s.")
                os.read(read_end, 64)
        finally:
            signal.set_wakeup_fd(previous)
            os.close(read_end)
            os.close(write_end)


class InstrumentedTrainer(training.PaperSeq2SeqTrainer):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if RECORD_DIR is None:
            return
        record_dir = Path(RECORD_DIR)
        record_dir.mkdir(parents=True, exist_ok=True)
        self.add_callback(Recorder(self, record_dir))
        if BLOCK_AT_STEP:
            self.add_callback(BlockAtStep(self, record_dir, BLOCK_AT_STEP))
        if self.compute_metrics is not None:
            self.compute_metrics = self._recording(self.compute_metrics, record_dir)

    def _recording(self, compute_metrics: Any, record_dir: Path) -> Any:
        calls = {"n": 0}
        tokenizer = self.processing_class

        def decode(ids: np.ndarray) -> list[str]:
            ids = np.where(ids < 0, tokenizer.pad_token_id, ids)
            return tokenizer.batch_decode(ids, skip_special_tokens=True)

        def wrapped(prediction: Any) -> dict[str, float]:
            metrics = compute_metrics(prediction)
            predictions = prediction.predictions
            predictions = predictions[0] if isinstance(predictions, tuple) else predictions
            record = {
                "hypotheses": decode(predictions),
                "references": decode(prediction.label_ids),
                "prediction_ids": np.asarray(predictions).tolist(),
                "metrics": metrics,
            }
            path = record_dir / f"eval-rank{self.args.process_index}-{calls['n']}.json"
            path.write_text(json.dumps(record))
            calls["n"] += 1
            return metrics

        return wrapped


training.PaperSeq2SeqTrainer = InstrumentedTrainer
if os.environ.get("HF_VANILLA_TEST_FSDP_ON_CPU") == "1":
    allow_fsdp_on_cpu()


def record_exit(record_dir: Path) -> None:
    """Write ``exit-rank<r>.json``: whether this process still holds a process group as the script ends,
    and whether the group is really gone (its gloo threads; see ``end_process_group``). Only where the
    run recorded."""
    if record_dir.is_dir():
        state = {"process_group_alive": torch.distributed.is_initialized(), "gloo_threads": gloo_threads()}
        (record_dir / f"exit-rank{os.environ.get('RANK', '0')}.json").write_text(json.dumps(state))


if __name__ == "__main__":
    sys.argv[0] = str(ROOT / "scripts" / "train.py")
    try:
        runpy.run_path(str(ROOT / "scripts" / "train.py"), run_name="__main__")
    finally:
        if RECORD_DIR is not None:
            record_exit(Path(RECORD_DIR))
