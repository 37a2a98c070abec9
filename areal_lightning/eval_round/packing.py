"""One gather for every metric state of a round: each rank packs its states' bytes, and each metric
then syncs through torchmetrics' own code with the gathered states in place of its collectives.

A torchmetrics sync gathers each state from every rank (two all-gathers a state: shapes, then data)
and applies the state's ``dist_reduce_fx`` to the stack. Here a rank records the tensors its metric
would gather (`record_states`: the metric's own sync, run on a world of one and undone), packs their
bytes (`pack_states`), and the round gathers every rank's packs once, with its reports. Each metric
then computes with ``dist_sync_fn`` set to a `Replay` of those tensors: torchmetrics stacks and
reduces them exactly as after a real gather, whatever the reduction (sum, min, max, cat, mean, a
user's function), so every value is bit for bit the one the per-state collectives gave.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch
from torch import Tensor
from torchmetrics import Metric


class Packed(NamedTuple):
    """A rank's recorded state tensors: their bytes, one after the other, and each one's dtype and shape."""

    data: bytes
    layout: list[tuple[str, tuple[int, ...]]]


def _always() -> bool:
    return True


def record_states(metric: Metric) -> list[Tensor]:
    """The tensors `metric`'s sync would gather from this rank, in the order it gathers them."""
    recorded: list[Tensor] = []

    def one_rank(tensor: Tensor, group: Any = None) -> list[Tensor]:
        recorded.append(tensor.detach().clone())
        return [tensor]

    metric.sync(dist_sync_fn=one_rank, distributed_available=_always)
    metric.unsync()  # the local states back, as they were
    return recorded


def pack_states(tensors: Sequence[Tensor]) -> Packed:
    """Every tensor's bytes in one buffer (one copy to the host for all of them)."""
    if not tensors:
        return Packed(b"", [])
    flat = [t.contiguous().view(-1).view(torch.uint8).cpu() for t in tensors]
    layout = [(str(t.dtype).removeprefix("torch."), tuple(t.shape)) for t in tensors]
    return Packed(torch.cat(flat).numpy().tobytes(), layout)


def unpack_states(packed: Packed, device: torch.device | None) -> list[Tensor]:
    """`pack_states`' tensors again, bit for bit, on `device` (None: the CPU)."""
    out: list[Tensor] = []
    if not packed.layout:
        return out
    raw = torch.frombuffer(bytearray(packed.data), dtype=torch.uint8)
    offset = 0
    for dtype_name, shape in packed.layout:
        dtype = getattr(torch, dtype_name)
        size = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        # clone: a view of another dtype needs its own, aligned storage
        out.append(raw[offset : offset + size].clone().view(dtype).reshape(shape).to(device))
        offset += size
    return out


class Replay:
    """A ``dist_sync_fn`` that answers each gather of a metric's sync with every rank's recorded
    tensor at that position, in rank order, on the device of the tensor asked about."""

    def __init__(self, per_rank: Sequence[Sequence[Tensor]]) -> None:
        self._per_rank = per_rank
        self._position = 0

    def __call__(self, tensor: Tensor, group: Any = None) -> list[Tensor]:
        position, self._position = self._position, self._position + 1
        return [states[position].to(tensor.device) for states in self._per_rank]


def compute_replayed(metric: Metric, per_rank: Sequence[Sequence[Tensor]]) -> Any:
    """`metric.compute()`, its sync answered by `Replay(per_rank)` instead of collectives.

    Raises:
        Whatever `compute` raises.
    """
    saved: tuple[Callable[..., Any] | None, Callable[[], bool] | None] = (
        metric.dist_sync_fn,
        metric.distributed_available_fn,
    )
    metric.dist_sync_fn, metric.distributed_available_fn = Replay(per_rank), _always
    try:
        return metric.compute()
    finally:
        metric.dist_sync_fn, metric.distributed_available_fn = saved
