"""What a model folder records about the run that produced its weights (``training_record.json``).

hf_vanilla's trainer and the demo write it beside the weights: how the model was trained, its title and
data when the run knows them, and a few sources it was trained on. The model card
(:mod:`hf_vanilla.hub.card`) and the web page (:mod:`hf_vanilla.demo.app`) read it, so that they state
only what that run recorded. The record carries the weights' fingerprint
(:func:`hf_vanilla.io.checksums.weights_fingerprint`): a folder whose weights were replaced since (by
another training run, a stock script writing into it) has no record, and the card says "unknown".
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hf_vanilla.io.checksums import weights_fingerprint

logger = logging.getLogger(__name__)

__all__ = ["MAX_EXAMPLES", "TRAINING_RECORD_JSON", "read_training_record", "write_training_record"]

TRAINING_RECORD_JSON = "training_record.json"

#: How many training sources a record keeps (what a page or a card shows as examples).
MAX_EXAMPLES = 5


def write_training_record(
    folder: str | Path,
    *,
    trained_with: str,
    title: str | None = None,
    summary: str | None = None,
    dataset: dict[str, Any] | None = None,
    source_lang: str | None = None,
    target_lang: str | None = None,
    example_sources: Sequence[str] = (),
) -> Path:
    """Write ``training_record.json`` into ``folder``, which already holds the weights it describes.

    Args:
        trained_with: how the weights were produced, as the card's sentence ends ("with ...").
        title: the model's name, for the card and the web page.
        summary: the card's training paragraph (default: built from ``trainer_state.json``).
        dataset: the data's card fields (:class:`hf_vanilla.hub.card.DatasetCard` as a dict).
        example_sources: sources the model was trained on (the first :data:`MAX_EXAMPLES` are kept).
    """
    folder = Path(folder)
    record = {
        "model_sha256": weights_fingerprint(folder),
        "trained_with": trained_with,
        "title": title,
        "summary": summary,
        "dataset": dataset,
        "source_lang": source_lang,
        "target_lang": target_lang,
        "example_sources": [text for text in example_sources if text.strip()][:MAX_EXAMPLES],
    }
    path = folder / TRAINING_RECORD_JSON
    path.write_text(json.dumps(record, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return path


def read_training_record(folder: str | Path) -> dict[str, Any] | None:
    """The record of a local model folder, or ``None`` when it has none, it is unreadable, or it describes
    other weights than the folder holds (logged)."""
    path = Path(folder) / TRAINING_RECORD_JSON
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        logger.warning("%s is not readable JSON (%s): the folder's training is taken as unknown.", path, err)
        return None
    if not isinstance(record, dict) or record.get("model_sha256") != weights_fingerprint(folder):
        logger.warning(
            "%s describes other weights than %s holds (they were replaced since): its training is taken as "
            "unknown.",
            path,
            folder,
        )
        return None
    return record
