"""The whole error message of each bad argument to the sharding and seeding functions, as the user
reads it: the call, the argument, what is accepted and the bad value with its position."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from areal_lightning.eval_round.sharding import (
    batch_cost,
    cost_balance,
    deal_batches,
    global_batches,
    sample_seed,
    sample_seeds,
    shard_all_ranks,
    shard_for_rank,
)

CASES: list[tuple[Callable[[], Any], type[Exception], str]] = [
    (
        lambda: global_batches([1.0], 0),
        ValueError,
        "global_batches(batch_size=...) must be an integer >= 1, got batch_size=0",
    ),
    (
        lambda: global_batches([1.0], 2.0),
        TypeError,
        "global_batches(batch_size=...) must be an integer >= 1, got batch_size=2.0",
    ),
    (lambda: global_batches([1.0, "3"], 2), TypeError, "global_batches(costs=...) must hold numbers, got costs[1]='3'"),
    (lambda: global_batches([None], 2), TypeError, "global_batches(costs=...) must hold numbers, got costs[0]=None"),
    (
        lambda: global_batches([1.0, -1.0], 2),
        ValueError,
        "global_batches(costs=...) must hold finite non-negative numbers, got costs[1]=-1.0",
    ),
    (
        lambda: deal_batches([1.0], 0),
        ValueError,
        "deal_batches(world_size=...) must be an integer >= 1, got world_size=0",
    ),
    (
        lambda: deal_batches([1.0, "x"], 2),
        TypeError,
        "deal_batches(batch_costs=...) must hold numbers, got batch_costs[1]='x'",
    ),
    (
        lambda: deal_batches([float("nan")], 2),
        ValueError,
        "deal_batches(batch_costs=...) must hold finite non-negative numbers, got batch_costs[0]=nan",
    ),
    (
        lambda: shard_all_ranks([1.0], 1, 0),
        ValueError,
        "shard_all_ranks(world_size=...) must be an integer >= 1, got world_size=0",
    ),
    (
        lambda: shard_for_rank([1.0], 1, 2, 2),
        ValueError,
        "shard_for_rank(rank=...) must be in [0, world_size), got rank=2, world_size=2",
    ),
    (
        lambda: shard_for_rank([1.0], 1, 0, 0),
        ValueError,
        "shard_for_rank(world_size=...) must be an integer >= 1, got world_size=0",
    ),
    (
        lambda: shard_for_rank([1.0], 1, "0", 2),
        TypeError,
        "shard_for_rank(rank=...) must be an integer >= 0, got rank='0'",
    ),
    (
        lambda: batch_cost([1.0, 2.0], []),
        ValueError,
        "batch_cost(batch=...) must hold at least one sample index, got batch=[]",
    ),
    (
        lambda: batch_cost([1.0, 2.0], [0, 2]),
        ValueError,
        "batch_cost(batch=...) must hold indices in [0, 2), got batch[1]=2",
    ),
    (
        lambda: batch_cost([1.0, 2.0], [0.0]),
        TypeError,
        "batch_cost(batch=...) must be an integer >= 0, got batch[0]=0.0",
    ),
    (
        lambda: batch_cost([1.0, -2.0], [1]),
        ValueError,
        "batch_cost(costs[batch]=...) must hold finite non-negative numbers, got costs[batch][0]=-2.0",
    ),
    (lambda: cost_balance([], [1.0]), ValueError, "cost_balance(assignment=...) must hold one list per rank, got []"),
    (
        lambda: cost_balance([[0]], ["1"]),
        TypeError,
        "cost_balance(batch_costs=...) must hold numbers, got batch_costs[0]='1'",
    ),
    (
        lambda: cost_balance([[0]], [-1.0]),
        ValueError,
        "cost_balance(batch_costs=...) must hold finite non-negative numbers, got batch_costs[0]=-1.0",
    ),
    (
        lambda: cost_balance([[0], [0]], [1.0]),
        ValueError,
        "cost_balance(assignment=...) must hold every batch once, got batch 0 on ranks 0 and 1",
    ),
    (
        lambda: cost_balance([[0]], [1.0, 1.0, 1.0]),
        ValueError,
        "cost_balance(assignment=...) must hold every batch once, batches [1, 2] are missing",
    ),
    (
        lambda: cost_balance([[3]], [1.0]),
        ValueError,
        "cost_balance(assignment=...) batch indices must be in [0, 1), got 3 on rank 0",
    ),
    (
        lambda: cost_balance([[0], [0.5]], [1.0]),
        TypeError,
        "cost_balance(assignment=...) must be an integer >= 0, got assignment[1][0]=0.5",
    ),
    (lambda: sample_seed(1, "easy", -1), ValueError, "sample_seed(index=...) must be an integer >= 0, got index=-1"),
    (lambda: sample_seed(1.5, "easy", 0), TypeError, "sample_seed(seed=...) must be an integer, got seed=1.5"),
    (lambda: sample_seed(True, "easy", 0), TypeError, "sample_seed(seed=...) must be an integer, got seed=True"),
    (lambda: sample_seed(1, 3, 0), TypeError, "sample_seed(dataset=...) must be a str (the eval set name), got 3"),
    (lambda: sample_seeds(1.5, "easy", [0]), TypeError, "sample_seeds(seed=...) must be an integer, got seed=1.5"),
    (
        lambda: sample_seeds(1, None, [0]),
        TypeError,
        "sample_seeds(dataset=...) must be a str (the eval set name), got None",
    ),
    (
        lambda: sample_seeds(1, "easy", [0, -2]),
        ValueError,
        "sample_seeds(indices=...) must be an integer >= 0, got indices[1]=-2",
    ),
]


@pytest.mark.parametrize(("call", "error", "message"), CASES)
def test_each_bad_argument_gets_its_whole_message(
    call: Callable[[], Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error) as info:
        call()
    assert str(info.value) == message
