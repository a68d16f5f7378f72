"""Every command parses with transformers' ``HfArgumentParser``: its ``--help`` lists ``--debug``, imports
no torch (``hf-vanilla-train``'s, whose options include transformers' ``Seq2SeqTrainingArguments``,
excepted), and writes no file."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
from transformers import HfArgumentParser

import hf_vanilla.cli

#: The commands built on dataclasses (hf-vanilla-app's parser is plain argparse).
DATACLASS_COMMANDS = [
    "translate",
    "export_onnx",
    "plot",
    "evaluate_bleu",
    "publish",
    "convert",
    "export_ctranslate2",
    "demo",
    "train_tokenizer",
    "average_checkpoints",
    "serve",
]
COMMANDS = [*DATACLASS_COMMANDS, "app", "train"]
HEAVY = ("torch", "datasets", "evaluate", "accelerate", "sacrebleu")

CODE = """
import sys
from hf_vanilla.cli.{command} import main
try:
    main(["--help"])
except SystemExit:
    pass
print("IMPORTED", [name for name in {heavy!r} if name in sys.modules])
"""


@pytest.mark.parametrize("command", COMMANDS)
def test_help_lists_debug_imports_no_torch_and_writes_nothing(command: str, tmp_path: Path) -> None:
    """Every command's ``--help`` imports none of the heavy packages (train's parser is that of a run, whose
    transformers options import torch) and writes no file, in the user's cache or anywhere else."""
    home = tmp_path / "home"
    home.mkdir()
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "PYTHONPATH": str(Path(__file__).parents[2]),
        "HOME": str(home),
        "XDG_CACHE_HOME": str(home / ".cache"),
    }
    help_text = subprocess.run(
        [sys.executable, "-c", CODE.format(command=command, heavy=HEAVY)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
        check=True,
    ).stdout
    assert "--debug" in help_text
    if command in ("plot", "publish"):  # a picture or a Hub folder needs no batching, backend or quantization
        for flag in ("--quantization", "--max_tokens", "--batch_size", "--backend", "--dtype"):
            assert flag not in help_text, flag
    if command != "train":  # its parser is that of a run: transformers' training options import torch
        assert help_text.splitlines()[-1] == "IMPORTED []", help_text.splitlines()[-1]
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")) == ["home"]


@pytest.mark.parametrize("command", DATACLASS_COMMANDS)
def test_every_command_parses_with_transformers_parser(command: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The commands' parser is transformers' ``HfArgumentParser``, not a copy of it."""
    module = importlib.import_module(f"hf_vanilla.cli.{command}")
    made: list[object] = []
    real = hf_vanilla.cli.dataclass_parser

    def recording(*args: object, **kwargs: object) -> object:
        made.append(real(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(hf_vanilla.cli, "dataclass_parser", recording)
    if hasattr(module, "dataclass_parser"):
        monkeypatch.setattr(module, "dataclass_parser", recording)
    with pytest.raises(SystemExit):
        module.main(["--help"])
    assert made and all(type(parser) is HfArgumentParser for parser in made)


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


def test_train_presets_are_the_configuration_presets() -> None:
    from hf_vanilla.models.vanilla_transformer.configuration_vanilla_transformer import PRESETS
    from hf_vanilla.training.options import PRESET_NAMES

    assert sorted(PRESET_NAMES) == sorted(PRESETS)


@pytest.mark.parametrize(
    "first_import",
    [
        "from hf_vanilla.speed import fast_paths",
        "from hf_vanilla.speed.fast_paths import disabled",
        "import hf_vanilla.speed.search",
        "import hf_vanilla.speed.modeling",
        "from hf_vanilla.models.vanilla_transformer import modeling_vanilla_transformer",
    ],
)
def test_any_module_can_be_imported_first(first_import: str) -> None:
    """A user's first import may be any module (docs/performance.md starts with ``from hf_vanilla.speed
    import fast_paths``): the registration it sets off finds each module whole, and the Auto class is then
    the installed package's."""
    code = f"""
{first_import}
from transformers import AutoConfig, AutoModelForSeq2SeqLM
from hf_vanilla.speed.modeling import VanillaTransformerForConditionalGeneration
model = AutoModelForSeq2SeqLM.from_config(AutoConfig.for_model("vanilla_transformer", d_model=16))
assert type(model) is VanillaTransformerForConditionalGeneration, type(model)
print("OK")
"""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(Path(__file__).parents[2])}
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300
    )
    assert result.stdout.strip() == "OK", result.stderr[-2000:]
