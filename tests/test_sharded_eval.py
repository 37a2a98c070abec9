"""Sharded evaluation over gloo CPU processes: exact, every sample once, device-count independent.

Each DDP test spawns 2 processes (a few seconds of imports each); the references are computed in
this process, without torch.distributed.
"""

from __future__ import annotations

import re
import statistics
from typing import Any

import pytest
import torch
from ddp_utils import run_ddp

from areal_lightning.app.config import load_config
from areal_lightning.eval_round import EvalBatch, EvalContext, check_eval_sets_consistent, local_batches, run_round
from areal_lightning.eval_round.eval_set import EvalSet
from areal_lightning.eval_round.fingerprint import EvalSetMismatchError, check_fingerprints, eval_set_fingerprint
from areal_lightning.eval_round.sharding import sample_seed
from areal_lightning.metrics import RewardMetric
from areal_lightning.tasks.arithmetic import ArithmeticTask

SEED = 7
TIMEOUT_S = 90.0
# (eval set name, samples, batch size): 3 batches over 2 ranks, and 1 batch over 2 ranks (rank 1 gets none).
UNEVEN_SETS = (("three_batches", 5, 2), ("one_batch", 3, 8))
ODD_SET_OVERRIDES = [
    "eval_sets.odd.size=101",
    "eval_sets.odd.digits=2",  # 101 distinct problems: one digit has only 100
    "eval_sets.odd.n_samples=3",
    "eval_sets.odd.batch_size=8",
    "eval_sets.odd.temperature=1.0",
    "policy.d_model=32",
    "policy.n_layers=1",
    f"seed={SEED}",
]


def _draw(seed: int) -> float:
    """The sample's random outcome: one uniform draw from its own seed."""
    return float(torch.rand((), generator=torch.Generator().manual_seed(seed), dtype=torch.float64))


def _draw_evaluate_fn(module: torch.nn.Module, batches: list[EvalBatch], ctx: EvalContext) -> dict[str, Any]:
    stats = ctx.metric("draw", RewardMetric)  # created on every rank, whether it was dealt batches or not
    draws = []
    for batch in batches:
        for index, seed in zip(batch.indices, batch.seeds, strict=True):
            value = _draw(seed)
            stats.update(torch.tensor([value], dtype=torch.float64))
            ctx.record_sample(index, draw=value, rank=ctx.rank)
            draws.append(value)
    # A per-sample tensor: the round averages it over all ranks' samples.
    return {"draw_per_sample": torch.tensor(draws, dtype=torch.float64)}


def _uneven_sets() -> list[EvalSet]:
    # Uneven costs: the deal is by cost, and the count of samples per rank differs.
    return [
        EvalSet(name, list(range(size)), batch_size=batch, cost_fn=lambda i: 1.0 + i % 3)
        for name, size, batch in UNEVEN_SETS
    ]


def _uneven_round(rank: int, world_size: int) -> tuple[list[Any], list[int]]:
    sets = _uneven_sets()
    dealt = [len(local_batches(s, SEED, rank, world_size)) for s in sets]
    results = run_round(
        torch.nn.Linear(1, 1),
        sets,
        _draw_evaluate_fn,
        seed=SEED,
        global_step=5,
        epoch=0,
        max_table_rows=max(size for _, size, _ in UNEVEN_SETS),
    )
    return results, dealt


@pytest.mark.ddp
def test_uneven_batch_counts_complete_with_exact_totals() -> None:
    (results0, dealt0), (results1, dealt1) = run_ddp(_uneven_round, 2, timeout_s=TIMEOUT_S)
    assert [a + b for a, b in zip(dealt0, dealt1, strict=True)] == [3, 1]
    assert dealt1[1] == 0 or dealt0[1] == 0  # one rank had no batch of the one-batch set
    assert sorted(dealt0[:1] + dealt1[:1]) == [1, 2]
    for (name, size, _), r0, r1 in zip(UNEVEN_SETS, results0, results1, strict=True):
        draws = [_draw(sample_seed(SEED, name, i)) for i in range(size)]  # the single-process reference
        assert r0.metrics == r1.metrics  # every rank gets the same reduced result
        assert r0.num_prompts == size and r0.num_samples == size
        assert [row["index"] for row in r0.table_rows] == list(range(size))  # each sample exactly once
        assert [row["draw"] for row in r0.table_rows] == draws
        # Bit for bit the correctly rounded values (statistics computes them from exact fractions).
        assert r0.metrics["draw/mean"] == r0.metrics["draw_per_sample"] == statistics.mean(draws)
        assert r0.metrics["draw/std"] == statistics.pstdev(draws)
        assert (r0.metrics["draw/min"], r0.metrics["draw/max"]) == (min(draws), max(draws))


