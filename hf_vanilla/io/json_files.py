"""Reading a JSON file a command is given: a file that is not JSON, or JSON of another shape than
expected, is one error naming the file, saying it is damaged and what to do."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hf_vanilla.io.errors import CorruptCheckpointError, restore_hint

__all__ = ["read_json"]

_KINDS = {dict: "a JSON object ({...})", list: "a JSON list ([...])"}


def _kind(value: Any) -> str:
    for python, words in _KINDS.items():
        if isinstance(value, python):
            return words
    return f"a JSON {type(value).__name__} ({json.dumps(value)[:40]})"


def read_json(path: str | Path, expect: type = dict, hint: str | None = None) -> Any:
    """The value of the JSON file ``path``, which must be an ``expect`` (a JSON object by default).

    A file that cannot be read as UTF-8 JSON, or holds another kind of value, raises
    :class:`CorruptCheckpointError` naming the file; the message ends with ``hint`` (by default
    :func:`hf_vanilla.io.errors.restore_hint`: a good copy of the folder, or an earlier checkpoint).
    """
    path = Path(path)
    advice = restore_hint(path) if hint is None else f" {hint}"
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CorruptCheckpointError(f"{str(path)!r} is damaged: it is not JSON ({err}).{advice}") from err
    if not isinstance(value, expect):
        raise CorruptCheckpointError(
            f"{str(path)!r} is damaged: it holds {_kind(value)} where {_KINDS.get(expect, expect.__name__)} "
            f"belongs.{advice}"
        )
    return value
