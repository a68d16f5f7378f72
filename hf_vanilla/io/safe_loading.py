"""Loading safety: a checkpoint or model folder is checked before anything in it is loaded.

What this module guarantees, for every function that reads a folder:

* **Nothing is unpickled to check it.** Weights are read from safetensors; a pickled file
  (``optimizer.pt``, ``rng_state.pth``, ``pytorch_model.bin``, ...) is disassembled statically and
  passes only when it holds plain tensors, containers and numpy arrays —
  ``torch.load(weights_only=True)``'s allowlist, which the Trainer itself uses when it resumes. A file
  whose unpickling would import anything else (``os.system``, ``builtins.eval``, a user class) raises
  :class:`UnsafeCheckpointError`. ``training_args.bin`` is a full pickle of the arguments, written for
  reference and read by nothing; it is not checked and must never be ``torch.load``-ed with
  ``weights_only=False``.
* **A damaged file is named, not crashed on** (:func:`verify_model_folder`, and for a Trainer checkpoint
  :func:`hf_vanilla.io.checkpoints.verify_checkpoint`).
  A folder is whole when its ``config.json`` parses, every ``*.safetensors`` file is as long as its
  header says, a Trainer checkpoint's ``trainer_state.json`` (written last) names the folder's step, and
  a ``checksums.sha256`` manifest (:func:`write_checksums`, :func:`hf_vanilla.io.manifest.write_manifest`),
  when present, matches, and ``config.json`` agrees with ``architecture.json``. A failure raises
  :class:`CorruptCheckpointError` naming the file and what to do, instead of a stack trace from inside
  safetensors or pickle.
* **Weights are finite numbers** (:func:`verify_finite_weights`): a diverged run saves NaN, which
  translates into blank lines.

Loading a model after these checks is :mod:`hf_vanilla.io.checked_loading`'s job; what a checkpoint is
and where a run's checkpoints are, :mod:`hf_vanilla.io.checkpoints`'; writing checkpoints so that they
stay whole, and resuming from them, :mod:`hf_vanilla.training.resilience`'s.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable, Sequence
from pathlib import Path

import torch
from safetensors import safe_open

from hf_vanilla.io.checksums import verify_checksums
from hf_vanilla.io.errors import (
    CheckpointError,
    CorruptCheckpointError,
    NonFiniteWeightsError,
    damaged_file_hint,
)
from hf_vanilla.io.json_files import read_json
from hf_vanilla.io.manifest import export_kind, verify_config
from hf_vanilla.io.numbers import non_finite_names
from hf_vanilla.io.pickles import verify_pickle_file

__all__ = [
    "nonfinite_tensors",
    "refuse_nonfinite",
    "verify_finite_weights",
    "verify_model_folder",
    "verify_safetensors_file",
    "weight_files",
]

_SAFETENSORS_MAX_HEADER = 100 * 1024 * 1024

_SAFETENSORS_DTYPE_BYTES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1, "I16": 2, "U16": 2, "F16": 2,
    "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8, "C64": 8,
}  # fmt: skip


# --------------------------------------------------------------------------------------------------
# safetensors
# --------------------------------------------------------------------------------------------------
def verify_safetensors_file(path: str | Path) -> None:
    """Check a ``.safetensors`` file's header and length without reading the tensors.

    The format is an 8-byte little-endian header length, a JSON header giving each tensor's dtype,
    shape and byte range, then the bytes. A file cut short, with a damaged header, or whose tensors
    do not exactly cover the data raises :class:`CorruptCheckpointError` naming the file.
    """
    path = Path(path)
    if not path.is_file():
        raise CorruptCheckpointError(f"{str(path)!r} is missing.{damaged_file_hint(path)}")
    size = path.stat().st_size
    with path.open("rb") as handle:
        prefix = handle.read(8)
        if len(prefix) < 8:
            raise CorruptCheckpointError(
                f"{str(path)!r} is not a safetensors file: only {size} bytes long.{damaged_file_hint(path)}"
            )
        (header_len,) = struct.unpack("<Q", prefix)
        if header_len > min(_SAFETENSORS_MAX_HEADER, size - 8):
            raise CorruptCheckpointError(
                f"{str(path)!r} is damaged: its header claims {header_len} bytes but the file has {size} bytes "
                f"in all.{damaged_file_hint(path)}"
            )
        raw_header = handle.read(header_len)
    try:
        header = json.loads(raw_header)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CorruptCheckpointError(
            f"{str(path)!r} is damaged: its header is not valid JSON ({err}).{damaged_file_hint(path)}"
        ) from err
    if not isinstance(header, dict):
        raise CorruptCheckpointError(f"{str(path)!r} is damaged: its header is not a JSON object.")
    data_len = size - 8 - header_len
    end_max = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            start, end = (int(x) for x in info["data_offsets"])
            count = 1
            for dim in info["shape"]:
                count *= int(dim)
            expected = count * _SAFETENSORS_DTYPE_BYTES.get(info["dtype"], 0)
        except (KeyError, TypeError, ValueError) as err:
            raise CorruptCheckpointError(
                f"{str(path)!r} is damaged: the header entry of tensor {name!r} is malformed ({info!r})."
                f"{damaged_file_hint(path)}"
            ) from err
        if not 0 <= start <= end or (info["dtype"] in _SAFETENSORS_DTYPE_BYTES and end - start != expected):
            raise CorruptCheckpointError(
                f"{str(path)!r} is damaged: tensor {name!r} has byte range {start}..{end}, which does not fit "
                f"its dtype {info['dtype']} and shape {info['shape']}.{damaged_file_hint(path)}"
            )
        end_max = max(end_max, end)
    if end_max != data_len:
        what = "truncated" if end_max > data_len else "longer than its header says"
        raise CorruptCheckpointError(
            f"{str(path)!r} is {what}: the header describes {end_max} bytes of tensor data, the file holds "
            f"{data_len}.{damaged_file_hint(path)}"
        )


# --------------------------------------------------------------------------------------------------
# whole-folder checks
# --------------------------------------------------------------------------------------------------
def verify_model_folder(folder: str | Path, *, checksums: bool = True) -> None:
    """Check a ``save_pretrained`` folder before ``from_pretrained`` reads it.

    ``config.json`` must parse; the weights must be ``model.safetensors`` or a safetensors index with
    all its shards, each whole (:func:`verify_safetensors_file`); pickled weights
    (``pytorch_model*.bin``), when there are no safetensors, must be plain tensors. With
    ``checksums``, a ``checksums.sha256`` manifest is checked too. ``config.json`` must be a valid config
    that does not contradict the folder's ``architecture.json`` (:func:`hf_vanilla.io.manifest.verify_config`).
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"Model folder {str(folder)!r} does not exist.")
    if not (folder / "config.json").is_file():
        raise CorruptCheckpointError(f"{str(folder)!r} has no config.json: it is not a saved model folder.")
    config = read_json(folder / "config.json")
    if (folder / "generation_config.json").is_file():
        read_json(folder / "generation_config.json")
    single, index = folder / "model.safetensors", folder / "model.safetensors.index.json"
    if single.exists():
        verify_safetensors_file(single)
    elif index.exists():
        weight_map = read_json(index).get("weight_map")
        if not isinstance(weight_map, dict):
            raise CorruptCheckpointError(f"{str(index)!r} is damaged: it has no weight_map.")
        for shard in sorted(set(weight_map.values())):
            verify_safetensors_file(folder / shard)
    else:
        pickled = sorted(folder.glob("pytorch_model*.bin"))
        if not pickled:
            export = export_kind(folder)
            if export is not None:
                raise CheckpointError(
                    f"{str(folder)!r} is {export[0]}, not a transformers model folder: this command needs the "
                    f"folder it was exported from. {export[1]}"
                )
            raise CorruptCheckpointError(
                f"{str(folder)!r} holds no weights (no model.safetensors, index or pytorch_model.bin)."
                f"{damaged_file_hint(single)}"
            )
        for path in pickled:
            verify_pickle_file(path)
    if "model_type" not in config:
        raise CorruptCheckpointError(
            f"{str(folder / 'config.json')!r} has no model_type, so no model class can be chosen for it: it was "
            "damaged or written by hand. Restore the config.json saved with these weights (an hf_vanilla model's "
            'has "model_type": "vanilla_transformer").'
        )
    if checksums:
        verify_checksums(folder)
    verify_config(folder)


