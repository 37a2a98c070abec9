"""`AdaptiveSchedule` without a Trainer: when a round is due, what counts as "the metric moved"
(on which eval set, NaN bounds), how the interval changes at the bounds, the messages of bad
arguments, the schedule's description, and what a resume restores."""

from __future__ import annotations

import math
from typing import Any

import pytest

from areal_lightning.callbacks.adaptive import AdaptiveSchedule, IntervalChange, next_interval
from areal_lightning.errors import ArgumentError

MOVED_UP = (0.01, 0.05)
MOVED_DOWN = (-0.05, -0.01)
FLAT = (-0.02, 0.02)
NAN = (math.nan, 0.3)


def test_the_interval_halves_doubles_or_stays_and_never_leaves_the_bounds() -> None:
    assert next_interval(41, True, 1, 1000) == 20  # floor of 20.5
    assert next_interval(41, False, 1, 1000) == 82
    assert next_interval(41, False, 1, 1000, factor=1.5) == 62  # ceil of 61.5
    assert next_interval(41, True, 1, 1000, factor=3.0) == 13  # floor of 13.67
    assert next_interval(41, None, 1, 1000) == 41
    assert next_interval(41, None, 50, 60) == 50 and next_interval(70, None, 50, 60) == 60
    assert next_interval(11, True, 10, 20) == 10 and next_interval(11, False, 10, 20) == 20
    assert isinstance(next_interval(40, False, 10, 160, factor=2.0), int)


def test_a_round_is_due_once_the_interval_has_passed_since_the_last_one() -> None:
    s = AdaptiveSchedule("accuracy", min_steps=10, max_steps=80)
    assert not s.due(9) and s.due(10) and s.due(11)
    s.observe(13, {"easy": {"accuracy": FLAT}})  # a round at step 13 (any cause): the next 20 later
    assert s.interval == 20 and s.last_step == 13
    assert not s.due(32) and s.due(33)


def test_a_change_whose_interval_excludes_zero_either_way_is_movement() -> None:
    s = AdaptiveSchedule("accuracy", min_steps=10, max_steps=80)
    assert s.moved({"easy": {"accuracy": MOVED_UP}}) is True
    assert s.moved({"easy": {"accuracy": MOVED_DOWN}}) is True
    assert s.moved({"easy": {"accuracy": FLAT}}) is False
    assert s.moved({"easy": {"accuracy": (0.0, 0.05)}}) is False  # touching 0 is not excluding it
    assert s.moved({"easy": {"accuracy": (-0.05, 0.0)}}) is False


def test_nothing_known_when_no_watched_set_has_a_finite_interval() -> None:
    s = AdaptiveSchedule("accuracy", min_steps=10, max_steps=80)
    assert s.moved({}) is None
    assert s.moved({"easy": {"reward/mean": MOVED_UP}}) is None  # another metric
    assert s.moved({"easy": {"accuracy": NAN}}) is None
    assert s.moved({"easy": {"accuracy": (0.1, math.nan)}}) is None
    assert s.moved({"easy": {"accuracy": NAN}, "hard": {"accuracy": MOVED_UP}}) is True  # any set moved
    assert s.moved({"easy": {"accuracy": FLAT}, "hard": {"accuracy": MOVED_UP}}) is True


def test_a_watched_eval_set_ignores_the_others() -> None:
    s = AdaptiveSchedule("accuracy", min_steps=10, max_steps=80, eval_set="hard")
    assert s.moved({"easy": {"accuracy": MOVED_UP}}) is None
    assert s.moved({"easy": {"accuracy": MOVED_UP}, "hard": {"accuracy": FLAT}}) is False
    assert s.moved({"hard": {"accuracy": MOVED_UP}}) is True


def test_observe_reports_the_change_it_made() -> None:
    s = AdaptiveSchedule("accuracy", min_steps=10, max_steps=80, start_steps=40)
    assert s.observe(40, {"easy": {"accuracy": MOVED_UP}}) == IntervalChange(40, 40, 20, True)
    assert s.observe(60, {"easy": {"accuracy": FLAT}}) == IntervalChange(60, 20, 40, False)
    assert s.observe(100, {}) == IntervalChange(100, 40, 40, False)  # nothing known: kept
    change = s.observe(140, {"easy": {"accuracy": MOVED_UP}})
    assert change.moved is True and isinstance(change.moved, bool)


def test_the_description_names_the_bounds_the_metric_and_the_set() -> None:
    assert AdaptiveSchedule("accuracy", 10, 80).describe() == "adaptively every 10-80 steps by accuracy"
    assert (
        AdaptiveSchedule("reward/mean", 5, 50, eval_set="hard").describe()
        == "adaptively every 5-50 steps by reward/mean on hard"
    )


