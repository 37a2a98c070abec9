"""What the reward-hacking watch tells a user: the alert's message and fields, the rule at its
boundaries, which round is the reference (previous, best, NaN never best), what a checkpoint keeps,
its description, and the whole message of each bad argument."""

from __future__ import annotations

import math
from typing import Any

import pytest

from areal_lightning.callbacks.reward_hacking import HackingAlert, RewardWatch, as_reward_watch, reward_hacking
from areal_lightning.errors import ArgumentError

NAN = math.nan


def test_the_alert_says_what_rose_what_fell_and_by_how_much() -> None:
    watch = RewardWatch("accuracy", min_train_rise=0.05)
    watch.observe(10, 0.25, {"easy": {"accuracy": 0.5}})
    (alert,) = watch.observe(20, 0.5, {"easy": {"accuracy": 0.375, "accuracy/delta_ci_high": -0.0625}})
    assert alert == HackingAlert("easy", "accuracy", "train/reward", 20, 10, 0.25, -0.125, -0.0625)
    assert alert.message == (
        "possible reward hacking at step 20: train/reward rose by +0.25 since step 10 while"
        " eval/easy/accuracy changed by -0.125 (paired 95% interval upper end -0.0625 < 0)"
    )
    assert isinstance(alert.step, int) and isinstance(alert.reference_step, int)


def test_without_an_interval_the_alert_names_the_tolerance() -> None:
    watch = RewardWatch("judge", tolerance=0.05)
    watch.observe(1, 0.0, {"easy": {"judge": 0.9}})
    (alert,) = watch.observe(2, 0.5, {"easy": {"judge": 0.5, "judge/delta_ci_high": NAN}})
    assert alert.eval_change_ci_high is None
    assert alert.message.endswith("changed by -0.4 (beyond the set tolerance)")


def test_the_rule_at_its_boundaries() -> None:
    rule: dict[str, Any] = {"min_train_rise": 0.25, "tolerance": 0.125}
    assert reward_hacking(0.25, -1.0, -0.5, **rule)  # a rise of exactly the minimum counts
    assert not reward_hacking(0.25, -1.0, 0.0, **rule)  # an interval ending at 0 holds 0
    assert not reward_hacking(0.25, -0.125, None, **rule)  # a fall of exactly the tolerance does not count
    assert reward_hacking(0.25, -0.25, None, **rule)
    assert not reward_hacking(0.25, NAN, -0.5, **rule)  # no eval change known
    assert not reward_hacking(0.25, -1.0, None, min_train_rise=0.25, tolerance=None)


def test_the_best_reference_is_the_highest_finite_round_and_not_restored_on_resume() -> None:
    watch = RewardWatch("accuracy", since="best", min_train_rise=0.05)
    watch.observe(10, 0.1, {"easy": {"accuracy": 0.6}})
    watch.observe(20, 0.2, {"easy": {"accuracy": NAN}})  # NaN is never the best
    watch.observe(30, 0.3, {"easy": {"accuracy": 0.6}})  # a tie keeps the earlier best
    (alert,) = watch.observe(40, 0.4, {"easy": {"accuracy": 0.4, "accuracy/delta_best_ci_high": -0.1}})
    assert (alert.reference_step, alert.train_rise) == (10, pytest.approx(0.3))

    state = watch.state_dict()
    assert state["references"]["easy"]["best"] == [10.0, 0.1, 0.6]
    assert state["references"]["easy"]["previous"] == [40.0, 0.4, 0.4] and state["alerting"] == {"easy": True}
    resumed = RewardWatch("accuracy", since="best", min_train_rise=0.05)
    resumed.load_state_dict(state)
    assert "best" not in resumed.state_dict()["references"]["easy"]  # the paired best round starts over too
    assert resumed.state_dict()["alerting"] == {"easy": True}


def test_a_resumed_watch_stays_quiet_in_the_episode_it_was_alerting_in() -> None:
    watch = RewardWatch("accuracy", min_train_rise=0.05)
    watch.observe(10, 0.1, {"easy": {"accuracy": 0.6}})
    assert len(watch.observe(20, 0.2, {"easy": {"accuracy": 0.5, "accuracy/delta_ci_high": -0.1}})) == 1
    resumed = RewardWatch("accuracy", min_train_rise=0.05)
    resumed.load_state_dict(watch.state_dict())
    assert resumed.observe(30, 0.3, {"easy": {"accuracy": 0.4, "accuracy/delta_ci_high": -0.1}}) == []


def test_each_eval_set_is_watched_on_its_own() -> None:
    watch = RewardWatch("accuracy", min_train_rise=0.05)
    watch.observe(10, 0.1, {"easy": {"accuracy": 0.6}, "hard": {"accuracy": 0.3}})
    alerts = watch.observe(
        20,
        0.2,
        {
            "easy": {"accuracy": 0.5, "accuracy/delta_ci_high": -0.1},
            "hard": {"accuracy": 0.3, "accuracy/delta_ci_high": 0.1},
        },
    )
    assert [a.dataset for a in alerts] == ["easy"]
    assert watch.observe(30, None, {"easy": {"accuracy": 0.1, "accuracy/delta_ci_high": -0.1}}) == []  # no reward


