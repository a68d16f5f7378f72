"""Every command's ``--help`` answers without importing torch (or datasets, evaluate, accelerate), and
lists ``--debug``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

#: Commands whose options still live beside heavy code (not yet split out): their --help imports torch.
NOT_YET_LIGHT = {
    "evaluate_bleu": "DataArguments lives in hf_vanilla.data.loading, which imports datasets",
    "publish": "PublishArguments lives in hf_vanilla.hub.push, which imports the model",
    "convert": "ConversionArguments lives in hf_vanilla.interop.convert, which imports torch",
    "export_ctranslate2": "ExportArguments lives in hf_vanilla.interop.export_ctranslate2, which imports torch",
    "demo": "DemoArguments lives in hf_vanilla.demo.run, which imports torch",
    "train_tokenizer": "TokenizerArguments lives in hf_vanilla.data.tokenization, which imports datasets",
    "average_checkpoints": "it imports hf_vanilla.training.averaging, which imports torch",
    "train": "TrainingArguments imports torch",
}
COMMANDS = [
    "translate",
    "export_onnx",
    "plot",
    "app",
    *NOT_YET_LIGHT,
]
HEAVY = ("torch", "datasets", "evaluate", "accelerate")

CODE = """
import sys
from hf_vanilla.cli.{command} import main
try:
    main(["--help"])
except SystemExit:
    pass
print("IMPORTED", [name for name in {heavy!r} if name in sys.modules])
"""


@pytest.mark.parametrize(
    "command",
    [
        pytest.param(name, marks=pytest.mark.xfail(reason=NOT_YET_LIGHT[name], strict=True))
        if name in NOT_YET_LIGHT
        else name
        for name in COMMANDS
    ],
)
def test_help_imports_no_torch_and_lists_debug(command: str) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(Path(__file__).parents[2])}
    result = subprocess.run(
        [sys.executable, "-c", CODE.format(command=command, heavy=HEAVY)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=True,
    )
    assert "--debug" in result.stdout
    if command == "plot":  # a picture needs no translation batching, backend or quantization
        assert "--quantization" not in result.stdout and "--max_tokens" not in result.stdout
    assert result.stdout.splitlines()[-1] == "IMPORTED []", result.stdout.splitlines()[-1]


def test_import_is_light_and_still_registers_the_auto_classes() -> None:
    """``import hf_vanilla`` loads no torch; importing transformers' Auto classes afterwards registers ours."""
    code = """
import importlib, sys
import hf_vanilla
assert "torch" not in sys.modules and "transformers" not in sys.modules, "heavy import"
importlib.invalidate_caches()
from transformers import AutoConfig, AutoModelForSeq2SeqLM
from transformers.pipelines import PIPELINE_REGISTRY
config = AutoConfig.for_model("vanilla_transformer", d_model=16)
model = AutoModelForSeq2SeqLM.from_config(config)
assert type(model) is hf_vanilla.VanillaTransformerForConditionalGeneration
assert hf_vanilla.PIPELINE_TASK in PIPELINE_REGISTRY.supported_tasks
print("OK")
"""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(Path(__file__).parents[2])}
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300
    )
    assert result.stdout.strip() == "OK", result.stderr[-2000:]
