"""`EvaluationCallback` as a user meets it: constructor errors, a user's own module and metrics,
every logger receiving ``eval/<set>/<metric>``, and training that evaluation leaves untouched."""

from __future__ import annotations

import csv
import math
import re
import statistics
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import pytest
import torch
from callback_helpers import (
    QUIET_WARNINGS,
    CountingModule,
    history_steps,
    make_trainer,
    probe_weights,
    state_copy,
)
from lightning.pytorch.loggers import CSVLogger
from torch import Tensor

from areal_lightning.app.builders import build_callback, build_eval_sets, build_module
from areal_lightning.app.config import load_config
from areal_lightning.callbacks.evaluation_callback import EvaluationCallback
from areal_lightning.eval_round.eval_set import EvalSet
from areal_lightning.metrics import AccuracyMetric, RewardMetric
from areal_lightning.tracking.history import eval_rows, read_history

pytestmark = [pytest.mark.filterwarnings(w) for w in QUIET_WARNINGS]

EVAL_SET = {"probe": [1, 2, 3]}

# ------------------------------------------------------------------ constructor errors


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"decisions": {"threshold_action": "panic"}},
            "Unsupported parameter value `Decisions(threshold_action='panic')`. Possible choices are: alert, stop",
        ),
        (
            {"rounds": {"on_error": "ignore"}},
            "Unsupported parameter value `RoundSettings(on_error='ignore')`. Possible choices are: log, raise",
        ),
        (
            {"execution": {"mode": "background"}},
            "Unsupported parameter value `Execution(mode='background')`. Possible choices are: sync",
        ),
        ({"evaluate_fn": 42}, "`EvaluationCallback(evaluate_fn=...)` must be callable or None, got 42"),
        (
            {"rounds": {"max_table_rows": -1}},
            "`RoundSettings(max_table_rows=...)` must be a non-negative integer, got -1",
        ),
        ({"run_id": ""}, "`EvaluationCallback(run_id=...)` must be a non-empty string or None, got ''"),
        (
            {"decisions": {"metric_thresholds": {"accuracy": "high"}}},
            "`Decisions(metric_thresholds.accuracy=...)` must be a finite number, got 'high'",
        ),
        ({"schedule": {"freq_steps": 0}}, "`Schedule(freq_steps=...)` must be a positive integer or None, got 0"),
        ({"schedule": {"eval_at_end": False}}, "`Schedule(...)` would never evaluate: freq_epochs"),
        ({"eval_sets": {}}, "`eval_sets` is empty; give at least one eval set"),
        (
            {"schedule": {"freq_step": 5}},
            "`EvaluationCallback(schedule=...)` must be a mapping of the keys freq_epochs, freq_steps, freq_secs, "
            "eval_before_train, eval_at_end, adaptive, budget; unknown: freq_step",
        ),
        (
            {"rounds": "fast"},
            "`EvaluationCallback(rounds=...)` must be a RoundSettings, a mapping of its fields or None, got 'fast'",
        ),
        (
            {"eval_sets": ["1+1="]},
            "`eval_sets` must be a mapping name -> samples or a list of EvalSet, got items of type ['str']",
        ),
    ],
    ids=lambda v: next(iter(v)) if isinstance(v, dict) else None,
)
def test_constructor_rejects_bad_arguments_with_a_message_naming_them(kwargs: dict[str, Any], message: str) -> None:
    arguments: dict[str, Any] = {"eval_sets": EVAL_SET, "evaluate_fn": probe_weights, **kwargs}
    with pytest.raises(ValueError, match=re.escape(message)):
        EvaluationCallback(arguments.pop("eval_sets"), arguments.pop("evaluate_fn"), **arguments)


def test_no_evaluate_fn_for_a_module_without_evaluate_fails_before_training(tmp_path: Path) -> None:
    module = CountingModule()
    trainer = make_trainer(tmp_path, [EvaluationCallback(EVAL_SET, schedule={"freq_steps": 1})], 3)
    message = (
        "`EvaluationCallback(evaluate_fn=None)` needs a module with an `evaluate(batches, ctx)` method, "
        "and CountingModule has none; pass evaluate_fn=..."
    )
    with pytest.raises(ValueError, match=re.escape(message)):
        trainer.fit(module)
    assert trainer.global_step == 0


# ------------------------------------------------------------------ a user's own module and metrics


