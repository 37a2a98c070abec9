"""The reward-hacking watch: an alert when the training reward rises while an eval metric falls
beyond its paired noise; none on noise, on a flat reward, or twice for one episode."""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from callback_helpers import QUIET_WARNINGS, CountingModule, make_trainer
from torch import Tensor

from areal_lightning.callbacks.evaluation_callback import EvaluationCallback
from areal_lightning.callbacks.reward_hacking import ALERT_KIND, RewardWatch, reward_hacking
from areal_lightning.errors import ArgumentError
from areal_lightning.tracking.history import event_rows, read_history

pytestmark = [pytest.mark.filterwarnings(w) for w in QUIET_WARNINGS]

NAN = math.nan


def _alert_steps(watch: RewardWatch, rounds: list[tuple[int, float | None, dict[str, float]]]) -> list[int]:
    return [a.step for step, train, metrics in rounds for a in watch.observe(step, train, {"easy": metrics})]


def test_decision_needs_a_reward_rise_and_a_fall_beyond_noise() -> None:
    rule = dict(min_train_rise=0.05, tolerance=None)
    assert reward_hacking(0.10, -0.2, -0.01, **rule)
    assert not reward_hacking(0.10, -0.2, 0.01, **rule)  # the interval holds 0: noise
    assert not reward_hacking(0.04, -0.2, -0.01, **rule)  # the reward did not rise enough
    assert not reward_hacking(NAN, -0.2, -0.01, **rule)  # no training reward known
    assert not reward_hacking(0.10, -0.2, None, **rule)  # no interval and no tolerance: no decision
    assert reward_hacking(0.10, -0.2, NAN, min_train_rise=0.05, tolerance=0.1)
    assert not reward_hacking(0.10, -0.05, None, min_train_rise=0.05, tolerance=0.1)


def test_one_alert_per_episode_and_again_after_recovery() -> None:
    watch = RewardWatch("accuracy", min_train_rise=0.05)
    rounds = [
        (10, 0.20, {"accuracy": 0.50}),
        (20, 0.30, {"accuracy": 0.40, "accuracy/delta_ci_high": -0.02}),  # diverges: alert
        (30, 0.40, {"accuracy": 0.30, "accuracy/delta_ci_high": -0.03}),  # same episode: quiet
        (40, 0.45, {"accuracy": 0.35, "accuracy/delta_ci_high": 0.10}),  # recovers (noise): re-arms
        (50, 0.60, {"accuracy": 0.20, "accuracy/delta_ci_high": -0.05}),  # a new episode: alert
        (60, 0.60, {"accuracy": 0.10, "accuracy/delta_ci_high": -0.05}),  # reward flat: no hacking sign
    ]
    assert _alert_steps(watch, rounds) == [20, 50]


def test_against_the_best_round_a_slow_drift_alerts() -> None:
    # Each round falls within its noise against the previous one; against the best round it does not.
    rounds = [
        (10, 0.20, {"accuracy": 0.60}),
        (20, 0.24, {"accuracy": 0.57, "accuracy/delta_ci_high": 0.01, "accuracy/delta_best_ci_high": 0.01}),
        (30, 0.28, {"accuracy": 0.54, "accuracy/delta_ci_high": 0.01, "accuracy/delta_best_ci_high": -0.01}),
    ]
    assert _alert_steps(RewardWatch("accuracy", since="previous"), rounds) == []
    alerts = RewardWatch("accuracy", since="best").observe(0, None, {})  # nothing yet
    assert alerts == []
    watch = RewardWatch("accuracy", since="best")
    assert _alert_steps(watch, rounds) == [30]


