"""Mixed precision for training: which native bfloat16 instructions the CPU has, what ``--bf16``
(``auto``, true or false) means on the device the run trains on, and the line that logs the choice.

``--bf16`` trains in bfloat16 autocast through the Trainer's own route (accelerate wraps the model's
forward in ``torch.autocast``): the weights, the gradients and Adam's state stay float32, and so do
saved checkpoints. On a CPU it is allowed only where the CPU computes bfloat16 in hardware
(AVX512-BF16 or AMX on x86, the BF16 extension on Arm): elsewhere autocast emulates bfloat16 in
software, which loses precision and time (a recipe-sized step took 3.6 times as long as in float32 on
an AMX CPU whose oneDNN was kept off its bfloat16 instructions).
"""

from __future__ import annotations

from argparse import ArgumentTypeError
from pathlib import Path

import torch
from transformers.hf_argparser import string_to_bool
from transformers.utils import is_torch_bf16_gpu_available

__all__ = ["choose_bf16", "cpu_bf16_instructions", "describe_precision", "trains_on_cpu"]

#: Where Linux lists the CPU's features (x86 ``flags``, Arm ``Features``).
_CPUINFO = Path("/proc/cpuinfo")


def cpu_bf16_instructions() -> str | None:
    """The CPU's native bfloat16 instructions, by name: ``"AMX"`` or ``"AVX512-BF16"`` (x86, from torch's
    own CPU feature detection, on any system), ``"Arm BF16"`` (the ``bf16`` feature Linux lists for an
    Arm CPU), or ``None`` where it has none."""
    if getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)():
        return "AMX"
    if getattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)():
        return "AVX512-BF16"
    try:
        cpuinfo = _CPUINFO.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    for line in cpuinfo.splitlines():
        name, _, value = line.partition(":")
        if name.strip() == "Features" and "bf16" in value.split():
            return "Arm BF16"
    return None


def trains_on_cpu(use_cpu: bool) -> bool:
    """Whether the run trains on the CPU: ``--use_cpu``, or no accelerator torch can use."""
    return use_cpu or not torch.accelerator.is_available()


def choose_bf16(requested: str | bool, use_cpu: bool) -> bool:
    """``--bf16`` as the bool transformers reads: ``auto`` is true where the run's device computes
    bfloat16 natively (a CPU with :func:`cpu_bf16_instructions`, a GPU transformers finds bf16 on), and
    true or false (any spelling ``--flag`` takes) are themselves. ``ValueError`` for another value, and for
    an explicit true on a CPU without native bfloat16."""
    if isinstance(requested, str) and requested.lower() == "auto":
        if trains_on_cpu(use_cpu):
            return cpu_bf16_instructions() is not None
        return is_torch_bf16_gpu_available()
    try:
        wanted = string_to_bool(requested)
    except ArgumentTypeError as error:
        raise ValueError(
            f"--bf16 {requested}: expected auto, true or false; nothing was done. Pass --bf16 auto to train in "
            "bfloat16 where the device computes it natively."
        ) from error
    if wanted and trains_on_cpu(use_cpu) and cpu_bf16_instructions() is None:
        raise ValueError(
            "--bf16: this run trains on a CPU without native bfloat16 instructions (AVX512-BF16, AMX or Arm "
            "BF16), where autocast would emulate bfloat16: several times slower than float32 and less precise; "
            "nothing was done. Drop --bf16 (float32), or pass --bf16 auto to use bfloat16 only where the CPU "
            "has it."
        )
    return wanted


def describe_precision(bf16: bool, fp16: bool, device: torch.device) -> str:
    """The precision a run trains in, as one log line says it, with the CPU's bfloat16 instructions
    where it trains on a CPU."""
    if fp16:
        return "float16 autocast with loss scaling; weights, gradients and optimizer state in float32"
    if bf16 and device.type == "cpu":
        return (
            f"bfloat16 autocast on the CPU ({cpu_bf16_instructions()}); weights, gradients and optimizer "
            "state in float32"
        )
    if bf16:
        return "bfloat16 autocast; weights, gradients and optimizer state in float32"
    if device.type != "cpu":
        return "float32"
    instructions = cpu_bf16_instructions()
    if instructions is None:
        return "float32 (this CPU has no native bfloat16 instructions: AVX512-BF16, AMX or Arm BF16)"
    return f"float32 (this CPU has {instructions}: --bf16 auto would train in bfloat16 autocast)"
