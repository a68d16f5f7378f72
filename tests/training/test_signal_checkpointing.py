"""transformers' own signal checkpointing (``TrainingArguments.enable_jit_checkpoint``) next to
:class:`hf_vanilla.training.resilience.SaveOnSignalCallback`: the differences docs/reliability.md names, pinned here
so that the page is revisited when transformers closes them."""

from __future__ import annotations

import inspect
import signal
from pathlib import Path

from helpers import tiny_model
from transformers import Seq2SeqTrainer, Seq2SeqTrainingArguments
from transformers.trainer_jit_checkpoint import CheckpointManager, JITCheckpointCallback
from transformers.trainer_utils import get_last_checkpoint


def test_the_trainers_jit_checkpoint_lacks_what_save_on_signal_gives(tmp_path: Path) -> None:
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    args = Seq2SeqTrainingArguments(
        output_dir=str(tmp_path), enable_jit_checkpoint=True, use_cpu=True, report_to="none"
    )
    Seq2SeqTrainer(model=tiny_model(), args=args)  # installs its SIGTERM handler at construction
    try:
        handler = signal.getsignal(signal.SIGTERM)
        manager = getattr(handler, "__self__", None)
        assert isinstance(manager, CheckpointManager)
        # 1. SIGTERM only: Ctrl-C (SIGINT) saves nothing
        assert signal.getsignal(signal.SIGINT) is before[signal.SIGINT]
        # 2. the checkpoint is requested kill_wait seconds after the signal (a timer thread)
        assert manager.kill_wait == 3
        # 3. a second SIGTERM is ignored instead of stopping at once
        manager.is_checkpoint_requested = True
        manager._sigterm_handler(signal.SIGTERM, None)
        assert signal.getsignal(signal.SIGTERM) == handler
        # 4. no agreement between processes (a per-process flag, no collective), and 5. training ends
        #    normally afterwards (what follows training still runs, status 0), no 128 + signal exit
        source = inspect.getsource(CheckpointManager) + inspect.getsource(JITCheckpointCallback)
        assert not any(
            word in source for word in ("all_reduce", "broadcast", "barrier", "sys.exit", "os._exit")
        )
        assert "should_training_stop = True" in source
        # 6. the checkpoint is written in place, marked by a sentinel file that resuming does not read
        assert "checkpoint-is-incomplete" in source
        assert "incomplete" not in inspect.getsource(get_last_checkpoint)
    finally:
        for sig, previous in before.items():
            signal.signal(sig, previous)
