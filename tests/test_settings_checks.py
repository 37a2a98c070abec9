"""Python arguments are checked where the user wrote them: each settings dataclass refuses its own
bad fields when it is built, naming that class and field (not an internal class), and samples given
as a file name are refused with how to load the file. The YAML `evaluator` block gets the same
checks, reworded with the key path; a section set to null says what to write instead."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from areal_lightning import Decisions, EvaluationCallback, Schedule
from areal_lightning.app.config import ConfigError, load_config
from areal_lightning.callbacks.settings import Execution, RoundSettings
from areal_lightning.errors import ArgumentError


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: Schedule(freq_steps=0), "`Schedule(freq_steps=...)` must be a positive integer or None, got 0"),
        (lambda: Schedule(freq_secs=-1.0), "`Schedule(freq_secs=...)` must be a positive finite number of seconds"),
        (lambda: Schedule(eval_at_end=False), "`Schedule(...)` would never evaluate: freq_epochs"),
        (
            lambda: Schedule(budget=1.5),
            "`Schedule(budget=...)` must be a share of wall time in (0, 1] or None, got 1.5",
        ),
        (lambda: Schedule(adaptive={"min_steps": 0}), "`AdaptiveSettings(min_steps=...)` must be a positive integer"),
        (lambda: Execution(async_threads=0), "`Execution(async_threads=...)` must be a positive integer, got 0"),
        (lambda: Execution(on_busy="queue"), "`Execution(on_busy='queue')`. Possible choices are: skip, wait"),
        (lambda: RoundSettings(sanity_batches=-1), "`RoundSettings(sanity_batches=...)` must be a non-negative"),
        (lambda: RoundSettings(cache="yes"), "`RoundSettings(cache=...)` must be True or False, got 'yes'"),
        (lambda: RoundSettings(precision="fp8"), "`RoundSettings(precision=...)` must be one of 32, bf16, 16"),
        (lambda: Decisions(metric_thresholds={"accuracy": "high"}), "`Decisions(metric_thresholds.accuracy=...)`"),
        (lambda: Decisions(metric_thresholds=["accuracy"]), "`Decisions(metric_thresholds=...)` must be a mapping"),
        (lambda: Decisions(best_metrics={"accuracy": "up"}), "`Decisions(best_metrics.accuracy='up')`. Possible"),
        (lambda: Decisions(alert_from_start=1), "`Decisions(alert_from_start=...)` must be True or False, got 1"),
    ],
    ids=lambda v: None if callable(v) else v.split("(")[0].strip("`"),
)
def test_each_settings_class_refuses_its_own_fields_when_built(build: Any, message: str) -> None:
    with pytest.raises(ArgumentError) as caught:
        build()
    assert message in str(caught.value)
    assert "HybridTrigger" not in str(caught.value) and "EvaluationCallback" not in str(caught.value)


@pytest.mark.parametrize("samples", ["data/missing.jsonl", Path("data/missing.jsonl")], ids=["str", "Path"])
def test_samples_given_as_a_file_name_are_refused_saying_how_to_load_it(samples: Any) -> None:
    with pytest.raises(ArgumentError, match=r"not a file name: read the file first, e\.g\. samples = \[json\.loads"):
        EvaluationCallback({"easy": samples}, lambda m, b, ctx: {})


def test_an_eval_set_named_by_the_settings_must_exist() -> None:
    with pytest.raises(ArgumentError, match=r"`Decisions\(reward_watch.eval_set=...\)` must be the name of an eval"):
        EvaluationCallback({"easy": [1]}, lambda m, b, ctx: {}, decisions={"reward_watch": {"eval_set": "esay"}})


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("evaluator.freq_steps=0", "evaluator.freq_steps must be a positive integer or null, got 0"),
        ("evaluator.sanity_batches=-1", "evaluator.sanity_batches must be a non-negative integer, got -1"),
        ("evaluator.adaptive.min_steps=0", "evaluator.adaptive.min_steps must be a positive integer, got 0"),
        ("evaluator.async_threads=0", "evaluator.async_threads must be a positive integer, got 0"),
        (
            "logger.wandb=null",
            "config key `logger.wandb` (from the command line) is a section and cannot be null; to switch W&B off, "
            "set logger.wandb.mode: disabled",
        ),
    ],
)
def test_the_yaml_evaluator_block_gets_the_same_checks_with_key_paths(override: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(None, ["eval_sets.easy.size=4", override])
    assert message in str(caught.value)
