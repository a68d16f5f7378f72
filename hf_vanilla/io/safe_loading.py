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
* **A damaged file is named, not crashed on** (:func:`verify_model_folder`, :func:`verify_checkpoint`).
  A folder is whole when its ``config.json`` parses, every ``*.safetensors`` file is as long as its
  header says, a Trainer checkpoint's ``trainer_state.json`` (written last) names the folder's step, and
  a ``checksums.sha256`` manifest (:func:`write_checksums`, :func:`hf_vanilla.io.manifest.write_manifest`),
  when present, matches, and ``config.json`` agrees with ``architecture.json``. A failure raises
  :class:`CorruptCheckpointError` naming the file and what to do, instead of a stack trace from inside
  safetensors or pickle.
* **Checked loaders** (:func:`load_pretrained_checked`, the one every command uses) run these checks
  before ``from_pretrained``, then refuse weights that are not finite (:func:`verify_finite_weights`:
  a diverged run saves NaN, which translates into blank lines) and a ``config.json`` that disagrees
  with the weights (:func:`check_loading_info`: a missing, unexpected or mismatched key, which
  ``from_pretrained`` itself only reports while the model translates garbage). The Python API
  (``AutoModelForSeq2SeqLM.from_pretrained``) keeps transformers' behaviour.
* **A loaded model knows which weights it holds** (:func:`pinned_weights`,
  :func:`loaded_weights_fingerprint`): the weights are hashed as they are copied into a private folder,
  and the model is built from that copy, so the fingerprint evaluation results record is that of the
  bytes the model was built from, whatever is written into the folder meanwhile.

Writing checkpoints so that they stay whole, and resuming from them, is
:mod:`hf_vanilla.training.resilience`'s job.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import shutil
import struct
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from transformers import AutoModelForSeq2SeqLM, PreTrainedModel

from hf_vanilla.io.checksums import copy_hashing, fingerprint_of_digests, verify_checksums
from hf_vanilla.io.errors import (
    CheckpointDeletedError,
    CheckpointError,
    ConfigMismatchError,
    CorruptCheckpointError,
    NonFiniteWeightsError,
    damaged_file_hint,
)
from hf_vanilla.io.json_files import read_json
from hf_vanilla.io.manifest import export_kind, verify_config
from hf_vanilla.io.numbers import non_finite_names
from hf_vanilla.io.pickles import PICKLE_SUFFIXES, UNREAD_PICKLES, verify_pickle_file

__all__ = [
    "CHECKPOINT_PATTERN",
    "check_loading_info",
    "checkpoint_folders",
    "checkpoint_step",
    "deleted_while_read",
    "load_pretrained_checked",
    "loaded_weights_fingerprint",
    "nonfinite_tensors",
    "pinned_weights",
    "refuse_nonfinite",
    "untied_missing_keys",
    "verify_checkpoint",
    "verify_finite_weights",
    "verify_model_folder",
    "verify_safetensors_file",
]

#: Trainer checkpoint folders: ``checkpoint-<global step>``.
CHECKPOINT_PATTERN = re.compile(r"^checkpoint-(\d+)$")

TRAINER_STATE_NAME = "trainer_state.json"

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


def checkpoint_step(path: str | Path) -> int | None:
    """The step number of a ``checkpoint-<step>`` folder name, or ``None`` for other names."""
    match = CHECKPOINT_PATTERN.match(Path(path).name)
    return int(match.group(1)) if match else None


@contextlib.contextmanager
def deleted_while_read(folder: str | Path) -> Iterator[None]:
    """Turn an error raised while reading the Trainer checkpoint ``folder`` (``checkpoint-<step>``) into
    :class:`CheckpointDeletedError` when the folder existed at the start and is gone at the failure: a
    training run rotated it away mid-read, so its files went missing, which is not damage. Other
    folders and errors pass as they are."""
    folder = Path(folder)
    existed = checkpoint_step(folder) is not None and folder.is_dir()
    try:
        yield
    except (OSError, ValueError) as err:
        if existed and not folder.is_dir() and not isinstance(err, CheckpointDeletedError):
            raise CheckpointDeletedError(folder) from err
        raise


