"""The models. Each sub-package holds one model's files, the ones that travel into a Hub folder."""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path
from typing import Any

__all__ = ["paper_decoding"]


@cache
def _literal(path: Path, name: str) -> Any:
    """The value of the module-level assignment ``name = <literal>`` in the Python file ``path``, read
    from its source without importing it (the model files import torch and transformers)."""
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets = [node.target]
        else:
            continue
        if any(isinstance(target, ast.Name) and target.id == name for target in targets):
            return ast.literal_eval(node.value)
    raise LookupError(f"{path} assigns no {name}.")


def paper_decoding() -> dict[str, Any]:
    """The paper's decoding defaults (§6.1) as generation-config keys (``num_beams``, ``length_penalty``,
    ``early_stopping``, ``max_length_offset``): the model's ``PAPER_DECODING``, which its generation file
    defines, read without importing torch so that a command's ``--help`` stays light."""
    path = Path(__file__).parent / "vanilla_transformer" / "generation_vanilla_transformer.py"
    return dict(_literal(path, "PAPER_DECODING"))
