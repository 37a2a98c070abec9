"""Sharding options that reach the user through every entry point: batches sorted by cost by
default, `max_batch_cost` honoured by `shard_all_ranks` and `shard_for_rank`, budgets below one
cost unit, costs of any magnitude dealt by their values, and the messages of odd argument types."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from areal_lightning.eval_round.sharding import deal_batches, global_batches, shard_all_ranks, shard_for_rank

COSTS = [5.0, 1.0, 3.0, 2.0]


def test_every_entry_point_sorts_by_cost_unless_told_not_to() -> None:
    assert shard_all_ranks(COSTS, 2, 1) == [[[1, 3], [2, 0]]]
    assert shard_for_rank(COSTS, 2, 0, 1) == [[1, 3], [2, 0]]
    assert shard_all_ranks(COSTS, 2, 1, sort_by_cost=False) == [[[0, 1], [2, 3]]]
    assert shard_for_rank(COSTS, 2, 0, 1, sort_by_cost=False) == [[0, 1], [2, 3]]


def test_every_entry_point_honours_the_batch_cost_budget() -> None:
    flat = [1.0, 1.0, 1.0, 1.0]
    assert shard_all_ranks(flat, 4, 1) == [[[0, 1, 2, 3]]]
    assert shard_all_ranks(flat, 4, 1, max_batch_cost=2.0) == [[[0, 1], [2, 3]]]
    assert shard_for_rank(flat, 4, 1, 2, max_batch_cost=2.0) == [[2, 3]]


def test_a_budget_below_one_cost_unit_is_a_budget() -> None:
    # 2 samples of cost <= 0.2 fit a budget of 0.5 (2 x 0.2); a third of cost 0.3 does not (3 x 0.3).
    assert global_batches([0.1, 0.2, 0.3], 3, max_batch_cost=0.5) == [[0, 1], [2]]


def test_tiny_costs_are_dealt_by_their_values() -> None:
    assert deal_batches([2e-17, 1e-17], 2) == [[0], [1]]


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        (
            {"batch_size": torch.tensor(2.0)},
            TypeError,
            "global_batches(batch_size=...) must be an integer >= 1, got batch_size=tensor(2.)",
        ),
        (
            {"max_batch_cost": "1"},
            TypeError,
            "global_batches(max_batch_cost=...) must be a positive finite number or None, got max_batch_cost='1'",
        ),
        (
            {"max_batch_cost": [1.0]},
            TypeError,
            "global_batches(max_batch_cost=...) must be a positive finite number or None, got max_batch_cost=[1.0]",
        ),
        (
            {"max_batch_cost": -1.0},
            ValueError,
            "global_batches(max_batch_cost=...) must be a positive finite number or None, got max_batch_cost=-1.0",
        ),
    ],
)
def test_odd_argument_types_get_the_whole_message(kwargs: dict[str, Any], error: type[Exception], message: str) -> None:
    with pytest.raises(error) as info:
        global_batches(COSTS, **{"batch_size": 2, **kwargs})
    assert str(info.value) == message