def _odd_set_round(rank: int, world_size: int) -> list[Any]:
    from areal_lightning.app.builders import build_eval_sets, build_module
    from areal_lightning.rl.rollout_eval import rollout_evaluate

    cfg = load_config(None, ODD_SET_OVERRIDES)
    module = build_module(cfg)  # seeded: the same random weights on every rank
    eval_sets = build_eval_sets(cfg, module.task)
    check_eval_sets_consistent(eval_sets)
    return run_round(
        module,
        eval_sets,
        rollout_evaluate,
        seed=cfg.seed,
        global_step=0,
        epoch=0,
        max_table_rows=cfg.eval_sets["odd"].size,
    )


@pytest.mark.ddp
def test_per_sample_outcomes_and_metrics_match_one_process() -> None:
    single = _odd_set_round(0, 1)  # no process group here: one rank evaluates everything
    double = run_ddp(_odd_set_round, 2, timeout_s=TIMEOUT_S)
    (one,), (two,) = single, double[0]
    assert one.num_prompts == two.num_prompts == 101
    assert one.num_samples == two.num_samples == 303
    # Random weights: each prompt's first completion is a near-unique string, a sharp per-sample check.
    assert [(r["index"], r["completion"]) for r in one.table_rows] == [
        (r["index"], r["completion"]) for r in two.table_rows
    ]
    assert one.metrics.keys() == two.metrics.keys()
    for name, value in one.metrics.items():
        assert value == two.metrics[name], name  # bit for bit: the float sums are exact
    assert double[0][0].metrics == double[1][0].metrics


def _mismatched_sets(rank: int, world_size: int, overrides_by_rank: list[list[str]]) -> str:
    cfg = load_config(None, overrides_by_rank[rank])
    from areal_lightning.app.builders import build_eval_sets

    try:
        check_eval_sets_consistent(build_eval_sets(cfg, ArithmeticTask(seed=cfg.seed)))
    except EvalSetMismatchError as err:
        return str(err)
    return "no error"


@pytest.mark.ddp
def test_ranks_with_different_eval_data_fail_with_the_fingerprint_error() -> None:
    size_differs = [
        ["eval_sets.odd.size=101", "eval_sets.odd.digits=2", "eval_sets.common.size=5"],
        ["eval_sets.odd.size=100", "eval_sets.odd.digits=2", "eval_sets.common.size=5", "eval_sets.extra.size=3"],
    ]
    messages = run_ddp(_mismatched_sets, 2, size_differs, timeout_s=TIMEOUT_S)
    assert messages[0] == messages[1]  # both ranks raise, with the same message
    assert re.search(
        r"eval set 'odd' differs across ranks: ranks \[0\] have fingerprint \w+, ranks \[1\] have", messages[0]
    )
    assert "eval set 'extra' is missing on ranks [0]" in messages[0]
    assert "'common'" not in messages[0]


@pytest.mark.ddp
def test_ranks_that_would_cut_different_batches_fail_with_the_fingerprint_error() -> None:
    # Same samples, other batch size: the ranks' deals would overlap (samples twice, others never).
    batch_differs = [
        ["eval_sets.odd.size=10", "eval_sets.odd.batch_size=4"],
        ["eval_sets.odd.size=10", "eval_sets.odd.batch_size=3"],
    ]
    messages = run_ddp(_mismatched_sets, 2, batch_differs, timeout_s=TIMEOUT_S)
    assert messages[0] == messages[1]
    assert "eval set 'odd' differs across ranks" in messages[0]


def test_fingerprints_of_the_same_sets_agree_and_of_other_data_or_batching_differ() -> None:
    # What each rank sends in the check: built twice (as two ranks do), the same; one sample or
    # the batch size changed, another, and the check names the set.
    check_eval_sets_consistent(_uneven_sets())  # one process: no process group, nothing to compare
    first, second = _uneven_sets(), _uneven_sets()
    same = [{s.name: eval_set_fingerprint(s) for s in sets} for sets in (first, second)]
    check_fingerprints(same)  # two ranks with the same sets: no error
    name, size, batch = UNEVEN_SETS[0]
    for other in (
        EvalSet(name, [*range(size - 1), size], batch_size=batch, cost_fn=lambda i: 1.0 + i % 3),  # one sample
        EvalSet(name, list(range(size)), batch_size=batch + 1, cost_fn=lambda i: 1.0 + i % 3),  # batching
    ):
        differs = {**same[0], name: eval_set_fingerprint(other)}
        with pytest.raises(EvalSetMismatchError, match=rf"eval set '{name}' differs across ranks: ranks \[0\]"):
            check_fingerprints([same[0], differs])