# Reward of each eval sample: a function of the sample alone, so the test can recompute everything.
def _reward(sample: int) -> float:
    return (sample % 4) / 4


def user_evaluate(module: CountingModule, batches: Any, ctx: Any) -> dict[str, Any]:
    """A user's `evaluate_fn`: metric classes through `ctx.metric`, plus per-sample tensors and floats."""
    reward = ctx.metric("reward", RewardMetric)
    accuracy = ctx.metric("accuracy", lambda: AccuracyMetric(threshold=0.5))
    squared: list[Tensor] = []
    for batch in batches:
        rewards = torch.tensor([_reward(s) for s in batch.samples], dtype=torch.float64)
        reward.update(rewards)
        accuracy.update(rewards)
        squared.append(torch.tensor([float(s) ** 2 for s in batch.samples]))
        ctx.num_samples += len(batch.samples)
    return {"sample_squared": torch.cat(squared), "w": float(module.w), "one": torch.tensor(1.0)}


def test_user_module_with_metric_classes_and_plain_values(tmp_path: Path) -> None:
    eval_sets = [EvalSet("short", list(range(5)), batch_size=2), EvalSet("long", list(range(3, 14)), batch_size=4)]
    callback = EvaluationCallback(eval_sets, user_evaluate, schedule={"freq_steps": 3})
    make_trainer(tmp_path, [callback], 3).fit(CountingModule())

    records = eval_rows(read_history(tmp_path))
    assert [r["dataset"] for r in records] == ["short", "long"]
    # Without a run_id argument the callback draws one; every record carries it.
    assert len(callback.run_id) == 8 and {r["run_id"] for r in records} == {callback.run_id}
    for record, eval_set in zip(records, eval_sets, strict=True):
        rewards = np.array([_reward(s) for s in eval_set.samples])
        expected = {
            "reward/mean": rewards.mean(),
            "reward/std": rewards.std(),
            "reward/min": rewards.min(),
            "reward/max": rewards.max(),
            "accuracy": (rewards > 0.5).mean(),
            "sample_squared": np.mean([s**2 for s in eval_set.samples]),
            "w": 3.0,
            "one": 1.0,
        }
        metrics = record["metrics"]
        for name, value in expected.items():
            assert metrics[name] == pytest.approx(value, abs=1e-12), name
        # The 95% Wilson score interval, written out here (z from the normal quantile).
        n, p, z = len(rewards), float((rewards > 0.5).mean()), statistics.NormalDist().inv_cdf(0.975)
        center, half = (p + z * z / (2 * n)) / (1 + z * z / n), z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
        assert metrics["accuracy/ci_low"] == pytest.approx(center - half / (1 + z * z / n), abs=1e-12)
        assert metrics["accuracy/ci_high"] == pytest.approx(center + half / (1 + z * z / n), abs=1e-12)
        assert record["num_prompts"] == record["num_samples"] == len(eval_set.samples)


def test_every_logger_gets_eval_set_metric_at_the_evaluated_step(tmp_path: Path) -> None:
    loggers = [CSVLogger(tmp_path, name="first"), CSVLogger(tmp_path, name="second")]
    eval_sets = {"easy": [1.0, 2.0], "hard": [10.0, 30.0, 50.0]}
    callback = EvaluationCallback(eval_sets, probe_weights, schedule={"freq_steps": 2, "eval_before_train": True})
    make_trainer(tmp_path, [callback], 5, logger=loggers, log_every_n_steps=1).fit(CountingModule())

    expected_steps = [0, 2, 4, 5]
    assert [s for s, _ in history_steps(tmp_path)] == expected_steps
    for name in ("first", "second"):
        with open(tmp_path / name / "version_0" / "metrics.csv", newline="") as f:
            rows = [r for r in csv.DictReader(f) if r.get("eval/easy/w")]
        assert [int(r["step"]) for r in rows] == expected_steps
        for row in rows:
            assert float(row["eval/easy/w"]) == float(row["eval/hard/w"]) == int(row["step"])
            assert float(row["eval/easy/sample_value"]) == pytest.approx(1.5)
            assert float(row["eval/hard/sample_value"]) == pytest.approx(30.0)
        secs = {r["step"]: r["eval_secs"] for r in eval_rows(read_history(tmp_path)) if r["dataset"] == "easy"}
        assert [float(r["eval/easy/eval_secs"]) for r in rows] == pytest.approx([secs[s] for s in expected_steps])


