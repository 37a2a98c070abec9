"""Correct uses of the public API, for the type checker only (`tests/test_typing.py` runs mypy on it).

Nothing here runs under pytest: the module only defines functions. Every call below must type-check
as written; `assert_type` pins the return types a user's IDE shows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch import Tensor, nn
from typing_extensions import assert_type

from areal_lightning import (
    AccuracyMetric,
    Decisions,
    EvalBatch,
    EvalContext,
    EvalHistory,
    EvalSet,
    EvaluateFn,
    EvaluationCallback,
    Execution,
    GRPOModule,
    HybridTrigger,
    PassAtK,
    RewardMetric,
    RoundSettings,
    Schedule,
    SetResult,
    __version__,
    load_config,
    pass_at_k,
    read_history,
    run_round,
    wilson_interval,
)
from areal_lightning.callbacks.choices import EvalMode
from areal_lightning.eval_round.precision import EvalPrecision


def evaluate_with_any_module(module: Any, batches: Sequence[EvalBatch], ctx: EvalContext) -> dict[str, float]:
    return {"accuracy": float(len(batches)), "rank": float(ctx.rank)}


def evaluate_a_lightning_module(module: L.LightningModule, batches: Sequence[EvalBatch], ctx: EvalContext) -> None:
    ctx.metrics["reward"].update(torch.zeros(len(batches)))  # every result lives in ctx.metrics


def evaluate_grpo(module: GRPOModule, batches: Sequence[EvalBatch], ctx: EvalContext) -> Mapping[str, Tensor]:
    return {"reward": torch.tensor([float(i) for b in batches for i in b.indices])}


def use_the_callback(tmp: Path) -> list[EvaluationCallback]:
    as_protocol: EvaluateFn = evaluate_with_any_module
    return [
        EvaluationCallback(
            {"easy": ["1+1=", "2+2="]}, evaluate_with_any_module, schedule=Schedule(freq_steps=10), output_dir=tmp
        ),
        EvaluationCallback(
            [EvalSet("easy", ["1+1="], batch_size=2)], evaluate_a_lightning_module, schedule={"freq_epochs": 1}
        ),
        EvaluationCallback({"easy": [1, 2]}, evaluate_grpo, decisions=Decisions(metric_thresholds={"accuracy": 0.7})),
        EvaluationCallback(
            {"easy": [1, 2]},
            lambda module, batches, ctx: {"n": len(batches)},
            schedule=Schedule(freq_secs=60.0),
            execution=Execution(mode=EvalMode.SYNC),
            rounds=RoundSettings(precision=EvalPrecision.BF16, cache=True),
        ),
        EvaluationCallback({"easy": [1, 2]}, "my_project.evals.evaluate"),  # a dotted path
        EvaluationCallback({"easy": [1, 2]}, as_protocol),
    ]


def use_the_round(module: nn.Module) -> float:
    results = run_round(module, [EvalSet("easy", [1, 2, 3])], evaluate_with_any_module, seed=0, global_step=0, epoch=0)
    assert_type(results, list[SetResult])
    return results[0].metrics["accuracy"]


def use_the_metrics() -> tuple[Tensor, Tensor]:
    reward, accuracy, passed = RewardMetric(), AccuracyMetric(threshold=0.8), PassAtK(4)
    reward.update(torch.rand(8))
    accuracy.update(torch.rand(8))
    passed.update(torch.rand(2, 4) > 0.5)
    assert_type(pass_at_k(torch.ones(2, 4, dtype=torch.bool), 2), Tensor)
    return wilson_interval(8, 10)


def use_the_rest(tmp: Path) -> str:
    cfg = load_config(None, ["eval_sets.easy.size=4"])
    trigger = HybridTrigger(freq_steps=cfg.evaluator.schedule.freq_steps)
    history = EvalHistory(tmp / "eval_history.jsonl")
    records = read_history(tmp)
    assert_type(records, list[dict[str, Any]])
    return f"{__version__} {trigger.describe()} {history.path} {len(records)}"
