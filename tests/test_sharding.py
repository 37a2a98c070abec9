"""Tests of areal_lightning.eval_round.sharding: exact, world-size-independent, cost-balanced sharding."""

from __future__ import annotations

import itertools
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from areal_lightning.eval_round.fingerprint import EvalSetMismatchError, check_fingerprints, fingerprint
from areal_lightning.eval_round.sharding import (
    batch_cost,
    batch_costs,
    cost_balance,
    deal_batches,
    global_batches,
    sample_seed,
    sample_seeds,
    shard_for_rank,
)

REPO_ROOT = Path(__file__).resolve().parents[1]
WORLD_SIZES = range(1, 9)
BALANCE_TARGET = 1.05
# Very uneven prompt lengths: lognormal around a median of ~55 tokens, the longest ~20-40x that.
PROMPT_LOG_MEAN, PROMPT_LOG_SIGMA = 4.0, 1.0


def uneven_prompt_lengths(n: int, seed: int) -> list[int]:
    rng = np.random.default_rng(seed)
    lengths = rng.lognormal(PROMPT_LOG_MEAN, PROMPT_LOG_SIGMA, n)
    return [int(x) for x in np.maximum(1, np.round(lengths))]


def round_robin(num_batches: int, world_size: int) -> list[list[int]]:
    """The deal by count that a DistributedSampler-style split would make: batch i to rank i % W."""
    return [list(range(rank, num_batches, world_size)) for rank in range(world_size)]


def reference_balance(assignment: list[list[int]], costs: list[float]) -> float:
    loads = np.array([sum(costs[b] for b in batches) for batches in assignment], dtype=float)
    return float(loads.max() / loads.mean())


# --- every sample exactly once, whatever the world size -------------------------------------


@pytest.mark.parametrize("n, batch_size", [(0, 4), (1, 4), (7, 3), (101, 1), (101, 8), (101, 200), (1000, 16)])
@pytest.mark.parametrize("sort_by_cost", [True, False])
def test_every_sample_is_evaluated_exactly_once(n: int, batch_size: int, sort_by_cost: bool) -> None:
    costs = uneven_prompt_lengths(n, seed=n)
    batches = global_batches(costs, batch_size, sort_by_cost=sort_by_cost)
    assert sorted(i for batch in batches for i in batch) == list(range(n))
    assert all(1 <= len(batch) <= batch_size for batch in batches)
    for world_size in WORLD_SIZES:
        shards = [
            shard_for_rank(costs, batch_size, rank, world_size, sort_by_cost=sort_by_cost) for rank in range(world_size)
        ]
        assert sorted(i for shard in shards for batch in shard for i in batch) == list(range(n))
        # The ranks together hold exactly the global batches: batching never depends on W.
        dealt = sorted(tuple(batch) for shard in shards for batch in shard)
        assert dealt == sorted(tuple(batch) for batch in batches)


def test_fewer_batches_than_ranks_leaves_some_ranks_empty() -> None:
    costs = [3.0, 1.0, 2.0, 5.0, 4.0]
    shards = [shard_for_rank(costs, 2, rank, 8) for rank in range(8)]
    assert sum(1 for shard in shards if shard) == 3
    assert sorted(i for shard in shards for batch in shard for i in batch) == list(range(5))
    assert deal_batches([1.0, 2.0], world_size=4) == [[1], [0], [], []]


def test_sorted_batches_group_similar_costs_with_ties_by_index() -> None:
    costs = uneven_prompt_lengths(101, seed=0)
    reference = [int(i) for i in np.lexsort((np.arange(101), np.array(costs)))]
    expected = [reference[start : start + 8] for start in range(0, 101, 8)]
    assert global_batches(costs, 8) == expected
    assert global_batches([2.0] * 5, 2) == [[0, 1], [2, 3], [4]]
    in_index_order = [list(range(s, min(s + 8, 101))) for s in range(0, 101, 8)]
    assert global_batches(costs, 8, sort_by_cost=False) == in_index_order
    # Sorting is the point: padded batches cost far less than in index order.
    sorted_cost = sum(batch_costs(costs, global_batches(costs, 8)))
    unsorted_cost = sum(batch_costs(costs, global_batches(costs, 8, sort_by_cost=False)))
    assert sorted_cost < 0.75 * unsorted_cost


