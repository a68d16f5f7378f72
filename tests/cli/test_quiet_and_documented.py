"""A command's output holds its own messages (no torchao import noise), and the ONNX command line of
docs/interop.md runs as written."""

from __future__ import annotations

import importlib.util
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import ROOT, tiny_model

from hf_vanilla.data.tokenization import train_bpe_tokenizer
from hf_vanilla.hub.folder import save_model_folder

#: What torchao's import prints where its compiled kernels do not load, and torch's warning about its Enums.
TORCHAO_NOISE = ("torchao", "Failed to load", "_C_", "register_constant")

CODE = """
import sys
from hf_vanilla.cli.translate import main
status = main(sys.argv[1:])
print("torchao imported" if "torchao" in sys.modules else "torchao not imported")
sys.exit(status)
"""


def _env() -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


@pytest.mark.slow  # a translation in a fresh interpreter: 15-25 s on the shared 2 cores
def test_translate_prints_no_torchao_messages(tmp_path: Path) -> None:
    """transformers imports torchao at every model load where it is installed; a translation that does
    not quantize with it shows none of torchao's import messages."""
    if importlib.util.find_spec("torchao") is None:
        pytest.skip("torchao is not installed here: transformers does not import it, nothing to hide")
    tokenizer = train_bpe_tokenizer(["one two three"], vocab_size=300)
    folder = save_model_folder(tiny_model(vocab_size=len(tokenizer)), tokenizer, tmp_path / "model")
    (tmp_path / "in.txt").write_text("one two\n", encoding="utf-8")
    args = ["--model_name_or_path", str(folder), "--device", "cpu", "--num_beams", "1"]
    args += ["--input_file", str(tmp_path / "in.txt"), "--output_file", str(tmp_path / "out.txt")]
    result = subprocess.run(
        [sys.executable, "-c", CODE, *args], capture_output=True, text=True, env=_env(), timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "torchao imported" in result.stdout  # the noise had its chance
    noisy = [line for line in result.stderr.splitlines() if any(word in line for word in TORCHAO_NOISE)]
    assert noisy == []


def _documented_onnx_command() -> tuple[str, list[str]]:
    """The ``pip install ... && hf-vanilla-export-onnx ...`` line of docs/interop.md, as its two parts."""
    text = (ROOT / "docs" / "interop.md").read_text(encoding="utf-8")
    (line,) = [line for line in text.splitlines() if "hf-vanilla-export-onnx --" in line]
    install, command = (part.strip() for part in line.split("&&"))
    return install, shlex.split(command)


@pytest.mark.slow  # the ONNX export takes ~1 minute on 2 cores
def test_documented_onnx_command_runs_as_written(tmp_path: Path) -> None:
    """The command line docs/interop.md shows, run in a folder holding a (tiny) ``demo_output``."""
    install, command = _documented_onnx_command()
    assert install == 'pip install -e ".[onnx]"'  # the extra the export needs: installed or skipped
    for module in ("onnx", "onnxruntime", "onnxscript"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is missing: the documented command needs {install}")
    program = shutil.which(command[0], path=str(Path(sys.executable).parent))
    assert program is not None, f"{command[0]} is not installed beside {sys.executable}"
    tokenizer = train_bpe_tokenizer(["one two three"], vocab_size=300)
    save_model_folder(tiny_model(vocab_size=len(tokenizer)), tokenizer, tmp_path / "demo_output")
    result = subprocess.run(
        [program, *command[1:]], cwd=tmp_path, capture_output=True, text=True, env=_env(), timeout=900
    )
    assert result.returncode == 0, result.stderr[-3000:]
    written = {path.name for path in (tmp_path / "demo_output_onnx").iterdir()}
    assert {"encoder.onnx", "decoder_with_past.onnx", "config.json"} <= written
    # its output holds its own messages: the weights' loading bar and hf_vanilla's lines, nothing of torch's
    foreign = [
        line
        for line in result.stderr.splitlines()
        if line.strip() and not ("hf_vanilla" in line or "Loading weights" in line)
    ]
    assert foreign == [], foreign


def test_quiet_onnx_exporter_drops_only_the_notes_that_do_not_concern_the_model() -> None:
    """What :func:`hf_vanilla.cli.quiet_onnx_exporter` drops (torch's ONNX exporter on torch 2.13): the
    "torchvision is not installed" notes and torch's own ``LeafSpec`` FutureWarning; other messages of
    the same logger and other FutureWarnings still show."""
    import logging
    import warnings

    from hf_vanilla.cli import quiet_onnx_exporter

    quiet_onnx_exporter()
    logger = logging.getLogger("torch.onnx._internal.exporter._registration")
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logger.addHandler(handler)
    try:
        logger.warning("torchvision is not installed. Skipping torchvision::nms")
        logger.warning("Something else about the export")
    finally:
        logger.removeHandler(handler)
    assert [record.getMessage() for record in records] == ["Something else about the export"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.warn("`isinstance(treespec, LeafSpec)` is deprecated, use ...", FutureWarning, stacklevel=1)
        warnings.warn("another deprecation", FutureWarning, stacklevel=1)
    assert [str(warning.message) for warning in caught] == ["another deprecation"]