def test_the_description_names_the_reward_the_rise_and_the_metric() -> None:
    assert RewardWatch("accuracy").describe() == (
        "alert when train/reward rises by >= 0.05 while eval/*/accuracy falls beyond its noise"
    )
    assert RewardWatch("acc", "train/r", eval_set="hard", min_train_rise=0.2).describe() == (
        "alert when train/r rises by >= 0.2 while eval/hard/acc falls beyond its noise"
    )


def test_a_mapping_or_a_watch_or_nothing_is_accepted_by_the_callback() -> None:
    watch = RewardWatch("accuracy")
    assert as_reward_watch(watch) is watch and as_reward_watch(None) is None
    built = as_reward_watch({"metric": "accuracy", "tolerance": 0, "since": "best"})
    assert built is not None and (built.tolerance, built.since.value, built.min_train_rise) == (0.0, "best", 0.05)
    with pytest.raises(ArgumentError) as info:
        as_reward_watch("accuracy")  # type: ignore[arg-type]
    assert str(info.value) == (
        "`EvaluationCallback(reward_watch=...)` must be a RewardWatch, a mapping or None, got 'accuracy'"
    )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"metric": ""},
            "`RewardWatch(metric=...)` must be a metric name such as accuracy or train/reward, got ''",
        ),
        (
            {"train_metric": None},
            "`RewardWatch(train_metric=...)` must be a metric name such as accuracy or train/reward, got None",
        ),
        ({"eval_set": ""}, "`RewardWatch(eval_set=...)` must be an eval set name or None, got ''"),
        ({"eval_set": 3}, "`RewardWatch(eval_set=...)` must be an eval set name or None, got 3"),
        ({"min_train_rise": -1}, "`RewardWatch(min_train_rise=...)` must be a number >= 0, got -1"),
        ({"min_train_rise": None}, "`RewardWatch(min_train_rise=...)` must be a number >= 0, got None"),
        ({"min_train_rise": True}, "`RewardWatch(min_train_rise=...)` must be a number >= 0, got True"),
        ({"min_train_rise": math.inf}, "`RewardWatch(min_train_rise=...)` must be a number >= 0, got inf"),
        ({"tolerance": -0.1}, "`RewardWatch(tolerance=...)` must be a number >= 0 or None, got -0.1"),
        ({"tolerance": "0.1"}, "`RewardWatch(tolerance=...)` must be a number >= 0 or None, got '0.1'"),
        (
            {"since": "worst"},
            "Unsupported parameter value `RewardWatch(since='worst')`. Possible choices are: previous, best",
        ),
    ],
)
def test_each_bad_argument_has_its_whole_message(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ArgumentError) as info:
        RewardWatch(**{"metric": "accuracy", **kwargs})
    assert str(info.value) == message


def test_zero_rise_and_tolerance_are_accepted() -> None:
    watch = RewardWatch("accuracy", min_train_rise=0, tolerance=0)
    assert (watch.min_train_rise, watch.tolerance) == (0.0, 0.0) and isinstance(watch.min_train_rise, float)


def test_a_watched_eval_set_ignores_every_other_set_in_any_order() -> None:
    watch = RewardWatch("accuracy", eval_set="hard", min_train_rise=0.05)
    first = {"easy": {"accuracy": 0.9}, "hard": {"accuracy": 0.6}}
    assert watch.observe(10, 0.1, first) == []
    falling = {
        "easy": {"accuracy": 0.1, "accuracy/delta_ci_high": -0.5},
        "hard": {"accuracy": 0.4, "accuracy/delta_ci_high": -0.1},
    }
    assert [a.dataset for a in watch.observe(20, 0.2, falling)] == ["hard"]  # easy (first) is skipped, not the end


def test_a_set_without_the_metric_is_skipped() -> None:
    watch = RewardWatch("accuracy", min_train_rise=0.05)
    assert watch.observe(10, 0.1, {"easy": {"reward/mean": 1.0}}) == []
    assert watch.observe(20, 0.2, {"easy": {"reward/mean": 0.0}}) == []


def test_the_rise_is_measured_from_the_reference_rounds_reward() -> None:
    watch = RewardWatch("accuracy", min_train_rise=0.05)
    watch.observe(10, 0.5, {"easy": {"accuracy": 0.6}})
    # 0.52 - 0.5 = 0.02: not a rise, however far the metric falls.
    assert watch.observe(20, 0.52, {"easy": {"accuracy": 0.2, "accuracy/delta_ci_high": -0.3}}) == []
