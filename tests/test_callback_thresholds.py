"""`EvaluationCallback` on a real Trainer: threshold alerts and stops, and an `evaluate_fn` that fails."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import pytest
import torch
from callback_helpers import QUIET_WARNINGS, CountingModule, history_steps, make_trainer
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.trainer.states import TrainerStatus
from torchmetrics import CatMetric

from areal_lightning.callbacks.evaluation_callback import EvaluationCallback
from areal_lightning.callbacks.sanity import MetricNameError
from areal_lightning.eval_round import EvalRoundError
from areal_lightning.metrics import RewardMetric
from areal_lightning.tracking.history import eval_rows, event_rows, read_history

pytestmark = [pytest.mark.filterwarnings(w) for w in QUIET_WARNINGS]

THRESHOLD = 0.7
# Mean reward per eval set at global steps 1..8 (one evaluation per step).
SCRIPT: dict[str, list[float]] = {
    "easy": [0.6, 0.9, 0.6, 0.5, 0.8, 0.75, 0.4, 0.95],  # below before ever reaching it: no alert
    "hard": [0.7, 0.2, 0.1, 0.7, 0.71, 0.69, 0.3, 0.9],  # reaching it exactly arms too
}
EVAL_SETS = {name: list(range(4)) for name in SCRIPT}


def scripted_rewards(module: Any, batches: Any, ctx: Any) -> dict[str, Any]:
    """Rewards all equal to the script's value for this eval set and step (reported as reward/mean)."""
    value = SCRIPT[ctx.dataset][ctx.global_step - 1]
    reward = ctx.metric("reward", RewardMetric)
    for batch in batches:
        reward.update(torch.full((len(batch.samples),), value, dtype=torch.float64))
    return {}


def expected_alerts(threshold: float, from_start: bool = False) -> list[tuple[int, str, float]]:
    """One alert per downward crossing: a value below the threshold after one at or above it (or,
    `from_start`, also the first value below it before it was ever reached)."""
    alerts = []
    for dataset, values in SCRIPT.items():
        armed = from_start
        for step, value in enumerate(values, start=1):
            if value >= threshold:
                armed = True
            elif armed:
                alerts.append((step, dataset, value))
                armed = False
    return sorted(alerts)


def test_alert_is_recorded_once_per_downward_crossing(tmp_path: Path) -> None:
    callback = EvaluationCallback(
        EVAL_SETS, scripted_rewards, schedule={"freq_steps": 1}, decisions={"metric_thresholds": {"reward": THRESHOLD}}
    )
    trainer = make_trainer(tmp_path, [callback], len(SCRIPT["easy"]))
    trainer.fit(CountingModule())

    alerts = event_rows(read_history(tmp_path), "alert")
    got = sorted((a["step"], a["dataset"], a["value"]) for a in alerts)
    assert got == [(s, d, pytest.approx(v)) for s, d, v in expected_alerts(THRESHOLD)]
    assert len(got) == 4
    for alert in alerts:
        assert (alert["metric"], alert["threshold"]) == ("reward/mean", THRESHOLD)  # `reward` watches reward/mean
        assert f"eval/{alert['dataset']}/reward/mean fell to" in alert["message"]
    assert trainer.global_step == len(SCRIPT["easy"])  # alerts do not stop training


def test_alert_from_start_also_alerts_on_a_metric_that_starts_below_its_threshold(tmp_path: Path) -> None:
    decisions = {"metric_thresholds": {"reward": THRESHOLD}, "alert_from_start": True}
    callback = EvaluationCallback(EVAL_SETS, scripted_rewards, schedule={"freq_steps": 1}, decisions=decisions)
    make_trainer(tmp_path, [callback], len(SCRIPT["easy"])).fit(CountingModule())

    alerts = event_rows(read_history(tmp_path), "alert")
    got = sorted((a["step"], a["dataset"], a["value"]) for a in alerts)
    assert got == [(s, d, pytest.approx(v)) for s, d, v in expected_alerts(THRESHOLD, from_start=True)]
    first = next(a for a in alerts if (a["step"], a["dataset"]) == (1, "easy"))  # 0.6 before ever reaching 0.7
    assert (
        "eval/easy/reward/mean is 0.6 at step 1, below its threshold 0.7 (it has not reached it yet)"
        in (first["message"])
    )
    assert len(got) == len(expected_alerts(THRESHOLD)) + 1


def test_threshold_action_stop_stops_training_cleanly_after_the_alert(tmp_path: Path) -> None:
    max_steps = 20
    callback = EvaluationCallback(
        EVAL_SETS,
        scripted_rewards,
        schedule={"freq_steps": 1},
        decisions={"metric_thresholds": {"reward": THRESHOLD}, "threshold_action": "stop"},
    )
    trainer = make_trainer(tmp_path, [callback], max_steps)
    trainer.fit(CountingModule())  # returns normally

    first_alert_step = expected_alerts(THRESHOLD)[0][0]
    assert trainer.global_step == first_alert_step < max_steps
    assert trainer.state.status == TrainerStatus.FINISHED
    assert [a["step"] for a in event_rows(read_history(tmp_path), "alert")] == [first_alert_step]
    # The last step was just evaluated: stopping adds no second evaluation at the end.
    assert history_steps(tmp_path) == [(s, ["steps"]) for s in range(1, first_alert_step + 1)]