# ------------------------------------------------------------------ evaluation leaves training untouched


class DropoutModule(CountingModule):
    """Draws from the global torch RNG in every training step (dropout), so an evaluation that
    consumed that RNG without restoring it would change the training that follows."""

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        x = torch.nn.functional.dropout(x, p=0.5, training=True)
        return -self.w + torch.nn.functional.mse_loss(self.layer(x), y)


def _noisy_evaluate(module: CountingModule, batches: Any, ctx: Any) -> dict[str, Any]:
    module.train()  # a careless user: the round restores the train flags anyway
    return {"noise": torch.randn(len(batches[0].samples)), "w": float(module.w)}


def test_evaluation_that_uses_the_global_rng_does_not_change_training(tmp_path: Path) -> None:
    weights = []
    for callbacks in (
        [],
        [EvaluationCallback(EVAL_SET, _noisy_evaluate, schedule={"freq_steps": 1, "eval_before_train": True})],
    ):
        L.seed_everything(7, verbose=False)
        module = DropoutModule(epoch_len=4)
        make_trainer(tmp_path / str(len(callbacks)), callbacks, 6).fit(module)
        weights.append(state_copy(module))
    assert len(history_steps(tmp_path / "1")) == 7
    for name, tensor in weights[0].items():
        assert torch.equal(weights[1][name], tensor), name


GRPO_OVERRIDES = [
    "grpo.group_size=4",
    "grpo.prompts_per_step=4",
    "grpo.warmup_steps=2",
    "policy.d_model=16",
    "policy.n_layers=1",
    "policy.n_heads=2",
    "task.train_size=16",
    "eval_sets.easy.size=6",
    "eval_sets.easy.n_samples=2",
    "eval_sets.easy.batch_size=4",
    "eval_sets.hard.digits=2",
    "eval_sets.hard.size=3",
]
GRPO_STEPS = 6


def test_grpo_run_with_evaluation_ends_with_the_same_weights_as_without(tmp_path: Path) -> None:
    weights = []
    for with_eval in (False, True):
        cfg = load_config(None, [*GRPO_OVERRIDES, f"output_dir={tmp_path / str(with_eval)}"])
        L.seed_everything(cfg.seed, verbose=False)
        module = build_module(cfg)
        callbacks = []
        if with_eval:  # the default evaluation: the module's own rollouts, every 2 steps and before training
            callbacks = [
                build_callback(
                    cfg, build_eval_sets(cfg, module.task), schedule={"freq_steps": 2, "eval_before_train": True}
                )
            ]
        make_trainer(cfg.output_dir, callbacks, GRPO_STEPS).fit(module)
        weights.append(state_copy(module))

    records = eval_rows(read_history(tmp_path / "True"))
    assert [(r["step"], r["dataset"]) for r in records] == [(s, d) for s in (0, 2, 4, 6) for d in ("easy", "hard")]
    assert all(r["num_prompts"] == {"easy": 6, "hard": 3}[r["dataset"]] for r in records)
    assert all(not math.isnan(r["metrics"]["accuracy"]) for r in records)
    assert weights[0].keys() == weights[1].keys()
    for name, tensor in weights[0].items():
        assert torch.equal(weights[1][name], tensor), name


def test_from_config_alone_builds_the_main_jobs_eval_sets_and_triggers():
    from areal_lightning.app.builders import build_eval_sets, build_module
    from areal_lightning.app.config import load_config
    from areal_lightning.eval_round.fingerprint import fingerprint

    cfg = load_config(
        None,
        [
            "eval_sets.easy.size=7",
            "eval_sets.hard.digits=2",
            "eval_sets.hard.size=3",
            "evaluator.freq_steps=5",
            "evaluator.eval_before_train=true",
        ],
    )
    callback = build_callback(cfg)
    expected = build_eval_sets(cfg, build_module(cfg).task)
    assert [(s.name, fingerprint(s.name, s.keys), dict(s.options)) for s in callback.eval_sets] == [
        (s.name, fingerprint(s.name, s.keys), dict(s.options)) for s in expected
    ]
    assert callback.trigger.freq_steps == 5 and callback.trigger.eval_before_train
    assert str(callback.output_dir) == cfg.output_dir and callback.seed == cfg.seed
