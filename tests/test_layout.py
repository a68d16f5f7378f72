"""The package's layout stays as docs/architecture.md states it: no unused code, layers that never
import upward."""

from __future__ import annotations

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
