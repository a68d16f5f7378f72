"""Reduced-precision CPU inference through the ecosystem's own routes, by name.

Each route is what a user would write by hand; this module only names them, so that the command lines
(``--quantization``) and ``benchmarks/marian/run.py`` run the same code:

======================== =========================================================================
route                    what it is
======================== =========================================================================
``none``                 fp32, as saved
``dynamic-int8``         ``torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, dtype=qint8)``
                         after loading: int8 weights (per tensor) and activations quantized per call,
                         fbgemm kernels; every projection including the tied output projection
``torchao-int8-weight``  ``from_pretrained(..., quantization_config=TorchAoConfig(
                         Int8WeightOnlyConfig()))``: int8 weights, fp32 activations
``torchao-int8-dynamic`` ``TorchAoConfig(Int8DynamicActivationInt8WeightConfig())``: int8 weights
                         and int8 activations quantized per call
``bf16``                 ``from_pretrained(..., dtype=torch.bfloat16)``: bf16 weights and activations
======================== =========================================================================

transformers' torchao route quantizes the ``nn.Linear`` weights it loads from the checkpoint and, by
default, leaves the input and output embeddings alone: here the output projection is tied to the
embedding (§3.4) and stays fp32 (its quarter of the decoder's weight bytes at vocabulary 32k included).
All routes run on the CPU; ``dynamic-int8`` runs only there (fbgemm).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

#: The routes :func:`from_pretrained_kwargs` and :func:`quantize_loaded` know, in the order of the table.
ROUTES = ("none", "dynamic-int8", "torchao-int8-weight", "torchao-int8-dynamic", "bf16")

__all__ = ["ROUTES", "check_route", "from_pretrained_kwargs", "quantize_loaded"]


def check_route(route: str, device: torch.device | str = "cpu") -> None:
    """Refuse an unknown route, and ``dynamic-int8`` off the CPU (its kernels are CPU-only)."""
    if route not in ROUTES:
        raise ValueError(f"Unknown quantization {route!r}: choose one of {', '.join(ROUTES)}.")
    if route == "dynamic-int8" and torch.device(device).type != "cpu":
        raise ValueError(
            f"Quantization 'dynamic-int8' runs on the CPU only (fbgemm kernels), not on {device}: "
            "use --device cpu, or a torchao route or bf16 on a GPU."
        )


def _torchao_config(route: str) -> Any:
    try:
        from torchao.quantization import Int8DynamicActivationInt8WeightConfig, Int8WeightOnlyConfig
    except ImportError as err:
        raise ImportError(
            f"Quantization {route!r} needs torchao: pip install 'hf_vanilla[quant]' (or pip install torchao)."
        ) from err
    from transformers import TorchAoConfig

    scheme = (
        Int8WeightOnlyConfig() if route == "torchao-int8-weight" else Int8DynamicActivationInt8WeightConfig()
    )
    return TorchAoConfig(scheme)


def from_pretrained_kwargs(route: str) -> dict[str, Any]:
    """The keyword arguments of ``from_pretrained`` for ``route`` (empty where the route acts after
    loading, see :func:`quantize_loaded`)."""
    check_route(route)
    if route.startswith("torchao-"):
        return {"quantization_config": _torchao_config(route)}
    if route == "bf16":
        return {"dtype": torch.bfloat16}
    return {}


def quantize_loaded(model: nn.Module, route: str) -> nn.Module:
    """What ``route`` does to a loaded model: ``dynamic-int8`` swaps every ``nn.Linear`` (in place) for
    ``torch.ao.nn.quantized.dynamic.Linear``; the other routes acted at loading, and the model is
    returned as it is."""
    check_route(route)
    if route == "dynamic-int8":
        return torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8, inplace=True)
    return model