def test_max_batch_cost_splits_heavy_batches() -> None:
    costs = [1.0, 1.0, 1.0, 1.0, 10.0, 10.0, 30.0]
    batches = global_batches(costs, 4, max_batch_cost=20.0)
    assert batches == [[0, 1, 2, 3], [4, 5], [6]]  # [6] alone exceeds the budget: its own batch
    lengths = uneven_prompt_lengths(1000, seed=1)
    budget = 4 * 16 * float(np.median(lengths))
    batches = global_batches(lengths, 16, max_batch_cost=budget)
    assert sorted(i for batch in batches for i in batch) == list(range(1000))
    assert all(len(b) == 1 or batch_cost(lengths, b) <= budget for b in batches)


# --- the deal -------------------------------------------------------------------------------


def test_deal_is_longest_processing_time_with_documented_ties() -> None:
    # Batches go in order 0, 1, 2, 3 (equal costs: lower index first) to the least-loaded rank,
    # ties to the lowest rank.
    assert deal_batches([5.0, 5.0, 5.0, 5.0], world_size=2) == [[0, 2], [1, 3]]
    assert deal_batches([1.0, 7.0, 3.0, 4.0, 2.0], world_size=2) == [[1, 4], [0, 2, 3]]
    assert deal_batches([], world_size=3) == [[], [], []]
    assert deal_batches([2.0, 1.0], world_size=1) == [[0, 1]]


def test_deal_is_within_the_lpt_bound_of_the_brute_force_optimum() -> None:
    rng = random.Random(0)
    for _ in range(30):
        world_size = rng.randint(2, 3)
        costs = [float(rng.randint(1, 50)) for _ in range(rng.randint(1, 8))]
        optimum = min(
            max(sum(c for c, r in zip(costs, owners, strict=True) if r == rank) for rank in range(world_size))
            for owners in itertools.product(range(world_size), repeat=len(costs))
        )
        dealt = deal_batches(costs, world_size)
        assert sorted(b for batches in dealt for b in batches) == list(range(len(costs)))
        worst = max(sum(costs[b] for b in batches) for batches in dealt)
        assert worst <= (4 / 3 - 1 / (3 * world_size)) * optimum + 1e-9  # Graham's LPT bound


@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize("data_seed", range(5))
def test_deal_balances_cost_on_very_uneven_prompt_lengths(world_size: int, data_seed: int) -> None:
    lengths = uneven_prompt_lengths(1000, seed=data_seed)
    costs = batch_costs(lengths, global_batches(lengths, 16))
    dealt = deal_batches(costs, world_size)
    balance = cost_balance(dealt, costs)
    assert balance == pytest.approx(reference_balance(dealt, costs))
    assert balance <= BALANCE_TARGET
    assert balance < cost_balance(round_robin(len(costs), world_size), costs)


def test_budgeted_batches_balance_eight_ranks_where_count_batches_cannot() -> None:
    # In this eval set the heaviest batch of 16 costs more than 1/8 of the total.
    lengths = uneven_prompt_lengths(1000, seed=1)
    counted = batch_costs(lengths, global_batches(lengths, 16))
    assert cost_balance(deal_batches(counted, 8), counted) > BALANCE_TARGET
    budget = 4 * 16 * float(np.median(lengths))
    budgeted = batch_costs(lengths, global_batches(lengths, 16, max_batch_cost=budget))
    assert cost_balance(deal_batches(budgeted, 8), budgeted) <= BALANCE_TARGET


def test_cost_balance_matches_reference() -> None:
    assert cost_balance([[0, 1], [2]], [1.0, 1.0, 2.0]) == 1.0
    uneven = [[0], [], [1]]
    assert cost_balance(uneven, [3.0, 0.0]) == pytest.approx(reference_balance(uneven, [3.0, 0.0]))
    assert cost_balance([[0], [1]], [0.0, 0.0]) == 1.0  # nothing to do: perfectly balanced


