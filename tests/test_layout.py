"""The package's layout stays as docs/architecture.md states it: no unused code, layers that never
import upward."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.dead_code_allowlist import USED_FROM_OUTSIDE
from tests.helpers import ROOT


def test_the_package_holds_no_unused_code() -> None:
    """vulture finds no unused function, class, variable, attribute or import in ``hf_vanilla/``, apart
    from the names that users or other libraries call (tests/dead_code_allowlist.py, each with its reason).
    New unused code is named in the failure: remove it, or allow its name there with the reason."""
    done = subprocess.run(
        [sys.executable, "-m", "vulture", "hf_vanilla", "--ignore-names", ",".join(USED_FROM_OUTSIDE)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert done.returncode == 0 and not done.stderr, f"unused code:\n{done.stdout}{done.stderr}"


def test_the_layers_never_import_upward() -> None:
    """import-linter keeps pyproject.toml's contracts: cli on top, the roles below it, io and the model
    files at the bottom, and the model-folder files importing nothing of hf_vanilla but each other.
    A broken contract is named in the failure with the import that breaks it."""
    done = subprocess.run(
        [sys.executable, "-c", "import sys; from importlinter.cli import lint_imports_command as lint; sys.exit(lint())",
         "--no-cache"],
        capture_output=True, text=True, cwd=ROOT, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-5000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout
