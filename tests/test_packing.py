"""A round's one gather of metric states (`eval_round.packing`), in this process: the packed bytes
come back bit for bit with their dtypes and shapes, and a metric computed from several "ranks'"
recorded states gives what one metric updated with all their values gives, for every kind of
reduction. (`test_round_collectives.py` runs the same on two gloo ranks.)"""

from __future__ import annotations

import math

import pytest
import torch
from torchmetrics import CatMetric, MaxMetric, MeanMetric, Metric, MinMetric, SumMetric

from areal_lightning.eval_round.packing import compute_replayed, pack_states, record_states, unpack_states
from areal_lightning.metrics import ExactMean


def _bits(t: torch.Tensor) -> bytes:
    return t.contiguous().view(-1).view(torch.uint8).numpy().tobytes()


def test_states_come_back_bit_for_bit_with_their_dtypes_and_shapes() -> None:
    tensors = [
        torch.tensor([1.5, -0.0, math.nan, math.inf], dtype=torch.float64),
        torch.arange(6, dtype=torch.int64).reshape(2, 3) - 3,
        torch.tensor(7, dtype=torch.int32),  # a 0-d state
        torch.tensor([True, False, True]),
        torch.tensor([0.1, 65504.0], dtype=torch.float16),
        torch.tensor([1 / 3], dtype=torch.bfloat16),
        torch.zeros(0, 4, dtype=torch.float32),  # an empty cat state
        torch.arange(12, dtype=torch.float32).reshape(3, 4).t(),  # not contiguous
    ]
    back = unpack_states(pack_states(tensors), None)
    assert len(back) == len(tensors)
    for original, restored in zip(tensors, back, strict=True):
        assert restored.dtype == original.dtype
        assert restored.shape == original.shape
        assert _bits(restored) == _bits(original)
    assert unpack_states(pack_states([]), None) == []


def _states(metric: Metric) -> dict[str, torch.Tensor]:
    """A copy of the metric's states (a list state as one tensor)."""
    return {k: (v if isinstance(v, torch.Tensor) else torch.cat(v)).clone() for k, v in metric.metric_state.items()}


def _union(factory: type[Metric], parts: list[torch.Tensor]) -> Metric:
    metric = factory()
    for part in parts:
        metric.update(part)
    return metric


@pytest.mark.parametrize("factory", [SumMetric, MinMetric, MaxMetric, MeanMetric, CatMetric, ExactMean])
def test_a_metric_computed_from_three_ranks_states_is_the_metric_of_all_their_values(factory: type[Metric]) -> None:
    parts = [
        torch.tensor([0.25, 3.0], dtype=torch.float64),
        torch.tensor([-2.0], dtype=torch.float64),
        torch.tensor([10.5, 1.0, 0.125], dtype=torch.float64),
    ]
    ranks = [_union(factory, [p]) for p in parts]
    before = [_states(m) for m in ranks]
    # each rank's states travel as bytes, as in a round's gather
    per_rank = [unpack_states(pack_states(record_states(m)), None) for m in ranks]
    got = compute_replayed(ranks[0], per_rank)
    want = _union(factory, parts).compute()
    assert torch.equal(torch.as_tensor(got), torch.as_tensor(want)), (got, want)
    # recording leaves each rank's own states as they were, unsynced
    for metric, states in zip(ranks, before, strict=True):
        assert not metric._is_synced
        now = _states(metric)
        assert now.keys() == states.keys() and all(torch.equal(now[k], states[k]) for k in states)
    # and the replay is gone after the compute: rank 0 alone computes its own values again
    ranks[0].update(parts[0])
    assert torch.equal(
        torch.as_tensor(ranks[0].compute()), torch.as_tensor(_union(factory, [parts[0], parts[0]]).compute())
    )


def test_a_compute_that_raises_still_gives_the_metric_its_own_sync_back() -> None:
    metric = MeanMetric()
    metric.update(torch.tensor([1.0]))
    own = (metric.dist_sync_fn, metric.distributed_available_fn)
    with pytest.raises(IndexError):  # a replay with fewer recorded states than the sync asks for
        compute_replayed(metric, [[]])
    assert (metric.dist_sync_fn, metric.distributed_available_fn) == own
    assert metric.compute().item() == 1.0


class _ThreeStates(Metric):
    """Three states, each reduced its own way: a replay must answer each gather with its own state."""

    def __init__(self) -> None:
        super().__init__()
        self.add_state("total", torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("high", torch.full((), -math.inf, dtype=torch.float64), dist_reduce_fx="max")
        self.add_state("low", torch.full((), math.inf, dtype=torch.float64), dist_reduce_fx="min")

    def update(self, values: torch.Tensor) -> None:
        self.total += values.sum()
        self.high = torch.maximum(self.high, values.max())
        self.low = torch.minimum(self.low, values.min())

    def compute(self) -> tuple[float, float, float]:
        return self.total.item(), self.high.item(), self.low.item()


def test_each_state_of_a_metric_is_replayed_in_its_own_place() -> None:
    ranks = [_union(_ThreeStates, [p]) for p in (torch.tensor([1.0, 5.0]), torch.tensor([-2.0, 3.0]))]
    per_rank = [unpack_states(pack_states(record_states(m)), None) for m in ranks]
    assert [len(states) for states in per_rank] == [3, 3]
    assert compute_replayed(ranks[1], per_rank) == (7.0, 5.0, -2.0)
