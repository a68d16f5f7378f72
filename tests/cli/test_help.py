"""Every command's ``--help`` answers without importing torch or transformers (or datasets, evaluate,
accelerate), lists ``--debug``, and says what transformers' ``HfArgumentParser`` would say."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from transformers import HfArgumentParser

import hf_vanilla.cli
from hf_vanilla.cli import add_debug_flag
from hf_vanilla.cli.parsing import DataclassArgumentParser

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
]
COMMANDS = [*DATACLASS_COMMANDS, "app", "train"]
HEAVY = ("torch", "transformers", "huggingface_hub", "datasets", "evaluate", "accelerate", "sacrebleu")

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
def test_help_imports_no_torch_and_lists_debug(
    command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every command's ``--help`` (train's once a run or a first ``--help`` has kept the description of
    transformers' options in the user's cache) imports none of the heavy packages."""
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "PYTHONPATH": str(Path(__file__).parents[2]),
        "XDG_CACHE_HOME": str(tmp_path),
    }
    if command == "train":
        from hf_vanilla.cli.parsing import remember_training_arguments

        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
        remember_training_arguments()  # what the first run or --help does (this process has transformers)
    help_text = subprocess.run(
        [sys.executable, "-c", CODE.format(command=command, heavy=HEAVY)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=True,
    ).stdout
    assert "--debug" in help_text
    if command in ("plot", "publish"):  # a picture or a Hub folder needs no batching, backend or quantization
        for flag in ("--quantization", "--max_tokens", "--batch_size", "--backend", "--dtype"):
            assert flag not in help_text, flag
    assert help_text.splitlines()[-1] == "IMPORTED []", help_text.splitlines()[-1]


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


class _Recording(DataclassArgumentParser):
    """The light parser, remembering how the command built it."""

    made: list[tuple[object, dict, DataclassArgumentParser]] = []

    def __init__(self, dataclass_types: object, **kwargs: object) -> None:
        super().__init__(dataclass_types, **kwargs)
        _Recording.made.append((dataclass_types, kwargs, self))


@pytest.mark.parametrize("command", DATACLASS_COMMANDS)
def test_help_is_what_transformers_parser_says(
    command: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The light parser makes the options (flags, defaults, choices, types, help) that transformers'
    ``HfArgumentParser`` makes of the same dataclasses, so its ``--help`` cannot drift from the real one."""
    module = importlib.import_module(f"hf_vanilla.cli.{command}")
    monkeypatch.setenv("COLUMNS", "100")
    _Recording.made.clear()
    monkeypatch.setattr(hf_vanilla.cli, "DataclassArgumentParser", _Recording)
    if hasattr(module, "DataclassArgumentParser"):
        monkeypatch.setattr(module, "DataclassArgumentParser", _Recording)
    with pytest.raises(SystemExit):
        module.main(["--help"])
    light_help = capsys.readouterr().out
    ((types, kwargs, light),) = _Recording.made
    real = HfArgumentParser(types, **kwargs)
    add_debug_flag(real)
    assert light.format_help() == light_help
    assert light_help == real.format_help()

    assert _options(light) == _options(real)


def _options(parser: object, types: bool = True) -> list[tuple[object, ...]]:
    """What ``--help`` and parsing make of each option of ``parser``."""
    return [
        (
            a.option_strings,
            a.dest,
            a.default,
            a.nargs,
            a.const,
            None if a.choices is None else list(a.choices),
            a.required,
            a.help,
            type(a).__name__,
        )
        + ((getattr(a.type, "__name__", a.type),) if types else ())
        for a in parser._actions
    ]


def test_train_help_is_what_transformers_parser_says(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """``hf-vanilla-train --help`` (transformers' options from the description kept in the user's cache)
    says what ``HfArgumentParser`` says of the dataclasses a training run parses, and a run parses them
    as it does."""
    from hf_vanilla.cli.train import PARSER_KWARGS, help_parser, main, parser
    from hf_vanilla.data.options import DataArguments
    from hf_vanilla.hub.options import DatasetCardArguments
    from hf_vanilla.training.arguments import PaperTrainingArguments, TrainingModelArguments

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert help_parser() is None
    with pytest.raises(SystemExit):
        main(["--help"])  # the first help, from transformers' parser, keeps the description
    monkeypatch.setenv("COLUMNS", "100")
    types = (TrainingModelArguments, DataArguments, DatasetCardArguments, PaperTrainingArguments)
    real = HfArgumentParser(types, **PARSER_KWARGS)
    light = help_parser()
    assert light is not None
    assert light.format_help() == real.format_help()
    assert _options(light, types=False) == _options(real, types=False)
    assert _options(parser()) == _options(real)


def test_train_presets_are_the_configuration_presets() -> None:
    from hf_vanilla.models.vanilla_transformer.configuration_vanilla_transformer import PRESETS
    from hf_vanilla.training.options import PRESET_NAMES

    assert sorted(PRESET_NAMES) == sorted(PRESETS)


def test_train_help_of_another_transformers_version_comes_from_transformers(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A description of other transformers' options (or an unreadable one) is not used: the help then
    imports transformers."""
    import hf_vanilla.cli.train as train
    from hf_vanilla.cli.parsing import describe_training_arguments, training_arguments_cache

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    kept = training_arguments_cache()
    kept.parent.mkdir(parents=True)
    kept.write_text(json.dumps({**describe_training_arguments(), "transformers": "0.0.1"}), encoding="utf-8")
    assert train.help_parser() is None
    kept.write_text("{not json", encoding="utf-8")
    assert train.help_parser() is None