@pytest.mark.parametrize("sanity_batches", [1, 0])
def test_an_unknown_threshold_metric_is_refused_by_the_sanity_pass_or_else_the_first_round(
    tmp_path: Path, sanity_batches: int
) -> None:
    callback = EvaluationCallback(
        EVAL_SETS,
        scripted_rewards,
        schedule={"freq_steps": 2},
        rounds={"sanity_batches": sanity_batches},
        decisions={"metric_thresholds": {"reward": THRESHOLD, "rewards": 0.5}},
    )
    trainer = make_trainer(tmp_path, [callback], 6)
    message = (
        r"`Decisions\(metric_thresholds=...\)` names the metric 'rewards', which no eval set produces \(did you "
        r"mean reward/\w+\?\). Produced: eval_secs, reward/max, reward/mean, reward/mean/best, "
        r"reward/mean/best_step, reward/min, reward/std"
    )
    with pytest.raises(MetricNameError, match=message):
        trainer.fit(CountingModule())
    if sanity_batches:
        assert trainer.global_step == 0  # refused before any training step
        assert not (tmp_path / "eval_history.jsonl").exists()
    else:  # the first round stands in: it is recorded, then the name is refused
        assert trainer.global_step == 2
        assert history_steps(tmp_path) == [(2, ["steps"])]


def _fails_at_step_4(module: Any, batches: Any, ctx: Any) -> dict[str, float]:
    if ctx.global_step == 4:
        raise ValueError("no answer could be parsed at step 4")
    return {"w": float(module.w)}


def test_a_failing_evaluate_fn_is_recorded_and_training_goes_on(tmp_path: Path) -> None:
    module = CountingModule()
    trainer = make_trainer(
        tmp_path, [EvaluationCallback({"probe": [1, 2]}, _fails_at_step_4, schedule={"freq_steps": 2})], 7
    )
    trainer.fit(module)

    assert trainer.global_step == 7
    assert history_steps(tmp_path) == [(2, ["steps"]), (6, ["steps"]), (7, ["end"])]
    errors = event_rows(read_history(tmp_path), "error")
    assert [e["step"] for e in errors] == [4]
    assert "ValueError: no answer could be parsed at step 4" in errors[0]["message"]
    assert "evaluation of eval set 'probe' failed" in errors[0]["message"]
    assert module.training and torch.is_grad_enabled()  # the failed round left no eval mode behind


def _hard_fails_at_step_4(module: Any, batches: Any, ctx: Any) -> dict[str, float]:
    if ctx.dataset == "hard" and ctx.global_step == 4:
        raise ValueError("the hard set's scorer broke")
    return {"w": float(module.w)}


def test_a_failing_eval_set_costs_only_itself(tmp_path: Path) -> None:
    callback = EvaluationCallback({"easy": [1, 2], "hard": [3]}, _hard_fails_at_step_4, schedule={"freq_steps": 2})
    trainer = make_trainer(tmp_path, [callback], 6, logger=CSVLogger(tmp_path, name="csv", version=0))
    trainer.fit(CountingModule())

    records = read_history(tmp_path)
    assert [(r["step"], r["dataset"]) for r in eval_rows(records)] == [
        (2, "easy"),
        (2, "hard"),
        (4, "easy"),
        (6, "easy"),
        (6, "hard"),
    ]  # step 4: easy is kept, and hard alone is an error record that names it
    errors = event_rows(records, "error")
    assert [(e["step"], e["dataset"]) for e in errors] == [(4, "hard")]
    assert "the hard set's scorer broke" in errors[0]["message"]
    with open(tmp_path / "csv" / "version_0" / "metrics.csv") as f:
        logged = {int(row["step"]) for row in csv.DictReader(f) if row.get("eval/easy/w")}
    assert logged == {2, 4, 6}  # the easy set of the failed round reached the loggers too


def test_on_error_raise_fails_fast(tmp_path: Path) -> None:
    callback = EvaluationCallback(
        {"probe": [1, 2]}, _fails_at_step_4, schedule={"freq_steps": 2}, rounds={"on_error": "raise"}
    )
    trainer = make_trainer(tmp_path, [callback], 7)
    with pytest.raises(EvalRoundError, match=r"eval set 'probe' failed: rank 0: ValueError: no answer could be parsed"):
        trainer.fit(CountingModule())
    assert trainer.global_step == 4
    assert history_steps(tmp_path) == [(2, ["steps"])]
    assert [e["step"] for e in event_rows(read_history(tmp_path), "error")] == [4]  # why it stopped


def _vector_metric(module: Any, batches: Any, ctx: Any) -> dict[str, Any]:
    values = ctx.metric("values", CatMetric)  # computes a vector, which no logger can plot
    for batch in batches:
        values.update(torch.tensor(batch.samples, dtype=torch.float64))
    return {}


def test_a_metric_that_does_not_compute_a_scalar_is_a_recorded_error(tmp_path: Path) -> None:
    trainer = make_trainer(
        tmp_path, [EvaluationCallback({"probe": [1, 2]}, _vector_metric, schedule={"freq_steps": 2})], 4
    )
    with pytest.raises(EvalRoundError, match="sanity pass"):  # caught before training starts
        trainer.fit(CountingModule())

    assert trainer.global_step == 0
    errors = event_rows(read_history(tmp_path), "error")
    assert [(e["step"], e["dataset"]) for e in errors] == [(0, "probe")]
    assert "computing metric 'values' raised" in errors[0]["message"]
    assert "a metric must compute a scalar or a mapping of scalars" in errors[0]["message"]
