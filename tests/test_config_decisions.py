"""`evaluator.best_metrics` and `evaluator.reward_watch` from a real YAML file to the callback, and
their errors, each naming the key, the value and what is accepted."""

from __future__ import annotations

from pathlib import Path

import pytest

from areal_lightning.app.builders import build_callback
from areal_lightning.app.config import ConfigError, load_config
from areal_lightning.callbacks.choices import Direction, WatchReference

BASE = ["eval_sets.easy.size=4", "evaluator.freq_steps=5"]

YAML = """\
eval_sets:
  easy: {digits: 1, size: 4}
  hard: {digits: 2, size: 4}
evaluator:
  freq_steps: 5
  best_metrics: {accuracy: max, reward/std: min}
  reward_watch:
    eval_set: easy
    metric: accuracy
    train_metric: train/reward
    min_train_rise: 0.1
    since: best
"""


def test_yaml_file_configures_best_metrics_and_the_reward_watch(tmp_path: Path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text(YAML)
    cb = build_callback(load_config(path, []))
    assert cb.best.directions == {"accuracy": Direction.MAX, "reward/std": Direction.MIN}
    watch = cb.reward_watch
    assert watch is not None
    assert (watch.eval_set, watch.metric, watch.train_metric, watch.min_train_rise, watch.since) == (
        "easy",
        "accuracy",
        "train/reward",
        0.1,
        WatchReference.BEST,
    )


def test_defaults_watch_the_headline_metrics_and_no_rewards() -> None:
    cb = build_callback(load_config(None, BASE))
    assert set(cb.best.directions) == {"accuracy", "reward/mean"} and cb.reward_watch is None
    assert build_callback(load_config(None, [*BASE, "evaluator.best_metrics={}"])).best.directions == {}


@pytest.mark.parametrize(
    ("override", "match"),
    [
        ("evaluator.best_metrics={accuracy: up}", r"evaluator.best_metrics.accuracy must be one of max, min; got 'up'"),
        (
            "evaluator.best_metrics={acuracy: max}",
            r"evaluator.best_metrics.acuracy names a metric .* Did you mean `accuracy`",
        ),
        ("evaluator.reward_watch={metric: acc}", r"evaluator.reward_watch.metric names a metric .* accuracy"),
        (
            "evaluator.reward_watch={eval_set: nope}",
            r"evaluator.reward_watch.eval_set must name an eval set, got 'nope'; "
            r"defined: easy",
        ),
        (
            "evaluator.reward_watch={min_train_rise: -1}",
            r"evaluator.reward_watch.min_train_rise must be a number >= 0, "
            r"got -1",
        ),
        ("evaluator.reward_watch={tolerance: .inf}", r"evaluator.reward_watch.tolerance must be a number >= 0 or null"),
        ("evaluator.reward_watch={since: worst}", r"evaluator.reward_watch.since must be one of previous, best"),
    ],
)
def test_bad_values_name_the_key_the_value_and_what_is_accepted(override: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        load_config(None, [*BASE, override])