# --------------------------------------------------------------------------------------------------
# non-finite weights
# --------------------------------------------------------------------------------------------------
def nonfinite_tensors(tensors: Iterable[tuple[str, torch.Tensor]]) -> list[str]:
    """The names of the floating-point tensors among ``tensors`` that hold a NaN or an infinity."""
    return non_finite_names(tensors)


def refuse_nonfinite(folder: str | Path, names: Sequence[str]) -> None:
    """Raise :class:`NonFiniteWeightsError` naming ``folder`` and the first of ``names``, if any."""
    if not names:
        return
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    raise NonFiniteWeightsError(
        f"{str(folder)!r} holds weights that are not finite numbers (NaN or inf) in {len(names)} tensor(s): "
        f"{shown}. The training run diverged before it saved them (or the file is damaged); such a model "
        "translates into blank or garbage lines. Use an earlier checkpoint of the run, or train again with a "
        "lower --learning_rate."
    )


def weight_files(folder: Path) -> list[Path]:
    """The weights files of a model folder: its safetensors file or shards, else its pickled weights."""
    single, index = folder / "model.safetensors", folder / "model.safetensors.index.json"
    if single.exists():
        return [single]
    if index.exists():
        return [folder / shard for shard in sorted(set(read_json(index)["weight_map"].values()))]
    return sorted(folder.glob("pytorch_model*.bin"))


def verify_finite_weights(folder: str | Path, name: str | Path | None = None) -> None:
    """Refuse a model folder whose weights hold NaN or infinity (:class:`NonFiniteWeightsError`, naming
    ``name``, by default ``folder``, and the first tensors as the files name them). Reads every tensor
    once; run it after :func:`verify_model_folder` (pickled weights are read with ``weights_only=True``)."""
    refuse_nonfinite(folder if name is None else name, _nonfinite_weights(Path(folder)))


def _nonfinite_weights(folder: Path) -> list[str]:
    bad: list[str] = []
    for path in weight_files(folder):
        if path.suffix == ".safetensors":
            with safe_open(str(path), framework="pt", device="cpu") as handle:
                bad += nonfinite_tensors((key, handle.get_tensor(key)) for key in handle.keys())  # noqa: SIM118
        else:
            state = torch.load(str(path), map_location="cpu", weights_only=True, mmap=True)
            bad += nonfinite_tensors(state.items())
    return bad
