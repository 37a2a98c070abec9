"""Rank helpers of the round: who am I, and one object gather that every rank enters."""

from __future__ import annotations

from typing import Any

import torch


def dist_info() -> tuple[int, int]:
    """(rank, world size) of the default process group, (0, 1) without one."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def all_gather_object(obj: Any) -> list[Any]:
    """Every rank's `obj`, indexed by rank; `[obj]` without a process group."""
    _, world = dist_info()
    if world == 1:
        return [obj]
    out: list[Any] = [None] * world
    torch.distributed.all_gather_object(out, obj)
    return out
