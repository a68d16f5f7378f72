"""The models. Each sub-package holds one model's files, the ones that travel into a Hub folder."""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path
from typing import Any

__all__ = ["model_file_definitions", "paper_decoding"]


@cache
def model_file_definitions(file: str, names: frozenset[str]) -> dict[str, Any]:
    """The module-level functions and assignments ``names`` of the model file ``file`` (in
    ``vanilla_transformer/``), run from its source without importing the file (the model files import torch
    and transformers), so that ``import hf_vanilla`` and a command's ``--help`` stay light. The definitions
    may use ``re`` and each other, nothing else."""
    path = Path(__file__).parent / "vanilla_transformer" / file
    nodes = []
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.FunctionDef):
            defined = {node.name}
        elif isinstance(node, ast.Assign):
            defined = {getattr(target, "id", None) for target in node.targets}
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            defined = {getattr(node.target, "id", None)}
        else:
            continue
        if defined & names:
            nodes.append(node)
    namespace: dict[str, Any] = {"re": re}
    exec(compile(ast.Module(nodes, type_ignores=[]), str(path), "exec"), namespace)
    missing = names - namespace.keys()
    if missing:
        raise LookupError(f"{path} defines no {', '.join(sorted(missing))}.")
    return {name: namespace[name] for name in names}


def paper_decoding() -> dict[str, Any]:
    """The paper's decoding defaults (§6.1) as generation-config keys (``num_beams``, ``length_penalty``,
    ``early_stopping``, ``max_length_offset``): the model's ``PAPER_DECODING``, which its generation file
    defines, read without importing torch so that a command's ``--help`` stays light."""
    definitions = model_file_definitions("generation_vanilla_transformer.py", frozenset({"PAPER_DECODING"}))
    return dict(definitions["PAPER_DECODING"])
