"""The web demo where earlier releases had it: ``python -m hf_vanilla.app --model demo_output`` runs
:mod:`hf_vanilla.cli.app` (``hf-vanilla-app``), and ``from hf_vanilla.app import build_demo`` gives
:mod:`hf_vanilla.demo.app`'s names (imported on first use: they import gradio and torch)."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hf_vanilla.cli.app import main
    from hf_vanilla.demo.app import build_demo, load_for_demo, recorded_examples, translate_with_attention

__all__ = ["build_demo", "load_for_demo", "main", "recorded_examples", "translate_with_attention"]


def __getattr__(name: str) -> Any:
    if name == "main":
        from hf_vanilla.cli.app import main

        return main
    if name in __all__:
        from hf_vanilla.demo import app

        return getattr(app, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if __name__ == "__main__":
    from hf_vanilla.cli.app import main

    sys.argv[0] = "python -m hf_vanilla.app"
    sys.exit(main())
