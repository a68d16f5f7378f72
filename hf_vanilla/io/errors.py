"""What a damaged, unsafe or vanished checkpoint raises, and the hint every damage message ends with."""

from __future__ import annotations

import re
from pathlib import Path

__all__ = [
    "CheckpointDeletedError",
    "CheckpointError",
    "ConfigMismatchError",
    "CorruptCheckpointError",
    "NonFiniteWeightsError",
    "UnsafeCheckpointError",
    "damaged_file_hint",
    "restore_hint",
]


class CheckpointError(ValueError):
    """A checkpoint or model folder that must not be loaded; the message names the file."""


class CheckpointDeletedError(CheckpointError):
    """A checkpoint was deleted while it was being read (a training run rotating the checkpoints of its
    folder): not damaged, gone."""

    def __init__(self, folder: str | Path) -> None:
        super().__init__(
            f"{str(folder)!r} was deleted while it was being read: a training run is rotating the checkpoints in "
            f"{str(Path(folder).parent)!r} (--save_total_limit). Nothing was written. Run the command again (it "
            "takes the checkpoints there now), or wait until the training run ends."
        )


class CorruptCheckpointError(CheckpointError):
    """A file is truncated, damaged, or missing: the folder was not written completely."""


class UnsafeCheckpointError(CheckpointError):
    """A pickled file would run code (import something other than plain tensor data) when loaded."""


class NonFiniteWeightsError(CheckpointError):
    """Weights hold NaN or infinity (a diverged run): the model would translate into blank lines."""


class ConfigMismatchError(CheckpointError):
    """``config.json`` describes another model than the weights hold (keys missing, unexpected or of
    another shape)."""


def damaged_file_hint(path: Path) -> str:
    return (
        " The file was probably cut short when a run was killed while saving, or damaged on disk. Resume "
        "from an earlier checkpoint (hf_vanilla.io.checkpoints.last_complete_checkpoint finds the newest whole "
        f"one), or delete {str(path.parent)!r}."
    )


def restore_hint(path: Path, *, saved_over: bool = False) -> str:
    """What to do about a damaged file of ``path.parent``: a training checkpoint (``checkpoint-<step>``) is
    replaced by an earlier one (:func:`damaged_file_hint`), any other folder by a good copy. With
    ``saved_over`` (the file's bytes differ from the folder's manifest), a model folder's hint also says how
    to load it when a ``save_pretrained``, which writes no manifest, replaced the file on purpose."""
    if re.fullmatch(r"checkpoint-\d+", path.parent.name):
        return damaged_file_hint(path)
    hint = (
        f" The file was damaged on disk or in a copy, or changed since: copy {str(path.parent)!r} again from "
        "where it came from, or write it again with the command that wrote it."
    )
    if saved_over:
        hint += (
            f" If you saved into {str(path.parent)!r} on purpose (a save_pretrained over it), delete its "
            "checksums.sha256 and architecture.json: the folder then loads without them."
        )
    return hint
