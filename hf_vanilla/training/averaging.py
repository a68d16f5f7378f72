"""Checkpoint averaging (Vaswani et al., 2017, §6.1).

"For the base models, we used a single model obtained by averaging the last 5 checkpoints, which
were written at 10-minute intervals. For the big models, we averaged the last 20 checkpoints."

:func:`average_checkpoints` takes the element-wise mean of the parameters of several Trainer
checkpoints (``checkpoint-<step>`` folders) and writes an ordinary model folder that
``AutoModelForSeq2SeqLM.from_pretrained`` loads: ``config.json``, ``model.safetensors``,
``generation_config.json`` (from the newest checkpoint), and the tokenizer files and the run's
``training_args.json`` when the checkpoint has them. Weights are read from safetensors files only
(never unpickled). The averaged state is loaded into a model built from the newest checkpoint and
written with ``save_pretrained``, so tied
weights (the shared embedding / pre-softmax matrix of §3.4) are stored exactly as the model stores
them.
"""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Sequence
from pathlib import Path

import torch
from safetensors import safe_open
from transformers import PreTrainedModel

from hf_vanilla.hub.folder import TRAINING_ARGS_JSON, save_model_folder
from hf_vanilla.hub.record import read_training_record, write_training_record
from hf_vanilla.io.atomic import atomic_directory, refuse_to_replace
from hf_vanilla.io.checked_loading import load_pretrained_checked
from hf_vanilla.io.checkpoints import find_complete_checkpoints, pinned_checkpoints
from hf_vanilla.io.errors import CheckpointDeletedError
from hf_vanilla.io.safe_loading import nonfinite_tensors, refuse_nonfinite, verify_safetensors_file

logger = logging.getLogger(__name__)

#: Tokenizer files copied from the newest checkpoint into the averaged model folder.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
)
SAFETENSORS_NAME = "model.safetensors"
SAFETENSORS_INDEX_NAME = "model.safetensors.index.json"

__all__ = [
    "average_checkpoints",
    "average_last_checkpoints",
    "average_state_dicts",
    "load_safetensors_state_dict",
]


def load_safetensors_state_dict(checkpoint: str | Path) -> dict[str, torch.Tensor]:
    """All tensors of a checkpoint folder's ``model.safetensors`` (or its sharded index), on CPU.

    Pickled weights (``pytorch_model.bin``) are refused: loading them can run arbitrary code.
    """
    checkpoint = Path(checkpoint)
    if not checkpoint.is_dir():
        raise FileNotFoundError(f"Checkpoint folder {str(checkpoint)!r} does not exist.")
    single, index = checkpoint / SAFETENSORS_NAME, checkpoint / SAFETENSORS_INDEX_NAME
    if single.is_file():
        files = [single]
    elif index.is_file():
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        files = [checkpoint / name for name in sorted(set(weight_map.values()))]
    else:
        pickled = sorted(p.name for p in checkpoint.glob("pytorch_model*.bin"))
        hint = (
            f" It holds pickled weights ({', '.join(pickled)}), which are not read for safety: load the model "
            "and re-save it with `save_pretrained` (safetensors is the default)."
            if pickled
            else ""
        )
        raise FileNotFoundError(
            f"No {SAFETENSORS_NAME} or {SAFETENSORS_INDEX_NAME} in {str(checkpoint)!r}.{hint}"
        )
    state: dict[str, torch.Tensor] = {}
    for file in files:
        verify_safetensors_file(file)  # truncated or damaged: an error naming the file
        with safe_open(str(file), framework="pt", device="cpu") as handle:
            for key in handle.keys():  # noqa: SIM118 (safe_open handles are not iterable)
                state[key] = handle.get_tensor(key)
    return state