# --- per-sample seeds -----------------------------------------------------------------------

_SEED_CASES = [
    (1, "easy", 0),
    (1, "easy", 1),
    (1, "hard", 0),
    (2, "easy", 0),
    (-7, 'a,b"c', 10**6),
    (1, "ünï", 3),
]


def test_sample_seeds_are_stable_distinct_and_in_range() -> None:
    seeds = [sample_seed(s, d, i) for s, d, i in _SEED_CASES]
    assert seeds == [sample_seed(s, d, i) for s, d, i in _SEED_CASES]
    names = ("easy", "easy ", "hard")
    grid = [sample_seed(s, d, i) for s in (0, 1, 2) for d in names for i in range(300)]
    assert len(set(grid)) == len(grid)
    assert all(0 <= s < 2**63 for s in grid + seeds)
    assert sample_seeds(1, "easy", [5, 0, 5]) == [sample_seed(1, "easy", i) for i in (5, 0, 5)]
    assert sample_seed(np.int64(1), "easy", np.int64(4)) == sample_seed(1, "easy", 4)


def test_sample_seed_seeds_a_torch_generator() -> None:
    torch = pytest.importorskip("torch")
    seeds = [sample_seed(s, d, i) for s, d, i in _SEED_CASES]  # the largest included: accepted by manual_seed
    draws = [torch.rand(4, generator=torch.Generator().manual_seed(seed)).tolist() for seed in seeds]
    assert draws[0] == torch.rand(4, generator=torch.Generator().manual_seed(seeds[0])).tolist()  # reproducible
    assert len({tuple(d) for d in draws}) == len(seeds)  # each sample its own stream


_SUBPROCESS_CODE = """
import json, sys
from areal_lightning.eval_round.fingerprint import fingerprint
from areal_lightning.eval_round.sharding import sample_seed
cases = json.loads(sys.argv[1])
print(json.dumps({"seeds": [sample_seed(*c) for c in cases],
                  "fingerprint": fingerprint("easy", ["1+1=", b"2+2=", "ünï"])}))
"""