def verify_checkpoint(
    folder: str | Path,
    *,
    trusted_patterns: Iterable[str] = (),
    checksums: bool = True,
) -> None:
    """Check a Trainer ``checkpoint-<step>`` folder before resuming from it (nothing is unpickled).

    * ``trainer_state.json`` exists (the Trainer writes it last) and its ``global_step`` is the step
      in the folder's name;
    * the model weights are whole (:func:`verify_model_folder`) — or, for a sharded FSDP checkpoint,
      its ``.metadata`` is plain data;
    * every pickled file (``optimizer.pt``, ``scheduler.pt``, ``rng_state*.pth``, ``scaler.pt``, ...)
      holds plain tensor data only (:func:`verify_pickle_file`); ``training_args.bin`` is skipped (it is
      never read) as are files matching ``trusted_patterns`` (globs relative to the folder, e.g.
      DeepSpeed's ``global_step*/*``, which DeepSpeed itself loads with full unpickling);
    * the ``checksums.sha256`` manifest, if any, matches.

    Raises :class:`CorruptCheckpointError` or :class:`UnsafeCheckpointError` naming the file.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"Checkpoint folder {str(folder)!r} does not exist.")
    state_path = folder / TRAINER_STATE_NAME
    if not state_path.is_file():
        raise CorruptCheckpointError(
            f"{str(folder)!r} is incomplete: it has no {TRAINER_STATE_NAME}, which the Trainer writes last. The "
            f"run was probably killed while saving it.{damaged_file_hint(state_path)}"
        )
    state = read_json(state_path)
    step = checkpoint_step(folder)
    if step is not None and state.get("global_step") != step:
        raise CorruptCheckpointError(
            f"{str(state_path)!r} records global_step {state.get('global_step')!r}, but the folder is named for "
            f"step {step}: the folder mixes files of two saves.{damaged_file_hint(state_path)}"
        )
    trusted = {p for pattern in trusted_patterns for p in folder.glob(pattern)}
    has_weights = any(
        (folder / name).exists()
        for name in ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
    )
    if has_weights:
        verify_model_folder(folder, checksums=False)
    elif not any(p.is_dir() for p in folder.glob("pytorch_model_fsdp*")) and not trusted:
        raise CorruptCheckpointError(
            f"{str(folder)!r} has no model weights (model.safetensors).{damaged_file_hint(state_path)}"
        )
    for path in sorted(folder.rglob("*")):
        if not path.is_file() or path in trusted or path.name in UNREAD_PICKLES:
            continue
        if path.suffix in PICKLE_SUFFIXES or path.name == ".metadata":
            verify_pickle_file(path)
    if checksums:
        verify_checksums(folder)


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


def _weight_files(folder: Path) -> list[Path]:
    single, index = folder / "model.safetensors", folder / "model.safetensors.index.json"
    if single.exists():
        return [single]
    if index.exists():
        return [folder / shard for shard in sorted(set(read_json(index)["weight_map"].values()))]
    return sorted(folder.glob("pytorch_model*.bin"))


def verify_finite_weights(folder: str | Path) -> None:
    """Refuse a model folder whose weights hold NaN or infinity (:class:`NonFiniteWeightsError`, naming
    the first tensors as the files name them). Reads every tensor once; run it after
    :func:`verify_model_folder` (pickled weights are read with ``weights_only=True``)."""
    refuse_nonfinite(folder, _nonfinite_weights(Path(folder)))


def _nonfinite_weights(folder: Path) -> list[str]:
    bad: list[str] = []
    for path in _weight_files(folder):
        if path.suffix == ".safetensors":
            with safe_open(str(path), framework="pt", device="cpu") as handle:
                bad += nonfinite_tensors((key, handle.get_tensor(key)) for key in handle.keys())  # noqa: SIM118
        else:
            state = torch.load(str(path), map_location="cpu", weights_only=True, mmap=True)
            bad += nonfinite_tensors(state.items())
    return bad


# --------------------------------------------------------------------------------------------------
# loading
# --------------------------------------------------------------------------------------------------
def _layer_pattern(name: str) -> str:
    """``name`` with its layer numbers left out: the names a model of any depth has."""
    return re.sub(r"\.\d+(?=\.|$)", ".#", name)


def _foreign_names(model: torch.nn.Module, keys: Iterable[str]) -> list[str]:
    """The tensor names among ``keys`` that no config of ``model``'s class would make it have: a module it
    has at no depth, or a tensor name (``weight``, ``bias``, ...) none of its tensors has. A layer beyond
    the model's depth, or a bias the config turned off, is not foreign: that is the config's doing."""
    modules = {_layer_pattern(name) for name, _ in model.named_modules()}
    leaves = {key.rsplit(".", 1)[-1] for key in model.state_dict()}
    foreign = []
    for key in keys:
        module, _, leaf = key.rpartition(".")
        if _layer_pattern(module) not in modules or leaf not in leaves:
            foreign.append(key)
    return sorted(foreign)


def check_loading_info(name: str | Path, info: dict[str, Any], model: torch.nn.Module | None = None) -> None:
    """Refuse what ``from_pretrained(..., output_loading_info=True)`` reports: weights the model lacks
    (MISSING: left at random initialisation), weights it has no place for (UNEXPECTED: dropped) or of
    another shape (MISMATCHED). Tied weights (the shared ``lm_head``) and non-persistent buffers are not
    saved and not reported. Raises :class:`ConfigMismatchError` naming the keys.

    An unexpected name that no config would give ``model`` (:func:`_foreign_names`: a damaged name,
    another model's weights) is blamed on the weights file, not on ``config.json``
    (:class:`CorruptCheckpointError`)."""
    if model is not None:
        unknown = _foreign_names(model, info.get("unexpected_keys", ()))
        if unknown:
            shown = ", ".join(unknown[:3]) + (f" and {len(unknown) - 3} more" if len(unknown) > 3 else "")
            raise CorruptCheckpointError(
                f"{str(name)!r}: its weights file holds tensor names the model does not have ({shown}): the file "
                "is damaged or holds another model's weights. Copy the folder again from where it came from."
            )
    problems = []
    for kind, keys in (
        ("missing from the weights", sorted(info.get("missing_keys", ()))),
        ("in the weights but not in the model", sorted(info.get("unexpected_keys", ()))),
        (
            "of another shape in the weights than in the model",
            sorted(
                f"{key} ({tuple(saved)} vs {tuple(model)})"
                for key, saved, model in info.get("mismatched_keys", ())
            ),
        ),
    ):
        if keys:
            shown = ", ".join(keys[:3]) + (f" and {len(keys) - 3} more" if len(keys) > 3 else "")
            problems.append(f"{len(keys)} key(s) {kind}: {shown}")
    if problems:
        raise ConfigMismatchError(
            f"{str(name)!r}: its config.json disagrees with its weights ({'; '.join(problems)}). The config was "
            "edited or comes from another model (e.g. tie_word_embeddings, *_layers, d_model): restore the "
            "config.json saved with these weights."
        )


def untied_missing_keys(model: torch.nn.Module, missing_keys: Iterable[str]) -> list[str]:
    """The keys of ``missing_keys`` (from ``model.load_state_dict(..., strict=False)``) that are really
    missing: a key whose parameter is shared with one that was loaded (the output projection and the
    embeddings tied to the shared embedding, saved once) got its values through that one and is left out."""
    missing = set(missing_keys)
    names_of: dict[int, set[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        names_of.setdefault(id(param), set()).add(name)
    loaded_through_tie = {name for names in names_of.values() if names - missing for name in names & missing}
    return [key for key in missing_keys if key not in loaded_through_tie]


class _DropLoadReport(logging.Filter):
    """Drops transformers' multi-line LOAD REPORT: :func:`check_loading_info` says it in one line."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "LOAD REPORT" not in str(record.msg)


@contextlib.contextmanager
def _without_load_report() -> Iterator[None]:
    report_logger = logging.getLogger("transformers.modeling_utils")
    drop = _DropLoadReport()
    report_logger.addFilter(drop)
    try:
        yield
    finally:
        report_logger.removeFilter(drop)


#: Files copied with the weights by :func:`pinned_weights`: what ``from_pretrained`` reads besides them.
_PINNED_SUFFIXES = (".json", ".py")

#: The attribute in which :func:`load_pretrained_checked` leaves a model's weights fingerprint.
_FINGERPRINT_ATTRIBUTE = "_hf_vanilla_weights_sha256"


@contextlib.contextmanager
def pinned_weights(folder: str | Path) -> Iterator[tuple[Path, str]]:
    """A private copy of a model folder's weights (and of its ``*.json`` and ``*.py`` files, which
    ``from_pretrained`` reads with them), and the fingerprint of exactly the bytes copied
    (:func:`hf_vanilla.io.checksums.weights_fingerprint`'s formula); the copy is deleted after the block.

    Each weights file is hashed block by block as it is written into the copy, so the fingerprint is
    that of the bytes a model built from the copy holds, even when the folder's weights are replaced
    while this runs (a resumed run's final save, say). Hashing the folder and loading it in two reads,
    or hashing it again after loading, leaves a window between the reads in which another file can be
    read than the one hashed; no comparison afterwards can say which bytes were loaded. The copy goes to
    the system's temporary folder (``TMPDIR``) and costs the weights' size there while the block runs.
    """
    folder = Path(folder)
    private = Path(tempfile.mkdtemp(prefix="hf-vanilla-weights-"))
    try:
        digests = {path.name: copy_hashing(path, private / path.name) for path in _weight_files(folder)}
        for path in folder.iterdir():
            if path.suffix in _PINNED_SUFFIXES and path.is_file() and not (private / path.name).exists():
                shutil.copyfile(path, private / path.name)
        yield private, fingerprint_of_digests(digests)
    finally:
        shutil.rmtree(private, ignore_errors=True)


def loaded_weights_fingerprint(model: Any) -> str | None:
    """The fingerprint of the weights ``model`` was built from by :func:`load_pretrained_checked` (the
    identity :func:`hf_vanilla.io.checksums.weights_fingerprint` gives a folder), or ``None`` for a
    model not loaded from a local folder that way. It describes the weights as loaded: training the
    model afterwards does not change it."""
    return getattr(model, _FINGERPRINT_ATTRIBUTE, None)


def load_pretrained_checked(
    name: str | Path, model_class: Any = AutoModelForSeq2SeqLM, **kwargs: Any
) -> PreTrainedModel:
    """``model_class.from_pretrained(name, **kwargs)`` as every command loads a model: a local folder is
    checked first (:func:`verify_model_folder`: a damaged or unsafe file, or for a ``checkpoint-<step>``
    folder :func:`verify_checkpoint`, as resuming checks it; :func:`verify_finite_weights`: NaN or inf
    weights), and any missing, unexpected or mismatched key is refused
    (:func:`check_loading_info`) rather than reported while the model computes garbage. Raises a
    :class:`CheckpointError` (a ``ValueError``) naming the folder.

    A local folder is loaded from its :func:`pinned_weights` copy, which is checked again, so the checks
    and :func:`loaded_weights_fingerprint` describe the bytes the model holds."""
    if not Path(name).is_dir():
        with _without_load_report():
            model, info = model_class.from_pretrained(
                str(name), output_loading_info=True, ignore_mismatched_sizes=True, **kwargs
            )
        check_loading_info(name, info, model)
        return model
    if checkpoint_step(name) is None:
        verify_model_folder(name)
    else:  # a Trainer checkpoint is checked as resuming and averaging check it
        verify_checkpoint(name)
    with pinned_weights(name) as (private, fingerprint):
        try:
            verify_model_folder(private, checksums=False)
        except CheckpointError:
            raise CorruptCheckpointError(
                f"The weights of {str(name)!r} changed while they were being read (something is writing into "
                "the folder, e.g. a training run saving into it): run the command again once it is done; nothing "
                "was loaded."
            ) from None
        refuse_nonfinite(name, _nonfinite_weights(private))
        with _without_load_report():
            model, info = model_class.from_pretrained(
                str(private), output_loading_info=True, ignore_mismatched_sizes=True, **kwargs
            )
    check_loading_info(name, info, model)
    model.config.name_or_path = model.name_or_path = str(name)  # not the deleted copy
    setattr(model, _FINGERPRINT_ATTRIBUTE, fingerprint)
    return model


# --------------------------------------------------------------------------------------------------
# resuming
# --------------------------------------------------------------------------------------------------
def checkpoint_folders(run_dir: str | Path) -> list[Path]:
    """Every ``checkpoint-<step>`` folder of ``run_dir``, whole or not, oldest first by step; ``[]`` if
    ``run_dir`` is not a folder.

    This is the one place that orders a run's checkpoints: by the step in the folder's name, never
    by file times (which reading, evaluating or copying a checkpoint changes). Rotation
    (:func:`rotate_checkpoints_by_step`), resuming (:func:`last_complete_checkpoint`), averaging
    (:func:`hf_vanilla.training.averaging.find_checkpoints`) and plotting a run's log all draw from it.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return []
    return sorted(
        (p for p in run_dir.iterdir() if p.is_dir() and checkpoint_step(p) is not None), key=checkpoint_step
    )
