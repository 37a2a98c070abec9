"""The budget rule of `EvalBudget` on a hand-driven clock: when a round is allowed, what counts as
wall time (not the downtime of a resume), and what a checkpoint carries over."""

from __future__ import annotations

import math
from typing import Any

import pytest

from areal_lightning.callbacks.budget import EvalBudget
from areal_lightning.errors import ArgumentError


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def started(share: float) -> tuple[EvalBudget, Clock]:
    clock = Clock()
    budget = EvalBudget(share, clock=clock)
    budget.start()
    return budget, clock


def test_the_first_round_is_allowed_before_any_training() -> None:
    budget, _ = started(0.01)
    assert budget.allows() and budget.spent_share() == 0.0


def test_a_round_is_allowed_exactly_up_to_the_share() -> None:
    # 1 s spent; the next round is estimated at 1 s: 2 s of eval must be at most 25% of wall + 1 s.
    budget, clock = started(0.25)
    budget.add_round(1.0)
    clock.now += 6.5
    assert not budget.allows()  # 2 of 7.5 s: 27%
    clock.now += 0.5
    assert budget.allows()  # 2 of 8 s: exactly 25%
    assert budget.spent_share() == pytest.approx(1.0 / 7.0)


def test_the_estimate_is_the_last_round_not_the_mean() -> None:
    budget, clock = started(0.5)
    budget.add_round(1.0)
    budget.add_round(3.0)  # 4 s spent, the next round estimated at 3 s (the mean would say 2 s)
    clock.now += 10.0
    assert not budget.allows()  # 7 of 13 s; with the mean, 6 of 12 s would pass
    clock.now += 1.0
    assert budget.allows()  # 7 of 14 s


def test_downtime_between_stop_and_start_is_not_wall_time() -> None:
    budget, clock = started(0.5)
    clock.now += 10.0
    budget.stop()
    clock.now += 1e6  # the process is dead, then resumed
    budget.stop()  # a second stop changes nothing
    budget.start()
    clock.now += 5.0
    assert budget.wall_secs() == pytest.approx(15.0)
    budget.start()  # a start while running keeps the time so far
    clock.now += 5.0
    assert budget.wall_secs() == pytest.approx(20.0)


def test_a_resumed_budget_makes_the_same_decisions_without_the_downtime() -> None:
    budget, clock = started(0.25)
    budget.add_round(2.0)
    clock.now += 10.0
    state = budget.state_dict()
    assert state == {"eval_secs": 2.0, "wall_secs": 10.0, "last_round_secs": 2.0, "deferred": 0}

    clock.now += 1e6  # downtime
    resumed = EvalBudget(0.25, clock=clock)
    resumed.load_state_dict(state)
    resumed.start()
    assert resumed.wall_secs() == pytest.approx(10.0) and not resumed.allows()  # 4 of 12 s
    clock.now += 4.0
    assert resumed.allows()  # 4 of 16 s: the share
    assert resumed.spent_share() == pytest.approx(2.0 / 14.0)


def test_loading_while_running_replaces_the_time_counted_so_far() -> None:
    budget, clock = started(0.25)
    clock.now += 100.0
    budget.load_state_dict({"eval_secs": 1.0, "wall_secs": 3.0, "last_round_secs": 1.0})
    clock.now += 1.0
    assert budget.wall_secs() == pytest.approx(4.0)


def test_an_old_checkpoint_without_budget_state_starts_fresh() -> None:
    budget, clock = started(0.1)
    budget.add_round(5.0)
    budget.load_state_dict({})
    assert budget.allows() and budget.wall_secs() == 0.0 and budget.spent_share() == 0.0
    clock.now += 1.0
    budget.add_round(1.0)
    assert budget.spent_share() == pytest.approx(1.0)


@pytest.mark.parametrize("bad", [0, 1.5, -0.1, True, math.nan, math.inf, "0.1", None])
def test_a_bad_share_is_refused_naming_the_argument_and_the_range(bad: Any) -> None:
    with pytest.raises(ArgumentError) as info:
        EvalBudget(bad)
    expected = f"`EvaluationCallback(budget=...)` must be a share of wall time in (0, 1] or None, got {bad!r}"
    assert str(info.value) == expected


@pytest.mark.parametrize("share", [1, 1.0, 0.5, 1e-6])
def test_a_share_in_range_is_kept_as_a_float(share: float) -> None:
    budget = EvalBudget(share)
    assert budget.share == float(share) and isinstance(budget.share, float)


def test_a_stopped_budget_counts_no_wall_time() -> None:
    clock = Clock()
    budget = EvalBudget(0.5, clock=clock)
    assert budget.wall_secs() == 0.0  # never started
    budget.start()
    clock.now += 10.0
    budget.stop()
    clock.now += 50.0
    assert budget.wall_secs() == 10.0 and budget.state_dict()["wall_secs"] == 10.0


def test_the_rounds_deferred_since_the_last_one_are_counted_once_and_survive_a_resume() -> None:
    budget, clock = started(0.25)
    assert budget.add_round(2.0) == 0  # nothing deferred before the first round
    budget.defer()
    budget.defer()
    state = budget.state_dict()
    assert state["deferred"] == 2

    resumed = EvalBudget(0.25, clock=clock)
    resumed.load_state_dict(state)
    resumed.defer()  # one more after the resume: the next round reports all three
    assert resumed.add_round(1.0) == 3
    assert resumed.add_round(1.0) == 0  # counted once

    older = EvalBudget(0.25, clock=clock)
    older.load_state_dict({k: v for k, v in state.items() if k != "deferred"})  # a checkpoint from before the count
    assert older.add_round(1.0) == 0