@pytest.mark.process
@pytest.mark.parametrize("hash_seed", ["1", "2"])
def test_seeds_and_fingerprints_are_stable_across_processes(hash_seed: str) -> None:
    env = {**os.environ, "PYTHONHASHSEED": hash_seed, "PYTHONPATH": str(REPO_ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", _SUBPROCESS_CODE, json.dumps(_SEED_CASES)],
        env=env,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    other = json.loads(out.stdout)
    assert other["seeds"] == [sample_seed(s, d, i) for s, d, i in _SEED_CASES]
    assert other["fingerprint"] == fingerprint("easy", ["1+1=", b"2+2=", "ünï"])


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_per_sample_outcomes_and_metric_do_not_depend_on_world_size(world_size: int) -> None:
    lengths = uneven_prompt_lengths(101, seed=3)

    def evaluate(batch: list[int]) -> dict[int, bool]:
        # A stand-in for sampled generation: each sample's outcome comes from its own seed only.
        seeds = sample_seeds(7, "easy", batch)
        return {i: random.Random(s).random() < 0.5 for i, s in zip(batch, seeds, strict=True)}

    single = {i: ok for b in shard_for_rank(lengths, 8, 0, 1) for i, ok in evaluate(b).items()}
    merged: dict[int, bool] = {}
    for rank in range(world_size):
        for batch in shard_for_rank(lengths, 8, rank, world_size):
            outcomes = evaluate(batch)
            assert not merged.keys() & outcomes.keys()  # no sample twice
            merged.update(outcomes)
    assert merged == single
    assert sum(merged.values()) / len(merged) == sum(single.values()) / len(single)


# --- fingerprints ---------------------------------------------------------------------------


def test_fingerprint_sees_name_size_order_and_content() -> None:
    base = fingerprint("easy", ["1+1=|2", "2+2=|4"])
    assert base == fingerprint("easy", ["1+1=|2", "2+2=|4"])
    assert base == fingerprint("easy", [b"1+1=|2", b"2+2=|4"])  # a str counts as its UTF-8
    assert len(base) == 16 and int(base, 16) >= 0
    variants = [
        fingerprint("hard", ["1+1=|2", "2+2=|4"]),
        fingerprint("easy", ["2+2=|4", "1+1=|2"]),
        fingerprint("easy", ["1+1=|2", "2+2=|5"]),
        fingerprint("easy", ["1+1=|2"]),
        fingerprint("easy", ["1+1=|2", "2+2=|4", ""]),
        fingerprint("easy", ["1+1=|22+2=|4"]),
        fingerprint("easy", ["1+1=|", "22+2=|4"]),
    ]
    assert len({base, *variants}) == len(variants) + 1


def test_check_fingerprints_accepts_identical_sets() -> None:
    same = {"easy": fingerprint("easy", ["a"]), "hard": fingerprint("hard", ["b"])}
    check_fingerprints([same, dict(same), dict(same)])
    check_fingerprints([{}])


def test_check_fingerprints_names_the_set_and_ranks_that_differ() -> None:
    easy, hard = fingerprint("easy", ["a"]), fingerprint("hard", ["b"])
    other = fingerprint("easy", ["a", "c"])
    per_rank = [{"easy": easy, "hard": hard}, {"easy": other, "hard": hard}, {"easy": easy, "hard": hard}]
    with pytest.raises(
        EvalSetMismatchError,
        match=(
            rf"^eval set 'easy' differs across ranks: ranks \[0, 2\] have fingerprint {easy}, "
            rf"ranks \[1\] have fingerprint {other}; every rank must build the same eval sets "
            r"\(same seed, size, data files\)$"
        ),
    ):
        check_fingerprints(per_rank)


def test_check_fingerprints_names_sets_missing_on_some_ranks() -> None:
    easy, hard = fingerprint("easy", ["a"]), fingerprint("hard", ["b"])
    missing = r"^eval set 'hard' is missing on ranks \[1\]; every rank must build"
    with pytest.raises(EvalSetMismatchError, match=missing):
        check_fingerprints([{"easy": easy, "hard": hard}, {"easy": easy}])
    with pytest.raises(EvalSetMismatchError) as info:
        check_fingerprints([{"easy": easy}, {"easy": hard, "hard": hard}, {}])
    message = str(info.value)
    assert "eval set 'easy' is missing on ranks [2]" in message
    assert f"eval set 'easy' differs across ranks: ranks [0] have fingerprint {easy}" in message
    assert "eval set 'hard' is missing on ranks [0, 2]" in message
    assert isinstance(info.value, RuntimeError)


# --- argument errors ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "call, error, match",
    [
        (
            lambda: global_batches([1.0], 0),
            ValueError,
            r"global_batches\(batch_size=\.\.\.\) must be an integer >= 1, got batch_size=0",
        ),
        (
            lambda: global_batches([1.0], 2.0),
            TypeError,
            r"global_batches\(batch_size=\.\.\.\) must be an integer >= 1, got batch_size=2\.0",
        ),
        (lambda: global_batches([1.0], True), TypeError, r"got batch_size=True"),
        (
            lambda: global_batches([1.0, float("nan"), -1.0], 2),
            ValueError,
            r"global_batches\(costs=\.\.\.\) must hold finite non-negative numbers, "
            r"got costs\[1\]=nan",
        ),
        (lambda: global_batches([1.0, 2.0, -1.0], 2), ValueError, r"got costs\[2\]=-1\.0"),
        (lambda: global_batches([float("inf")], 2), ValueError, r"got costs\[0\]=inf"),
        (
            lambda: global_batches([1.0, "3"], 2),
            TypeError,
            r"global_batches\(costs=\.\.\.\) must hold numbers, got costs\[1\]='3'",
        ),
        (
            lambda: global_batches([1.0], 2, max_batch_cost=0.0),
            ValueError,
            r"global_batches\(max_batch_cost=\.\.\.\) must be a positive finite number or None, "
            r"got max_batch_cost=0\.0",
        ),
        (
            lambda: global_batches([1.0], 2, max_batch_cost=float("nan")),
            ValueError,
            r"must be a positive finite number or None, got max_batch_cost=nan",
        ),
        (
            lambda: deal_batches([1.0], 0),
            ValueError,
            r"deal_batches\(world_size=\.\.\.\) must be an integer >= 1, got world_size=0",
        ),
        (
            lambda: deal_batches([1.0, -2.0], 2),
            ValueError,
            r"deal_batches\(batch_costs=\.\.\.\) must hold finite non-negative numbers, "
            r"got batch_costs\[1\]=-2\.0",
        ),
        (
            lambda: shard_for_rank([1.0], 1, 2, 2),
            ValueError,
            r"shard_for_rank\(rank=\.\.\.\) must be in \[0, world_size\), got rank=2, world_size=2",
        ),
        (
            lambda: shard_for_rank([1.0], 1, -1, 2),
            ValueError,
            r"shard_for_rank\(rank=\.\.\.\) must be an integer >= 0, got rank=-1",
        ),
        (
            lambda: batch_cost([1.0, 2.0], []),
            ValueError,
            r"batch_cost\(batch=\.\.\.\) must hold at least one sample index, got batch=\[\]",
        ),
        (
            lambda: batch_cost([1.0, 2.0], [0, 2]),
            ValueError,
            r"batch_cost\(batch=\.\.\.\) must hold indices in \[0, 2\), got batch\[1\]=2",
        ),
        (
            lambda: cost_balance([], [1.0]),
            ValueError,
            r"cost_balance\(assignment=\.\.\.\) must hold one list per rank, got \[\]",
        ),
        (
            lambda: cost_balance([[0], [0]], [1.0]),
            ValueError,
            r"must hold every batch once, got batch 0 on ranks 0 and 1",
        ),
        (
            lambda: cost_balance([[0]], [1.0, 1.0]),
            ValueError,
            r"must hold every batch once, batches \[1\] are missing",
        ),
        (
            lambda: cost_balance([[3]], [1.0]),
            ValueError,
            r"batch indices must be in \[0, 1\), got 3 on rank 0",
        ),
        (
            lambda: cost_balance([[0], [0.5]], [1.0]),
            TypeError,
            r"cost_balance\(assignment=\.\.\.\) must be an integer >= 0, "
            r"got assignment\[1\]\[0\]=0\.5",
        ),
        (
            lambda: sample_seed(1, "easy", -1),
            ValueError,
            r"sample_seed\(index=\.\.\.\) must be an integer >= 0, got index=-1",
        ),
        (
            lambda: sample_seed(1.5, "easy", 0),
            TypeError,
            r"sample_seed\(seed=\.\.\.\) must be an integer, got seed=1\.5",
        ),
        (
            lambda: sample_seed(1, 3, 0),
            TypeError,
            r"sample_seed\(dataset=\.\.\.\) must be a str \(the eval set name\), got 3",
        ),
        (
            lambda: sample_seeds(1, "easy", [0, -2]),
            ValueError,
            r"sample_seeds\(indices=\.\.\.\) must be an integer >= 0, got indices\[1\]=-2",
        ),
        (lambda: fingerprint(3, []), TypeError, r"fingerprint\(name=\.\.\.\) must be a str, got 3"),
        (
            lambda: fingerprint("easy", ["a", 5]),
            TypeError,
            r"fingerprint\(sample_keys=\.\.\.\) must hold str or bytes, got sample_keys\[1\]=5",
        ),
        (
            lambda: check_fingerprints([]),
            ValueError,
            r"check_fingerprints\(per_rank=\.\.\.\) must hold one mapping per rank, got \[\]",
        ),
        (lambda: check_fingerprints([{}, ["easy"]]), TypeError, r"got per_rank\[1\]=\['easy'\]"),
    ],
)
def test_bad_arguments_are_named_in_the_error(call, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        call()