def test_metric_without_outcomes_uses_the_tolerance_and_the_watch_resumes() -> None:
    watch = RewardWatch("judge_score", "train/reward_ema", eval_set="easy", min_train_rise=0.1, tolerance=0.05)
    assert _alert_steps(watch, [(10, 0.3, {"judge_score": 0.8}), (20, 0.5, {"judge_score": 0.77})]) == []
    resumed = RewardWatch("judge_score", "train/reward_ema", eval_set="easy", min_train_rise=0.1, tolerance=0.05)
    resumed.load_state_dict(watch.state_dict())
    assert _alert_steps(resumed, [(30, 0.7, {"judge_score": 0.60})]) == [30]  # against step 20, kept in the state
    fresh = RewardWatch("judge_score", tolerance=0.05)
    fresh.load_state_dict({})
    assert _alert_steps(fresh, [(30, 0.7, {"judge_score": 0.60})]) == []  # nothing to compare with
    assert watch.observe(40, 0.9, {"hard": {"judge_score": 0.0}}) == []  # another eval set is not watched


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ArgumentError, match=r"RewardWatch\(min_train_rise=...\)` must be a number >= 0, got -1"):
        RewardWatch("accuracy", min_train_rise=-1)
    with pytest.raises(ArgumentError, match=r"Possible choices are: previous, best"):
        RewardWatch("accuracy", since="worst")
    with pytest.raises(ArgumentError, match="metric"):
        RewardWatch("")
    with pytest.raises(ArgumentError, match="reward_watch"):
        EvaluationCallback(
            {"easy": [1]}, lambda m, b, c: {}, schedule={"freq_steps": 1}, decisions={"reward_watch": "accuracy"}
        )


# ---- with a Trainer: a module whose training reward rises every step, scripted eval outcomes ----

PROMPTS = 40
# Correct prompts (index ranges) by evaluated step. "diverging": a clear, consistent fall at step 8;
# "noise": at step 8 four prompts flip down and two flip up (mean -0.05, interval holds 0).
SCRIPTS: dict[str, dict[int, range]] = {
    "diverging": {2: range(0, 20), 4: range(0, 24), 6: range(0, 28), 8: range(0, 18), 10: range(0, 12)},
    "noise": {2: range(0, 20), 4: range(0, 24), 6: range(0, 28), 8: range(4, 30), 10: range(3, 30)},
}


class RewardRising(CountingModule):
    """Logs ``train/reward`` = 0.1 per optimizer step done, as `GRPOModule` logs its mean reward."""

    def training_step(self, batch: list[Tensor], batch_idx: int) -> Tensor:
        self.log("train/reward", 0.1 * (self.global_step + 1))
        return super().training_step(batch, batch_idx)


def _scripted(script: str) -> Any:
    def evaluate(module: Any, batches: Any, ctx: Any) -> dict[str, Any]:
        script_steps = SCRIPTS[script]
        correct = script_steps[min(script_steps) if ctx.sanity else ctx.global_step]  # the sanity pass: any round
        indices = [i for b in batches for i in b.indices]
        outcomes = [float(i in correct) for i in indices]
        ctx.record_outcomes("task_accuracy", indices, outcomes)  # per-prompt: paired intervals
        return {"task_accuracy": torch.tensor(outcomes, dtype=torch.float64)}

    return evaluate


@pytest.mark.parametrize("script", ["diverging", "noise"])
def test_trainer_alerts_on_a_scripted_divergence_and_not_on_noise(
    tmp_path: Path, script: str, caplog: pytest.LogCaptureFixture
) -> None:
    cb = EvaluationCallback(
        {"easy": list(range(PROMPTS))},
        _scripted(script),
        schedule={"freq_steps": 2, "eval_at_end": False},
        decisions={"reward_watch": {"metric": "task_accuracy", "min_train_rise": 0.1}},
    )
    with caplog.at_level(logging.WARNING):
        make_trainer(tmp_path, [cb], max_steps=10).fit(RewardRising(epoch_len=10))
    alerts = event_rows(read_history(tmp_path), "alert")
    if script == "noise":
        assert alerts == []
        return
    assert [(a["step"], a["kind"], a["reference_step"]) for a in alerts] == [(8, ALERT_KIND, 6)]
    assert alerts[0]["train_rise"] == pytest.approx(0.2) and alerts[0]["change"] == pytest.approx(-0.25)
    assert alerts[0]["change_ci_high"] < 0
    assert "possible reward hacking at step 8" in caplog.text