def average_state_dicts(
    states: Sequence[dict[str, torch.Tensor]], names: Sequence[str] | None = None
) -> dict[str, torch.Tensor]:
    """Element-wise mean of several state dicts with the same keys and shapes.

    Floating-point tensors are summed in float64 and cast back to their own dtype; other tensors
    (integer buffers) must be equal in all states and are copied.
    """
    if not states:
        raise ValueError("Nothing to average: give at least one checkpoint.")
    names = list(names) if names is not None else [f"state {i}" for i in range(len(states))]
    reference, reference_name = states[0], names[0]
    for state, name in zip(states[1:], names[1:], strict=True):
        if state.keys() != reference.keys():
            only_here = sorted(state.keys() - reference.keys())[:5]
            only_there = sorted(reference.keys() - state.keys())[:5]
            raise ValueError(
                f"Checkpoints {reference_name} and {name} hold different parameters (only in {name}: {only_here}; "
                f"only in {reference_name}: {only_there}). Average checkpoints of the same model only."
            )
        for key, tensor in state.items():
            if tensor.shape != reference[key].shape:
                raise ValueError(
                    f"Parameter {key!r} has shape {tuple(reference[key].shape)} in {reference_name} but "
                    f"{tuple(tensor.shape)} in {name}. Average checkpoints of the same model only."
                )
    averaged: dict[str, torch.Tensor] = {}
    for key, first in reference.items():
        if first.is_floating_point():
            total = torch.zeros(first.shape, dtype=torch.float64)
            for state in states:
                total += state[key].to(torch.float64)
            averaged[key] = (total / len(states)).to(first.dtype)
        else:
            for state, name in zip(states[1:], names[1:], strict=True):
                if not torch.equal(state[key], first):
                    raise ValueError(
                        f"Non-floating-point tensor {key!r} differs between {reference_name} and {name}; it cannot "
                        "be averaged."
                    )
            averaged[key] = first.clone()
    return averaged


def _load_into_model(model: PreTrainedModel, state: dict[str, torch.Tensor], source: str) -> None:
    """Load ``state`` into ``model``; keys missing from the file must be tied to keys that are in it."""
    result = model.load_state_dict(state, strict=False)
    if result.unexpected_keys:
        raise ValueError(
            f"The checkpoints hold parameters the model in {source} does not have: {result.unexpected_keys[:5]}."
        )
    params = model.state_dict()
    loaded_ptrs = {params[key].data_ptr() for key in state if key in params}
    untied = [key for key in result.missing_keys if params[key].data_ptr() not in loaded_ptrs]
    if untied:
        raise ValueError(f"The checkpoints lack parameters of the model in {source}: {untied[:5]}.")


def average_checkpoints(
    checkpoints: Sequence[str | Path], output_dir: str | Path, overwrite: bool = False
) -> Path:
    """Average the parameters of ``checkpoints`` (§6.1) into a ``from_pretrained``-able folder.

    The configuration, generation configuration and tokenizer files come from the last checkpoint
    of the list (pass them oldest first, as :func:`~hf_vanilla.io.checkpoints.find_complete_checkpoints` returns them). Every checkpoint is
    checked as resuming checks it (:func:`~hf_vanilla.io.checkpoints.verify_checkpoint`, its
    ``checksums.sha256`` included) and read from a pinned snapshot
    (:func:`~hf_vanilla.io.checkpoints.pinned_checkpoints`), so a training run rotating its
    checkpoints meanwhile takes nothing away mid-read. Returns ``output_dir``. An existing
    ``output_dir`` (other than an empty folder) is refused with
    ``FileExistsError`` unless ``overwrite``; a folder that holds one of the checkpoints (the run
    folder itself, say) is always refused. The result is written to a temporary folder and renamed
    into place when complete, so a failure leaves the old folder as it was.
    """
    paths = [Path(c) for c in checkpoints]
    if not paths:
        raise ValueError("Nothing to average: give at least one checkpoint folder.")
    missing = [str(p) for p in paths if not p.is_dir()]
    if missing:
        raise FileNotFoundError(f"Checkpoint folder(s) not found: {', '.join(missing)}.")
    if len({p.resolve() for p in paths}) != len(paths):
        raise ValueError(f"A checkpoint is listed twice: {[str(p) for p in paths]}.")
    output_dir = Path(output_dir)
    inside = [p for p in paths if output_dir.resolve() in (p.resolve(), *p.resolve().parents)]
    if inside:
        raise ValueError(
            f"--output_dir {str(output_dir)!r} holds the checkpoint {str(inside[0])!r}: replacing it would delete "
            "the checkpoints being averaged (the training run). Choose a new folder, e.g. "
            f"{str(inside[0].parent / 'averaged')!r}."
        )
    refuse_to_replace(output_dir, overwrite, "--output_dir")

    logger.info("Averaging %d checkpoints: %s", len(paths), ", ".join(p.name for p in paths))
    with pinned_checkpoints(paths) as pinned:  # verified, and kept whole while a training run rotates
        _average_pinned(paths, pinned, output_dir)
    logger.info("Wrote the average of %d checkpoints to %s", len(paths), output_dir)
    return output_dir


