"""The transformers releases the model code supports: one range, stated in the configuration file (which a
model folder carries) and in pyproject.toml, and checked at import by the folder's code and by hf_vanilla.
On any other release the import stops with one line naming the range and the fix, instead of a folder that
loads and then fails in ``generate()``. (CI runs the default tier on the lowest release of the range too:
.ci/run.)"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import ROOT, run_clean, tiny_model

from hf_vanilla.models.vanilla_transformer.configuration_vanilla_transformer import (
    TRANSFORMERS_REQUIREMENT,
    check_transformers_version,
)

FIX = f'pip install "transformers{TRANSFORMERS_REQUIREMENT}"'


def test_pyproject_allows_the_releases_the_model_code_supports() -> None:
    requirements = re.findall(
        r'^\s*"(transformers[<>=!~][^"]*)"', (ROOT / "pyproject.toml").read_text(), re.MULTILINE
    )
    assert requirements == [f"transformers{TRANSFORMERS_REQUIREMENT}"]


@pytest.mark.parametrize("version", ["5.24.0", "5.25.0", "5.30.1", "5.31.0.dev0", "5.24.0rc1"])
def test_a_supported_release_passes(version: str) -> None:
    check_transformers_version(version)


@pytest.mark.parametrize("version", ["5.23.0", "5.18.0", "5.0.0", "4.57.6", "6.0.0", "6.0.0.dev0"])
def test_another_release_is_one_line_naming_the_range_and_the_fix(version: str) -> None:
    with pytest.raises(ImportError) as error:
        check_transformers_version(version)
    message = str(error.value)
    assert "\n" not in message and TRANSFORMERS_REQUIREMENT in message and version in message
    assert message.endswith(FIX)


#: Loads a folder where hf_vanilla is not installed, on transformers reporting the release argv[2].
LOAD_ON = r"""
import json, sys
import transformers
transformers.__version__ = sys.argv[2]
from transformers import AutoModelForSeq2SeqLM
try:
    AutoModelForSeq2SeqLM.from_pretrained(sys.argv[1], trust_remote_code=True)
    print(json.dumps("loaded"))
except ImportError as error:
    print(json.dumps(str(error)))
"""


def test_a_folder_stops_at_import_on_an_unsupported_release(tmp_path: Path) -> None:
    """The folder's own code refuses the release before anything loads (5.23 loaded a folder, then failed
    in every ``generate()`` with a TypeError about ``cache``)."""
    folder = tmp_path / "folder"
    tiny_model().save_pretrained(folder)
    outcome = {
        version: json.loads(run_clean(LOAD_ON, tmp_path, str(folder), version).stdout.splitlines()[-1])
        for version in ("5.23.0", "6.0.0")
    }
    for version, message in outcome.items():
        assert message.startswith(f"This model code runs on transformers{TRANSFORMERS_REQUIREMENT}, found")
        assert version in message and message.endswith(FIX)
    # The supported release (the installed one) loads the same folder: the gate is what stopped it.
    import transformers

    loaded = run_clean(LOAD_ON, tmp_path, str(folder), transformers.__version__).stdout.splitlines()[-1]
    assert json.loads(loaded) == "loaded"


def test_hf_vanilla_stops_at_import_on_an_unsupported_release() -> None:
    """The package makes the same check without importing transformers (its import stays light)."""
    code = """
import importlib.metadata, sys
importlib.metadata.version = lambda name: "5.23.0" if name == "transformers" else None
try:
    import hf_vanilla
except ImportError as error:
    print(error)
print("transformers imported" if "transformers" in sys.modules else "transformers not imported")
"""
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        check=True,
    )
    assert result.stdout.splitlines() == [
        f"This model code runs on transformers{TRANSFORMERS_REQUIREMENT}, found transformers 5.23.0: {FIX}",
        "transformers not imported",
    ]
