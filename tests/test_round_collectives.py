"""The round's metric states ride its one object gather: one collective per eval set on every rank,
the same numbers as on one process, and a state torchmetrics cannot reduce is an error, not a hang."""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import pytest
import torch
import torch.distributed as dist
from ddp_utils import run_ddp
from torch import Tensor
from torchmetrics import Metric

from areal_lightning.eval_round import (
    EvalBatch,
    EvalContext,
    EvalRoundError,
    EvalSet,
    run_round,
)
from areal_lightning.metrics import AccuracyMetric, PassAtK, RewardMetric

SEED = 5
TIMEOUT_S = 180.0
SIZES = (9, 1)  # the second set leaves rank 1 idle
COLLECTIVES = ("all_gather", "all_gather_object", "all_reduce", "broadcast", "broadcast_object_list",
               "all_gather_into_tensor", "reduce_scatter", "gather", "scatter")


def _value(seed: int) -> float:
    return float(torch.rand((), generator=torch.Generator().manual_seed(seed), dtype=torch.float64))


def _evaluate(module: torch.nn.Module, batches: list[EvalBatch], ctx: EvalContext) -> dict[str, Any]:
    reward, accuracy, passed = (ctx.metric("reward", RewardMetric), ctx.metric("accuracy", AccuracyMetric),
                                ctx.metric("pass@1", lambda: PassAtK(1)))
    values = []
    for batch in batches:
        values += [_value(seed) for seed in batch.seeds]
        drawn = torch.tensor(values[-len(batch.seeds):], dtype=torch.float64)
        reward.update(drawn)
        accuracy.update(drawn)
        passed.update((drawn > 0.5)[:, None])
    if not values:  # an idle rank returns nothing: its share of every returned mean is empty
        return {}
    return {"per_sample": torch.tensor(values, dtype=torch.float64), "scalar": math.fsum(values) / len(values)}


def _sets() -> list[EvalSet]:
    return [EvalSet(f"set{size}", list(range(size)), batch_size=2) for size in SIZES]


def _counted_round(rank: int, world_size: int) -> tuple[list[Any], Counter]:
    calls: Counter = Counter()
    for name in COLLECTIVES:
        original = getattr(dist, name)

        def counting(*args: Any, _name: str = name, _original: Any = original, **kwargs: Any) -> Any:
            calls[_name] += 1
            return _original(*args, **kwargs)

        setattr(dist, name, counting)
    dist.barrier()
    results = run_round(torch.nn.Identity(), _sets(), _evaluate, seed=SEED, global_step=0, epoch=0)
    return results, calls


@pytest.mark.ddp
def test_a_round_runs_one_collective_per_eval_set_and_reduces_exactly() -> None:
    one = run_round(torch.nn.Identity(), _sets(), _evaluate, seed=SEED, global_step=0, epoch=0)
    out = run_ddp(_counted_round, 2, timeout_s=TIMEOUT_S)
    for results, calls in out:
        # the rank reports' object gather, and no metric sync of its own
        assert calls == Counter(all_gather_object=len(SIZES)), calls
        for result, expected in zip(results, one):
            assert result.num_prompts == expected.num_prompts
            assert result.metrics.keys() == expected.metrics.keys()
            for key, value in expected.metrics.items():
                assert math.isclose(result.metrics[key], value, rel_tol=0, abs_tol=1e-12), (result.dataset, key)


class _PerBatchMax(Metric):
    """A list state with its own reduction: torchmetrics syncs it one tensor at a time."""

    full_state_update = False

    def __init__(self) -> None:
        super().__init__()
        self.add_state("maxima", default=[], dist_reduce_fx=None)

    def update(self, values: Tensor) -> None:
        self.maxima.append(values.max())

    def compute(self) -> Tensor:
        return torch.stack(self.maxima).max() if self.maxima else torch.tensor(math.nan)


def _uneven_list_state(module: torch.nn.Module, batches: list[EvalBatch], ctx: EvalContext) -> None:
    metric = ctx.metric("per_batch_max", _PerBatchMax)
    for batch in batches:
        metric.update(torch.tensor(batch.indices, dtype=torch.float64))


def _round_raising(rank: int, world_size: int) -> str:
    with pytest.raises(EvalRoundError) as err:
        run_round(torch.nn.Identity(), [EvalSet("uneven", list(range(5)), batch_size=2)], _uneven_list_state,
                  seed=SEED, global_step=0, epoch=0)
    return str(err.value)


@pytest.mark.ddp
def test_a_list_state_of_different_lengths_on_the_ranks_fails_on_every_rank_instead_of_hanging() -> None:
    messages = run_ddp(_round_raising, 2, timeout_s=TIMEOUT_S)
    for message in messages:
        assert "per_batch_max" in message and "dist_reduce_fx='cat'" in message, message
