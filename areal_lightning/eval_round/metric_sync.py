"""Metric states that travel in the round's one object gather, so metrics sync without collectives.

torchmetrics syncs a metric by calling its ``dist_sync_fn(tensor, group)`` once per state (each call
two all-gathers: shape, then data) and reducing what comes back with the state's own
``dist_reduce_fx``. The round already gathers one object from every rank, so it carries each
metric's local states there (`local_states`), and `synced_from` hands torchmetrics those gathered
values through the same documented ``dist_sync_fn`` hook: the reductions, and so the numbers, are
torchmetrics' own, and a round's collectives drop from 1 + 2 per state to 1.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from torch import Tensor
from torchmetrics import Metric

StateList = list[Tensor]
"""One metric's local states, in the order torchmetrics' sync visits them."""


class StateSyncError(RuntimeError):
    """Ranks hold different numbers of states for one metric (a list state torchmetrics cannot sync)."""


def _always() -> bool:
    return True


def local_states(metric: Metric) -> StateList:
    """This rank's states of `metric` as its sync would send them, copied to the CPU.

    Runs the metric's own sync with a function that records what it is handed and gathers
    nothing, then restores the local states.

    Example:
        >>> import torch
        >>> from torchmetrics import SumMetric
        >>> m = SumMetric()
        >>> m.update(torch.tensor([1.0, 2.0]))
        >>> local_states(m)
        [tensor(3.)]
    """
    seen: StateList = []

    def record(tensor: Tensor, group: Any = None) -> list[Tensor]:
        seen.append(tensor.detach().cpu())
        return [tensor]

    metric.sync(dist_sync_fn=record, distributed_available=_always)
    metric.unsync()
    return seen


@contextmanager
def synced_from(metric: Metric, per_rank: Sequence[StateList], name: str) -> Iterator[None]:
    """Within the block, the metric's sync (e.g. inside ``compute()``) gets `per_rank`'s states
    instead of gathering them: the i-th state it asks for is every rank's i-th state, in rank order.

    Raises:
        StateSyncError: when ranks hold different numbers of states for `name` (every rank
            raises alike, as every rank sees the same gathered lists).

    Example:
        >>> import torch
        >>> from torchmetrics import SumMetric
        >>> m = SumMetric(distributed_available_fn=lambda: True)  # as under torch.distributed
        >>> m.update(torch.tensor(3.0))
        >>> with synced_from(m, [local_states(m), [torch.tensor(4.0)]], "sum"):  # rank 0's, rank 1's
        ...     m.compute()
        tensor(7.)
    """
    counts = {len(states) for states in per_rank}
    if len(counts) > 1:
        raise StateSyncError(f"metric {name!r} holds {sorted(counts)} states on different ranks; a list state "
                             "must use dist_reduce_fx='cat' to be reduced across ranks")
    calls = iter(range(counts.pop() if counts else 0))

    def replay(tensor: Tensor, group: Any = None) -> list[Tensor]:
        i = next(calls)
        return [states[i].to(tensor.device) for states in per_rank]

    saved: Callable[..., Any] | None = metric.dist_sync_fn
    metric.dist_sync_fn = replay
    try:
        yield
    finally:
        metric.dist_sync_fn = saved


def states_by_name(metrics: Mapping[str, Metric]) -> dict[str, StateList]:
    """`local_states` of each metric, by name: what a rank puts into the round's object gather."""
    return {name: local_states(metric) for name, metric in metrics.items()}
