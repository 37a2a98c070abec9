"""`BestValues` without a Trainer: the best value and its step per eval set and metric, in either
direction, ties and NaN, what is logged, the messages of bad arguments, and what a resume restores."""

from __future__ import annotations

import math
from typing import Any

import pytest

from areal_lightning.callbacks.best import BestValues, improves
from areal_lightning.callbacks.choices import Direction
from areal_lightning.errors import ArgumentError


def test_a_value_improves_strictly_in_its_direction_and_nan_never_does() -> None:
    assert improves(0.7, 0.6, Direction.MAX) and not improves(0.5, 0.6, Direction.MAX)
    assert improves(0.5, 0.6, Direction.MIN) and not improves(0.7, 0.6, Direction.MIN)
    assert not improves(0.6, 0.6, Direction.MAX) and not improves(0.6, 0.6, Direction.MIN)  # a tie keeps the first
    assert improves(-1.0, None, Direction.MAX) and improves(1.0, None, Direction.MIN)
    assert improves(0.1, math.nan, Direction.MAX) and improves(0.1, math.nan, Direction.MIN)  # NaN is no best
    assert not improves(math.nan, None, Direction.MAX) and not improves(math.nan, 0.5, Direction.MIN)


def test_each_watched_metric_keeps_its_best_and_step_per_eval_set() -> None:
    best = BestValues({"accuracy": "max", "loss": "min"})
    assert best.update("easy", {"accuracy": 0.5, "loss": 2.0, "other": 9.0}, step=10) == {
        "accuracy/best": 0.5,
        "accuracy/best_step": 10.0,
        "loss/best": 2.0,
        "loss/best_step": 10.0,
    }
    out = best.update("easy", {"accuracy": 0.7, "loss": 3.0}, step=20)
    assert out == {"accuracy/best": 0.7, "accuracy/best_step": 20.0, "loss/best": 2.0, "loss/best_step": 10.0}
    assert all(isinstance(v, float) for v in out.values())
    assert best.update("hard", {"accuracy": 0.1}, step=20) == {"accuracy/best": 0.1, "accuracy/best_step": 20.0}
    assert best.best("easy", "accuracy") == (0.7, 20) and best.best("hard", "loss") is None
    assert best.best("unseen", "accuracy") is None


def test_a_round_without_the_metric_still_reports_the_best_so_far() -> None:
    best = BestValues({"accuracy": "max"})
    assert best.update("easy", {"reward/mean": 1.0}, step=5) == {}  # nothing yet
    best.update("easy", {"accuracy": 0.4}, step=10)
    assert best.update("easy", {"reward/mean": 1.0}, step=15) == {"accuracy/best": 0.4, "accuracy/best_step": 10.0}
    assert best.update("easy", {"accuracy": math.nan}, step=20) == {"accuracy/best": 0.4, "accuracy/best_step": 10.0}


def test_a_resume_restores_every_best_and_an_old_checkpoint_restores_none() -> None:
    best = BestValues({"accuracy": "max"})
    best.update("easy", {"accuracy": 0.5}, step=10)
    best.update("hard", {"accuracy": 0.2}, step=10)
    state = best.state_dict()
    assert state == {"best": {"easy": {"accuracy": [0.5, 10]}, "hard": {"accuracy": [0.2, 10]}}}
    resumed = BestValues({"accuracy": "max"})
    resumed.load_state_dict(state)
    assert resumed.best("easy", "accuracy") == (0.5, 10) and resumed.best("hard", "accuracy") == (0.2, 10)
    assert resumed.update("easy", {"accuracy": 0.45}, step=30) == {"accuracy/best": 0.5, "accuracy/best_step": 10.0}
    old = BestValues({"accuracy": "max"})
    old.load_state_dict({})
    assert old.best("easy", "accuracy") is None


def test_no_directions_watches_nothing() -> None:
    assert BestValues().directions == {} and BestValues(None).update("easy", {"accuracy": 1.0}, step=1) == {}
    assert BestValues({"loss": Direction.MIN}).directions == {"loss": Direction.MIN}


@pytest.mark.parametrize(
    ("directions", "message"),
    [
        (
            ["accuracy"],
            '`EvaluationCallback(best_metrics=...)` must be a mapping of metric names to "max" or "min",'
            ' e.g. {"accuracy": "max"}, got [\'accuracy\']',
        ),
        (
            {"": "max"},
            "`EvaluationCallback(best_metrics=...)` must be metric names as keys, e.g. accuracy, got ''",
        ),
        (
            {3: "max"},
            "`EvaluationCallback(best_metrics=...)` must be metric names as keys, e.g. accuracy, got 3",
        ),
        (
            {"accuracy": "up"},
            "Unsupported parameter value `EvaluationCallback(best_metrics.accuracy='up')`. Possible choices are:"
            " max, min",
        ),
    ],
)
def test_bad_directions_are_refused_naming_what_is_accepted(directions: Any, message: str) -> None:
    with pytest.raises(ArgumentError) as info:
        BestValues(directions)
    assert str(info.value) == message