def test_a_resume_restores_the_interval_and_the_last_round() -> None:
    s = AdaptiveSchedule("accuracy", min_steps=10, max_steps=80)
    s.observe(10, {"easy": {"accuracy": FLAT}})
    s.observe(30, {"easy": {"accuracy": FLAT}})
    state = s.state_dict()
    assert state == {"interval": 40, "last_step": 30}
    resumed = AdaptiveSchedule("accuracy", min_steps=10, max_steps=80)
    resumed.load_state_dict(state)
    assert (resumed.interval, resumed.last_step) == (40, 30) and not resumed.due(69) and resumed.due(70)


def test_a_resume_with_other_bounds_clamps_the_interval_and_missing_keys_keep_the_start() -> None:
    narrower = AdaptiveSchedule("accuracy", min_steps=10, max_steps=30)
    narrower.load_state_dict({"interval": 80, "last_step": 100})
    assert (narrower.interval, narrower.last_step) == (30, 100)
    wider = AdaptiveSchedule("accuracy", min_steps=50, max_steps=80)
    wider.load_state_dict({"interval": 10})
    assert (wider.interval, wider.last_step) == (50, 0)
    fresh = AdaptiveSchedule("accuracy", min_steps=10, max_steps=80, start_steps=20)
    fresh.load_state_dict({})
    assert (fresh.interval, fresh.last_step) == (20, 0)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"metric": ""}, "`AdaptiveSchedule(metric=...)` must be a metric name such as accuracy, got ''"),
        ({"metric": None}, "`AdaptiveSchedule(metric=...)` must be a metric name such as accuracy, got None"),
        ({"min_steps": 0}, "`AdaptiveSchedule(min_steps=...)` must be a positive integer, got 0"),
        ({"min_steps": True}, "`AdaptiveSchedule(min_steps=...)` must be a positive integer, got True"),
        ({"max_steps": 2.5}, "`AdaptiveSchedule(max_steps=...)` must be a positive integer, got 2.5"),
        (
            {"min_steps": 20, "max_steps": 10},
            "`AdaptiveSchedule(...)`: min_steps must be at most max_steps, got min_steps=20, max_steps=10",
        ),
        ({"factor": 1}, "`AdaptiveSchedule(factor=...)` must be a finite number above 1, got 1"),
        ({"factor": math.inf}, "`AdaptiveSchedule(factor=...)` must be a finite number above 1, got inf"),
        ({"factor": True}, "`AdaptiveSchedule(factor=...)` must be a finite number above 1, got True"),
        ({"factor": "2"}, "`AdaptiveSchedule(factor=...)` must be a finite number above 1, got '2'"),
        ({"start_steps": 0}, "`AdaptiveSchedule(start_steps=...)` must be a positive integer, got 0"),
        ({"start_steps": 81}, "`AdaptiveSchedule(start_steps=...)` must be a number of steps in [10, 80], got 81"),
        ({"start_steps": 9}, "`AdaptiveSchedule(start_steps=...)` must be a number of steps in [10, 80], got 9"),
    ],
)
def test_bad_arguments_are_refused_naming_the_argument_and_what_is_accepted(
    kwargs: dict[str, Any], message: str
) -> None:
    args: dict[str, Any] = {"metric": "accuracy", "min_steps": 10, "max_steps": 80, **kwargs}
    with pytest.raises(ArgumentError) as info:
        AdaptiveSchedule(**args)
    assert str(info.value) == message


def test_bounds_and_factor_at_their_limits_are_accepted() -> None:
    s = AdaptiveSchedule("accuracy", min_steps=1, max_steps=1, factor=1.0001, start_steps=1)
    assert (s.min_steps, s.max_steps, s.interval, s.last_step) == (1, 1, 1, 0)
    assert isinstance(AdaptiveSchedule("accuracy", 10, 80, factor=3).factor, float)
    assert AdaptiveSchedule("accuracy", 10, 80, start_steps=80).interval == 80


def test_observe_uses_the_schedules_own_factor() -> None:
    s = AdaptiveSchedule("accuracy", min_steps=1, max_steps=1000, factor=3, start_steps=10)
    assert s.observe(10, {"easy": {"accuracy": FLAT}}).new == 30
    assert s.observe(40, {"easy": {"accuracy": MOVED_UP}}).new == 10


def test_crossed_bounds_carry_the_fields_the_config_words_its_error_from() -> None:
    with pytest.raises(ArgumentError) as info:
        AdaptiveSchedule("accuracy", min_steps=20, max_steps=10)
    err = info.value
    assert (err.owner, err.arg, err.value) == ("AdaptiveSchedule", "", (20, 10))
    assert err.accepted == "min_steps must be at most max_steps, got min_steps=20, max_steps=10"
