"""Training for a time budget (hf_vanilla/training/time_budget.py): ``--max_train_minutes`` stops the run by
the clock with a checkpoint, summed over resumes; ``--lr_cooldown_fraction`` lowers Eq. (3) linearly in time
to 0 over the end of the budget. The clock is a fake one: each optimizer step takes one "minute"."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from test_faults import _dataset, _trainer, _word_tokenizer

from hf_vanilla.training import time_budget
from hf_vanilla.training.arguments import PaperTrainingArguments
from hf_vanilla.training.schedule import PaperLRLambda
from hf_vanilla.training.time_budget import TrainingTimeBudget

PEAK = 1e-3
WARMUP = 2


class _MinutePerCall:
    """A clock that moves one minute at each reading: the budget reads it once when training begins and
    once per optimizer step, so after update k it has counted k minutes."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> float:
        self.calls += 1
        return 60.0 * (self.calls - 1)


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return _word_tokenizer()


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory, tokenizer: Any) -> Any:
    return _dataset(tmp_path_factory.mktemp("data"), tokenizer)


def _timed_trainer(output_dir: Path, tokenizer: Any, data: Any, **overrides: Any) -> Any:
    settings = {"max_steps": 100, "save_steps": 1000, "warmup_steps": WARMUP, "learning_rate": PEAK}
    trainer = _trainer(output_dir, tokenizer, data, **{**settings, **overrides})
    budget = trainer._time_budget()
    assert budget is not None
    budget._clock = _MinutePerCall()
    return trainer


def _learning_rates(trainer: Any) -> list[float]:
    """The rate each update used (the Trainer logs it before stepping the schedule), in step order."""
    return [entry["learning_rate"] for entry in trainer.state.log_history if "learning_rate" in entry]


def test_the_cooldown_scale_falls_linearly_over_the_last_fraction_of_the_budget() -> None:
    budget = TrainingTimeBudget(minutes=10, cooldown_fraction=0.5)
    for minutes, scale in [(0, 1.0), (5, 1.0), (6, 0.8), (7.5, 0.5), (10, 0.0), (11, 0.0)]:
        budget.trained_seconds = 60 * minutes
        assert budget.learning_rate_scale() == pytest.approx(scale)
    budget = TrainingTimeBudget(minutes=10)
    budget.trained_seconds = 599
    assert budget.learning_rate_scale() == 1.0  # no cool-down: Eq. (3) to the end


def test_the_run_stops_at_the_first_step_end_past_the_budget_with_a_checkpoint(
    tmp_path: Path, tokenizer: Any, data: Any
) -> None:
    out = tmp_path / "run"
    trainer = _timed_trainer(out, tokenizer, data, max_train_minutes=5)
    trainer.train()
    assert trainer.state.global_step == 5  # of max_steps 100
    assert (out / "checkpoint-5").is_dir()  # saved at the stop, though save_steps is 1000
    saved = json.loads((out / "checkpoint-5" / "trainer_state.json").read_text(encoding="utf-8"))
    assert saved["stateful_callbacks"]["TrainingTimeBudget"]["attributes"]["trained_seconds"] == 300.0
    # Without a cool-down the schedule is Eq. (3) to the last step.
    assert _learning_rates(trainer) == pytest.approx([PEAK * PaperLRLambda(WARMUP)(k) for k in range(5)])


@pytest.mark.parametrize("restore", [False, True])
def test_a_resumed_run_counts_the_minutes_trained_before(
    tmp_path: Path, tokenizer: Any, data: Any, restore: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Also with transformers' ``restore_callback_states_from_checkpoint``, which replaces the callback by
    a new one built from the checkpoint's budget: this run's options still win, and the schedule looks the
    callback up at each step."""
    out = tmp_path / "run"
    _timed_trainer(out, tokenizer, data, max_train_minutes=5, max_steps=3, save_steps=3).train()
    resumed = _timed_trainer(
        out,
        tokenizer,
        data,
        max_train_minutes=5,
        lr_cooldown_fraction=0.4,
        restore_callback_states_from_checkpoint=restore,
    )
    if restore:  # the rebuilt callback reads the default clock
        monkeypatch.setattr(time_budget.time, "monotonic", _MinutePerCall())
    resumed.train(resume_from_checkpoint=str(out / "checkpoint-3"))
    assert resumed.state.global_step == 5  # 3 minutes before, 2 now
    assert (out / "checkpoint-5").is_dir()
    # Update 5 comes after 4 minutes: the cool-down (the last 2 of 5 minutes) is half done.
    assert _learning_rates(resumed)[-1] == pytest.approx(PEAK * PaperLRLambda(WARMUP)(4) * 0.5)


def test_the_cooldown_multiplies_eq_3_by_the_remaining_share_of_its_minutes(
    tmp_path: Path, tokenizer: Any, data: Any
) -> None:
    trainer = _timed_trainer(tmp_path / "run", tokenizer, data, max_train_minutes=6, lr_cooldown_fraction=0.5)
    trainer.train()
    assert trainer.state.global_step == 6
    # Update k uses Eq. (3) at step k times the scale after k - 1 minutes: 1 until minute 3, then
    # (6 - minutes) / 3.
    scales = [1, 1, 1, 1, 2 / 3, 1 / 3]
    expected = [PEAK * PaperLRLambda(WARMUP)(k) * scale for k, scale in enumerate(scales)]
    assert _learning_rates(trainer) == pytest.approx(expected)


def test_a_cooled_schedule_saves_the_state_of_a_plain_one(tmp_path: Path, tokenizer: Any, data: Any) -> None:
    """scheduler.pt holds no reference to the clock, so runs resume across the two."""
    plain = _timed_trainer(tmp_path / "plain", tokenizer, data, max_train_minutes=2)
    cooled = _timed_trainer(
        tmp_path / "cooled", tokenizer, data, max_train_minutes=2, lr_cooldown_fraction=0.5
    )
    for trainer in (plain, cooled):
        trainer.train()
    assert type(cooled.lr_scheduler).__name__ == "ScaledLambdaLR"
    assert cooled.lr_scheduler.state_dict().keys() == plain.lr_scheduler.state_dict().keys()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"lr_cooldown_fraction": 0.2}, "no --max_train_minutes was given"),
        (
            {"max_train_minutes": 5, "lr_cooldown_fraction": 0.2, "lr_scheduler_type": "linear"},
            "cools Eq. (3)'s schedule",
        ),
        ({"max_train_minutes": -1}, "--max_train_minutes"),
        ({"max_train_minutes": 5, "lr_cooldown_fraction": 1.5}, "--lr_cooldown_fraction"),
    ],
)
def test_impossible_budgets_are_refused_in_one_line(
    tmp_path: Path, options: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=r".*") as refused:
        PaperTrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none", **options)
    assert message in str(refused.value)
    assert "\n" not in str(refused.value)
