"""Checked model loading: the one way every command loads a model (:func:`load_pretrained_checked`).

* **Checks first**: a local folder is checked before ``from_pretrained`` reads it
  (:mod:`hf_vanilla.io.safe_loading`, :mod:`hf_vanilla.io.checkpoints`), then weights that are not
  finite are refused (a diverged run saves NaN, which translates into blank lines), and so is a
  ``config.json`` that disagrees with the weights (:func:`check_loading_info`: a missing, unexpected
  or mismatched key, which ``from_pretrained`` itself only reports while the model translates
  garbage). The Python API (``AutoModelForSeq2SeqLM.from_pretrained``) keeps transformers' behaviour.
* **A loaded model knows which weights it holds** (:func:`pinned_weights`,
  :func:`loaded_weights_fingerprint`): the weights are hashed as they are copied into a private folder,
  and the model is built from that copy, so the fingerprint evaluation results record is that of the
  bytes the model was built from, whatever is written into the folder meanwhile.
"""

from __future__ import annotations

import contextlib
import logging
import re
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForSeq2SeqLM, PreTrainedModel

from hf_vanilla.io.checkpoints import checkpoint_step, verify_checkpoint
from hf_vanilla.io.checksums import copy_hashing, fingerprint_of_digests
from hf_vanilla.io.errors import CheckpointError, ConfigMismatchError, CorruptCheckpointError
from hf_vanilla.io.safe_loading import verify_finite_weights, verify_model_folder, weight_files

__all__ = [
    "check_loading_info",
    "load_pretrained_checked",
    "loaded_weights_fingerprint",
    "pinned_weights",
    "untied_missing_keys",
]


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
        digests = {path.name: copy_hashing(path, private / path.name) for path in weight_files(folder)}
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
    checked first (:func:`~hf_vanilla.io.safe_loading.verify_model_folder`: a damaged or unsafe file, or
    for a ``checkpoint-<step>`` folder :func:`~hf_vanilla.io.checkpoints.verify_checkpoint`, as resuming
    checks it; :func:`~hf_vanilla.io.safe_loading.verify_finite_weights`: NaN or inf weights), and any
    missing, unexpected or mismatched key is refused (:func:`check_loading_info`) rather than reported
    while the model computes garbage. Raises a :class:`CheckpointError` (a ``ValueError``) naming the
    folder. A file, or a name that is neither a folder nor a loadable Hub model, is refused naming
    ``--model_name_or_path``.

    A local folder is loaded from its :func:`pinned_weights` copy, which is checked again, so the checks
    and :func:`loaded_weights_fingerprint` describe the bytes the model holds."""
    path = Path(name)
    if not path.is_dir():
        return _load_from_hub(name, model_class, **kwargs)
    if checkpoint_step(path) is None:
        verify_model_folder(path)
    else:  # a Trainer checkpoint is checked as resuming and averaging check it
        verify_checkpoint(path)
    with pinned_weights(path) as (private, fingerprint):
        try:
            verify_model_folder(private, checksums=False)
        except CheckpointError:
            raise CorruptCheckpointError(
                f"The weights of {str(name)!r} changed while they were being read (something is writing into "
                "the folder, e.g. a training run saving into it): run the command again once it is done; nothing "
                "was loaded."
            ) from None
        verify_finite_weights(private, name=name)
        with _without_load_report():
            model, info = model_class.from_pretrained(
                str(private), output_loading_info=True, ignore_mismatched_sizes=True, **kwargs
            )
    check_loading_info(name, info, model)
    model.config.name_or_path = model.name_or_path = str(name)  # not the deleted copy
    setattr(model, _FINGERPRINT_ATTRIBUTE, fingerprint)
    return model


def _load_from_hub(name: str | Path, model_class: Any, **kwargs: Any) -> PreTrainedModel:
    """:func:`load_pretrained_checked` for a ``name`` that is no local folder: a Hub model id."""
    if Path(name).exists():
        raise ValueError(
            f"--model_name_or_path {str(name)!r} is a file: give the model folder (config.json and model.safetensors)."
        )
    try:
        with _without_load_report():
            model, info = model_class.from_pretrained(
                str(name), output_loading_info=True, ignore_mismatched_sizes=True, **kwargs
            )
    except CheckpointError:
        raise
    except (OSError, ValueError) as err:
        detail = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise FileNotFoundError(
            f"--model_name_or_path {str(name)!r}: no such folder, and no model of that name could be loaded from "
            f"the Hugging Face Hub ({detail}). Check the path: a training run's --output_dir, one of its "
            "checkpoint-<step> folders, or an averaged model folder."
        ) from err
    check_loading_info(name, info, model)
    return model