def _average_pinned(paths: Sequence[Path], pinned: Sequence[Path], output_dir: Path) -> None:
    """Average the snapshots ``pinned`` of the checkpoints ``paths`` (:func:`average_checkpoints`)."""
    states = [load_safetensors_state_dict(p) for p in pinned]
    for path, state in zip(paths, states, strict=True):
        refuse_nonfinite(path, nonfinite_tensors(state.items()))  # a diverged checkpoint poisons the mean
    averaged = average_state_dicts(states, names=[str(p) for p in paths])
    del states

    newest = pinned[-1]
    model = load_pretrained_checked(newest)  # its config must describe the averaged weights
    _load_into_model(model, averaged, str(paths[-1]))
    with atomic_directory(output_dir) as staged:  # an old average stays whole until the new one is
        copied = []
        for name in TOKENIZER_FILES:  # first: the folder's manifest lists the tokenizer files
            if (newest / name).is_file():
                shutil.copy2(newest / name, staged / name)
                copied.append(name)
        save_model_folder(model, None, staged)  # self-contained: the modeling code travels with it
        if not copied:
            logger.warning("%s has no tokenizer files; the averaged model folder has none either.", paths[-1])
        if (newest / TRAINING_ARGS_JSON).is_file():  # the run's arguments: the card's data among them
            shutil.copy2(newest / TRAINING_ARGS_JSON, staged / TRAINING_ARGS_JSON)
        record = read_training_record(newest)
        if record is not None:  # the run's record, now of the averaged weights
            write_training_record(
                staged,
                trained_with=f"{record['trained_with']}, averaging {len(paths)} of its checkpoints",
                title=record.get("title"),
                dataset=record.get("dataset"),
                source_lang=record.get("source_lang"),
                target_lang=record.get("target_lang"),
                example_sources=record.get("example_sources") or [],
            )
        (staged / "averaged_checkpoints.json").write_text(
            json.dumps({"averaged_checkpoints": [str(p) for p in paths]}, indent=2) + "\n", encoding="utf-8"
        )


def average_last_checkpoints(
    run_dir: str | Path, last_n: int, output_dir: str | Path, overwrite: bool = False
) -> Path:
    """Average the last ``last_n`` checkpoints (by step) of a training run into ``output_dir``
    (§6.1: the paper averaged the last 5 checkpoints of its base models, the last 20 of its big ones).
    ``overwrite``: as in :func:`average_checkpoints`."""
    if isinstance(last_n, bool) or not isinstance(last_n, int) or last_n < 1:
        raise ValueError(f"The number of checkpoints to average must be a positive integer, got {last_n!r}.")
    if not Path(run_dir).is_dir():
        raise FileNotFoundError(f"Training output folder {str(run_dir)!r} does not exist.")
    found = find_complete_checkpoints(run_dir)
    if not found:
        raise FileNotFoundError(
            f"No whole checkpoint-<step> folders in {str(run_dir)!r}. Train with checkpoints (--save_steps) or give "
            "the checkpoint folders explicitly."
        )
    if len(found) < last_n:
        raise ValueError(
            f"Asked to average the last {last_n} checkpoints but {str(run_dir)!r} has only {len(found)} "
            f"({', '.join(p.name for p in found)}). Lower the number, or save more often (--save_steps) and keep "
            "more (--save_total_limit)."
        )
    chosen = found[-last_n:]
    gone = [p for p in chosen if not p.is_dir()]  # rotated away since they were listed
    if gone:
        raise CheckpointDeletedError(gone[0])
    return average_checkpoints(chosen, output_dir, overwrite)
