"""Loading a full (unsharded) state dict into a model sharded with FSDP2 ``fully_shard``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from hf_vanilla.io.errors import CorruptCheckpointError, damaged_file_hint
from hf_vanilla.io.safe_loading import verify_safetensors_file

__all__ = ["load_full_state_dict_into_sharded", "tie_state_dict"]


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
