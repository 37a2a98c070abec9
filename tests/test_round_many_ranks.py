"""The eval round on 3 and 4 gloo CPU processes: odd set sizes, a set smaller than the number of
ranks, and ranks dealt nothing at all; every sample counted exactly once, the same numbers as on
one process.
"""

from __future__ import annotations

import statistics
from typing import Any

import pytest
import torch
from ddp_utils import run_ddp

from areal_lightning.eval_round import EvalBatch, EvalContext, EvalSet, local_batches, run_round
from areal_lightning.eval_round.sharding import sample_seed
from areal_lightning.metrics import RewardMetric

SEED = 11
TIMEOUT_S = 180.0
# (name, samples, batch size): 4 batches of odd size, 2 one-sample batches (fewer than the ranks),
# one batch of 5 (every rank but one idle).
SETS = (("odd", 7, 2), ("fewer_than_ranks", 2, 1), ("one_batch", 5, 8))


def _draw(seed: int) -> float:
    return float(torch.rand((), generator=torch.Generator().manual_seed(seed), dtype=torch.float64))


def _draw_fn(module: torch.nn.Module, batches: list[EvalBatch], ctx: EvalContext) -> dict[str, Any]:
    stats = ctx.metric("draw", RewardMetric)
    draws = []
    for batch in batches:
        for index, seed in zip(batch.indices, batch.seeds, strict=True):
            draws.append(_draw(seed))
            stats.update(torch.tensor(draws[-1:], dtype=torch.float64))
            ctx.record_sample(index, draw=draws[-1])
    return {"draw_per_sample": torch.tensor(draws, dtype=torch.float64), "batches": float(len(batches))}


def _sets() -> list[EvalSet]:
    return [
        EvalSet(name, list(range(size)), batch_size=batch, cost_fn=lambda i: 1.0 + (i * 5) % 3)
        for name, size, batch in SETS
    ]


def _round(rank: int, world_size: int) -> tuple[list[Any], list[int]]:
    sets = _sets()
    dealt = [len(local_batches(s, SEED, rank, world_size)) for s in sets]
    results = run_round(
        torch.nn.Identity(),
        sets,
        _draw_fn,
        seed=SEED,
        global_step=1,
        epoch=0,
        max_table_rows=max(size for _, size, _ in SETS),
    )
    return results, dealt


@pytest.mark.ddp
@pytest.mark.parametrize("world_size", [3, 4])
def test_round_on_more_ranks_counts_every_sample_once(world_size: int) -> None:
    out = run_ddp(_round, world_size, timeout_s=TIMEOUT_S)
    dealt = [d for _, d in out]
    assert [sum(d[i] for d in dealt) for i in range(len(SETS))] == [4, 2, 1]
    assert sum(1 for d in dealt if d[2] == 0) == world_size - 1  # idle ranks on the one-batch set
    assert sum(1 for d in dealt if d[1] == 0) == world_size - 2  # and on the two-batch set
    for i, (name, size, _) in enumerate(SETS):
        results = [r[i] for r, _ in out]
        assert all(r.metrics == results[0].metrics for r in results)  # every rank the same numbers
        result = results[0]
        draws = [_draw(sample_seed(SEED, name, j)) for j in range(size)]  # the one-process outcome
        assert result.num_prompts == result.num_samples == size
        assert [row["index"] for row in result.table_rows] == list(range(size))
        assert [row["draw"] for row in result.table_rows] == draws
        # Bit for bit the correctly rounded values (statistics computes them from exact fractions).
        assert result.metrics["draw/mean"] == result.metrics["draw_per_sample"] == statistics.mean(draws)
        assert result.metrics["draw/std"] == statistics.pstdev(draws)
        # A scalar is each rank's mean over its prompts, weighted by them: idle ranks weigh nothing.
        per_rank = [
            (d[i], sum(len(b.indices) for b in local_batches(_sets()[i], SEED, r, world_size)))
            for r, d in enumerate(dealt)
        ]
        assert result.metrics["batches"] == sum(b * p for b, p in per_rank) / size
