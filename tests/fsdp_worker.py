"""FSDP2 (``torch.distributed.fsdp.fully_shard``) on CPU over gloo, for tests/training/test_fsdp.py.

Launched as ``torchrun --nproc_per_node 2 tests/fsdp_worker.py OUT [options]``. Each process builds the
tiny model (seed 0, no dropout), shards every encoder and decoder layer and then the root (which keeps
the shared embedding / pre-softmax matrix of §3.4), and trains on its half of each global batch of
:data:`GLOBAL_BATCH` rows (:func:`global_batch`; the test's 1-process reference uses the same
batches). Writes into OUT:

* ``info.json``: world size, whether the three uses of the shared matrix are still one parameter after
  sharding, and the shapes each rank holds locally;
* ``final.safetensors`` (rank 0): the full parameters after the last step; ``gradients.safetensors``:
  each step's reduced gradients, gathered whole (``<step>/<name>``);
* with ``--save_at K``: ``checkpoint-K/`` holding a sharded ``torch.distributed.checkpoint`` of model
  and optimizer (``dcp/``, each rank writes its shards) and the consolidated model (rank 0,
  ``save_pretrained``: ``model.safetensors`` + config, what ``from_pretrained`` reads).

``--resume_from checkpoint-K`` loads the sharded model and optimizer state and continues to
``--steps``.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from helpers import tiny_config
from safetensors.torch import save_file
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

from hf_vanilla import VanillaTransformerForConditionalGeneration
from hf_vanilla.training.sharded_loading import tie_state_dict

GLOBAL_BATCH = 8
LEARNING_RATE = 1e-3


def global_batch(step: int) -> dict[str, torch.Tensor]:
    """The global batch of ``step`` (1-based): 8 rows, ragged (padding in sources, -100 in labels)."""
    generator = torch.Generator().manual_seed(1000 + step)
    input_ids = torch.randint(4, 100, (GLOBAL_BATCH, 11), generator=generator)
    labels = torch.randint(4, 100, (GLOBAL_BATCH, 9), generator=generator)
    source_lengths = torch.randint(5, 12, (GLOBAL_BATCH,), generator=generator)
    target_lengths = torch.randint(4, 10, (GLOBAL_BATCH,), generator=generator)
    positions_s, positions_t = torch.arange(11), torch.arange(9)
    attention_mask = (positions_s[None] < source_lengths[:, None]).long()
    input_ids = input_ids.masked_fill(attention_mask == 0, 0)
    labels = labels.masked_fill(positions_t[None] >= target_lengths[:, None], -100)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def build_model(attention_bias: bool = False) -> VanillaTransformerForConditionalGeneration:
    """The tiny model, seed 0, no dropout. ``attention_bias`` adds Q/K/V/O biases: the key bias's
    gradient is zero in exact arithmetic (softmax ignores a shift shared by all keys), so in float32 it
    is rounding noise — the case where Adam amplifies a summation-order difference most."""
    torch.manual_seed(0)
    config = tiny_config(dropout=0.0, attention_bias=attention_bias)
    return VanillaTransformerForConditionalGeneration(config).train()


def build_optimizer(model: torch.nn.Module, name: str, eps: float) -> torch.optim.Optimizer:
    if name == "sgd":
        return torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)
    return torch.optim.Adam(model.parameters(), lr=LEARNING_RATE, betas=(0.9, 0.98), eps=eps)


def backward(model: torch.nn.Module, step: int, rank: int, world: int) -> float:
    """Gradients of step ``step`` from this rank's rows of the global batch. The loss is this rank's
    summed token loss over the *global* token count (the Trainer's ``num_items_in_batch``), times
    ``world`` because FSDP averages the gradients over the ranks: the reduced gradient is that of the
    global mean."""
    batch = global_batch(step)
    tokens = int((batch["labels"] != -100).sum())
    rows = slice(rank * GLOBAL_BATCH // world, (rank + 1) * GLOBAL_BATCH // world)
    local = {key: value[rows] for key, value in batch.items()}
    loss = model(**local, num_items_in_batch=tokens).loss * world
    loss.backward()
    return float(loss.detach())


def full_gradients(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter's whole gradient (gathered from the shards: a collective, on every rank)."""
    return {
        name: (p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad).detach().clone()
        for name, p in model.named_parameters()
    }


def shard(model: VanillaTransformerForConditionalGeneration) -> None:
    """One FSDP unit per layer (the model's ``_no_split_modules``), then the root."""
    for layer in [*model.model.encoder.layers, *model.model.decoder.layers]:
        fully_shard(layer)
    fully_shard(model)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--optimizer", choices=["sgd", "adam"], default="sgd")
    parser.add_argument("--eps", type=float, default=1e-9)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--save_at", type=int, default=0)
    parser.add_argument("--resume_from", type=Path)
    parser.add_argument("--attention_bias", action="store_true")
    args = parser.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    args.out.mkdir(parents=True, exist_ok=True)

    model = build_model(args.attention_bias)
    shard(model)
    shared = model.model.shared.weight
    tied = {
        "lm_head": model.lm_head.weight is shared,
        "encoder": model.model.encoder.embed_tokens.weight is shared,
        "decoder": model.model.decoder.embed_tokens.weight is shared,
        "dtensor": type(shared).__name__,
    }
    optimizer = build_optimizer(model, args.optimizer, args.eps)
    start = 0
    if args.resume_from is not None:
        model_state, optimizer_state = get_state_dict(model, optimizer)
        state = {"model": model_state, "optimizer": optimizer_state}
        dcp.load(state, checkpoint_id=str(args.resume_from / "dcp"))
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
        start = args.save_at
    local_shapes = {name: list(p.to_local().shape) for name, p in model.named_parameters()}
    if rank == 0:
        info = {"world_size": world, "tied": tied, "local_shapes": local_shapes}
        (args.out / "info.json").write_text(json.dumps(info))

    losses, gradients = [], {}
    for step in range(start + 1, args.steps + 1):
        losses.append(backward(model, step, rank, world))
        gradients.update({f"{step}/{k}": v for k, v in full_gradients(model).items()})
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step == args.save_at and args.resume_from is None:
            folder = args.out / f"checkpoint-{step}"
            model_state, optimizer_state = get_state_dict(model, optimizer)
            dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=str(folder / "dcp"))
            full = get_model_state_dict(
                model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
            )
            if rank == 0:  # gathered copies re-tied, so the shared matrix is written once
                model.save_pretrained(folder, state_dict=tie_state_dict(model, full))
            dist.barrier()  # as the Trainer does around a checkpoint: no rank trains on while one writes

    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank == 0:
        save_file({k: v.clone().contiguous() for k, v in full.items()}, str(args.out / "final.safetensors"))
        save_file(gradients, str(args.out / "gradients.safetensors"))
        (args.out / "losses.json").write_text(json.dumps(losses))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    main()
