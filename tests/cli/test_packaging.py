"""The wheel: the commands are installed, and the templates, metric module and pipeline code are in it."""

from __future__ import annotations

import configparser
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
COMMANDS = {
    "hf-vanilla-train-tokenizer": "hf_vanilla.cli.train_tokenizer:main",
    "hf-vanilla-train": "hf_vanilla.cli.train:main",
    "hf-vanilla-average": "hf_vanilla.cli.average_checkpoints:main",
    "hf-vanilla-translate": "hf_vanilla.cli.translate:main",
    "hf-vanilla-evaluate": "hf_vanilla.cli.evaluate_bleu:main",
    "hf-vanilla-plot": "hf_vanilla.cli.plot:main",
    "hf-vanilla-publish": "hf_vanilla.cli.publish:main",
    "hf-vanilla-convert": "hf_vanilla.cli.convert:main",
    "hf-vanilla-export-ct2": "hf_vanilla.cli.export_ctranslate2:main",
    "hf-vanilla-demo": "hf_vanilla.cli.demo:main",
    "hf-vanilla-app": "hf_vanilla.cli.app:main",
    "hf-vanilla-export-onnx": "hf_vanilla.cli.export_onnx:main",
    "hf-vanilla-serve": "hf_vanilla.cli.serve:main",
}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    """Build the wheel from a copy of the tracked tree (no build/ or egg-info left in the checkout)."""
    tmp = tmp_path_factory.mktemp("wheel")
    source = tmp / "src"
    files = (
        subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT,
            capture_output=True,
            check=True,
        )
        .stdout.decode()
        .split("\0")
    )
    for name in filter(None, files):
        if (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name, follow_symlinks=False)
    command = [
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "--no-deps",
        "--no-build-isolation",
        "-q",
        "-w",
        str(tmp),
        ".",
    ]
    subprocess.run(
        command, cwd=source, check=True, capture_output=True, env={**os.environ, "PIP_NO_INDEX": "1"}
    )
    (path,) = tmp.glob("hf_vanilla-*.whl")
    return zipfile.ZipFile(path)


def test_wheel_installs_every_command(wheel: zipfile.ZipFile) -> None:
    (entry_points,) = [name for name in wheel.namelist() if name.endswith(".dist-info/entry_points.txt")]
    parser = configparser.ConfigParser()
    parser.read_string(wheel.read(entry_points).decode())
    assert dict(parser["console_scripts"]) == COMMANDS
    for target in COMMANDS.values():
        module = target.split(":")[0].replace(".", "/") + ".py"
        assert module in wheel.namelist(), module


def test_wheel_holds_templates_metric_and_remote_code(wheel: zipfile.ZipFile) -> None:
    names = set(wheel.namelist())
    for needed in (
        "hf_vanilla/hub/templates/model_card.md",
        "hf_vanilla/analysis/metrics/sacrebleu_chrf/sacrebleu_chrf.py",
        "hf_vanilla/models/vanilla_transformer/modeling_vanilla_transformer.py",
        "hf_vanilla/speed/fast_paths.py",
        "hf_vanilla/models/vanilla_transformer/generation_vanilla_transformer.py",
        "hf_vanilla/models/vanilla_transformer/saving_vanilla_transformer.py",
        "hf_vanilla/models/vanilla_transformer/pipeline_vanilla_transformer.py",
    ):
        assert needed in names, needed
    template = wheel.read("hf_vanilla/hub/templates/model_card.md").decode()
    assert "{{ card_data }}" in template  # the template itself, not a symlink's target path
    assert not (ROOT / "hf_vanilla" / "templates" / "model_card.md").is_symlink()


def test_every_command_is_a_main_function_of_the_package() -> None:
    import importlib

    for target in COMMANDS.values():
        module, function = target.split(":")
        assert callable(getattr(importlib.import_module(module), function)), target
    for wrapper in (ROOT / "scripts").glob("*.py"):
        if wrapper.name != "gpu_check.py":
            assert f"from hf_vanilla.cli.{wrapper.stem} import main" in wrapper.read_text(), wrapper
