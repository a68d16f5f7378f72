"""Mixed precision on the CPU as a route of ``hf-vanilla-train``: ``--bf16 auto`` follows the CPU's
bfloat16 instructions, ``--bf16`` is refused in one line on a CPU without them, the choice is logged, a
bfloat16 step's loss stays within a stated tolerance of float32's, and saved weights stay float32."""

from __future__ import annotations

import json
import logging
import math
import runpy
from pathlib import Path

import pytest
from safetensors import safe_open

from hf_vanilla.training import precision
from hf_vanilla.training.arguments import PaperTrainingArguments

ROOT = Path(__file__).resolve().parents[2]

#: How far a bfloat16 step's loss may be from float32's: 2^-8 of it, the spacing of bfloat16 numbers near
#: it (one unit in the last place). Autocast rounds the matmuls' inputs and outputs to bfloat16 (each
#: off by at most 2^-9 of itself), but computes the log-softmax and the loss in float32 and averages it
#: over every target token, where independent roundings mostly cancel: the loss stays within one
#: rounding of itself. Measured on this test's tiny model: 1.5e-5 and 6.8e-5 relative (steps 1 and 2).
BF16_LOSS_RTOL = 2**-8

NATIVE_BF16 = precision.cpu_bf16_instructions()
needs_native_bf16 = pytest.mark.skipif(
    NATIVE_BF16 is None, reason="this CPU has no native bfloat16 instructions (AVX512-BF16, AMX or Arm BF16)"
)


def _train(output_dir: Path, *extra: str) -> int:
    """``scripts/train.py`` in-process: the demo task, a tiny model, two logged steps, saved at the end."""
    argv = [
        "--demo", "--demo_train_size", "48", "--demo_validation_size", "4", "--demo_test_size", "0",
        "--tokenizer_vocab_size", "300", "--d_model", "32", "--layers", "2", "--attention_heads", "4",
        "--ffn_dim", "64", "--dropout", "0", "--max_steps", "2", "--learning_rate", "1e-3", "--warmup_steps", "1",
        "--logging_steps", "1", "--save_strategy", "no", "--eval_strategy", "no", "--do_eval", "false",
        "--report_to", "none", "--use_cpu", "--disable_tqdm", "true", "--seed", "0",
        "--output_dir", str(output_dir), *extra,
    ]  # fmt: skip
    return runpy.run_path(str(ROOT / "scripts" / "train.py"))["main"](argv)


def _losses(output_dir: Path) -> list[float]:
    state = json.loads((output_dir / "trainer_state.json").read_text(encoding="utf-8"))
    return [entry["loss"] for entry in state["log_history"] if "loss" in entry]


def _arguments(tmp_path: Path, bf16: str) -> PaperTrainingArguments:
    return PaperTrainingArguments(output_dir=str(tmp_path / "out"), use_cpu=True, report_to="none", bf16=bf16)


@pytest.mark.parametrize(("instructions", "chosen"), [("AMX", True), ("AVX512-BF16", True), (None, False)])
def test_bf16_auto_trains_in_bfloat16_exactly_where_the_cpu_has_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, instructions: str | None, chosen: bool
) -> None:
    monkeypatch.setattr(precision, "cpu_bf16_instructions", lambda: instructions)
    args = _arguments(tmp_path, "auto")
    assert args.bf16 is chosen
    assert args.mixed_precision == ("bf16" if chosen else "no")  # what accelerate's autocast reads


@pytest.mark.parametrize(("value", "chosen"), [("true", True), ("false", False), ("1", True), ("no", False)])
def test_bf16_true_and_false_keep_their_meaning_on_a_cpu_with_bfloat16(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: str, chosen: bool
) -> None:
    monkeypatch.setattr(precision, "cpu_bf16_instructions", lambda: "AMX")
    assert _arguments(tmp_path, value).bf16 is chosen


def test_bf16_on_a_cpu_without_bfloat16_is_one_line_saying_what_to_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(precision, "cpu_bf16_instructions", lambda: None)
    out = tmp_path / "out"
    status = _train(out, "--bf16")
    err = capsys.readouterr().err
    assert status == 1, err[-2000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: --bf16: this run trains on a CPU without native bfloat16"), err[-2000:]
    assert "--bf16 auto" in last and "nothing was done" in last
    assert "Traceback" not in err
    assert not out.exists()  # refused before any work


@needs_native_bf16
def test_a_bf16_step_is_within_tolerance_of_float32_and_saves_float32_weights(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The same two steps (same seed, data and model) in float32 and with ``--bf16 auto``: the logged
    losses of both steps (the second one after a bfloat16 backward pass and update) agree within
    :data:`BF16_LOSS_RTOL` but not exactly (autocast really ran), the run logs its choice, and the saved
    model holds float32 weights and says so."""
    assert _train(tmp_path / "fp32", "--bf16", "false") == 0
    with caplog.at_level(logging.INFO, logger="hf_vanilla.training.run"):
        assert _train(tmp_path / "bf16", "--bf16", "auto") == 0
    assert f"Precision: bfloat16 autocast on the CPU ({NATIVE_BF16})" in caplog.text

    fp32, bf16 = _losses(tmp_path / "fp32"), _losses(tmp_path / "bf16")
    assert len(fp32) == len(bf16) == 2
    assert bf16 != fp32  # the bfloat16 run computed differently
    for low, full in zip(bf16, fp32, strict=True):
        assert math.isclose(low, full, rel_tol=BF16_LOSS_RTOL), (bf16, fp32)

    folder = tmp_path / "bf16"
    assert json.loads((folder / "training_args.json").read_text(encoding="utf-8"))["bf16"] is True
    with safe_open(str(folder / "model.safetensors"), "pt") as weights:
        assert {weights.get_slice(name).get_dtype() for name in weights.keys()} == {"F32"}  # noqa: SIM118
    assert json.loads((folder / "config.json").read_text(encoding="utf-8"))["dtype"] == "float32"
