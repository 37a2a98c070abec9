"""How the strategy holds the parameters (`strategy_parameters`), the one answer behind two
decisions: whether the eval round keeps every rank's forwards in lockstep
(`eval_round.run_round(lockstep=...)`), and whether async evaluation can copy whole weights.

Sharded parameters (FSDP2 `fully_shard` under `ModelParallelStrategy`, Lightning's `FSDPStrategy`,
DeepSpeed ZeRO stage 3) are all-gathered inside every forward: a rank that runs one forward more
than another pairs that all-gather with whatever collective the other rank runs next (the round's
own gather), which hangs, crashes or returns wrong numbers. Tensor parallelism is refused: its ranks
must all see the same batch, and the round deals every rank different batches.
"""

from __future__ import annotations

import logging
from enum import Enum

from lightning.pytorch.strategies import (
    DDPStrategy,
    FSDPStrategy,
    ModelParallelStrategy,
    SingleDeviceStrategy,
    Strategy,
)
from torch import nn
from torch.distributed.tensor import DTensor

log = logging.getLogger(__name__)

TENSOR_PARALLEL_DIM = "tensor_parallel"
"""The device-mesh dimension `ModelParallelStrategy` names for tensor parallelism."""


class UnsupportedStrategyError(ValueError):
    """The strategy splits the model in a way the eval round cannot deal batches for."""


def _tensor_parallel_param(module: nn.Module) -> tuple[str, int] | None:
    """(name, ranks) of the first parameter split over a tensor-parallel mesh dimension of > 1 rank."""
    for name, param in module.named_parameters():
        if not isinstance(param, DTensor):
            continue
        mesh = param.device_mesh
        for dim, dim_name in enumerate(mesh.mesh_dim_names or ()):
            if dim_name == TENSOR_PARALLEL_DIM and mesh.size(dim) > 1:
                return name, mesh.size(dim)
    return None


def _has_sharded_params(module: nn.Module) -> bool:
    return any(isinstance(p, DTensor) and p.device_mesh.size() > 1 for p in module.parameters())


class Parameters(str, Enum):
    """How a strategy holds the module's parameters on each rank."""

    WHOLE = "whole"
    """Every rank holds every parameter: single device, DDP, DeepSpeed ZeRO stages 1-2."""
    SHARDED = "sharded"
    """Each rank holds a shard, all-gathered inside every forward: FSDP, ModelParallel, ZeRO stage 3."""
    UNKNOWN = "unknown"
    """A strategy this module does not know."""


def strategy_parameters(strategy: Strategy, module: nn.Module | None = None) -> Parameters:
    """How `strategy` holds the parameters; with `module`, sharded (DTensor) parameters left in it
    count as sharded whatever the strategy.

    Example:
        >>> strategy_parameters(DDPStrategy()), strategy_parameters(FSDPStrategy())
        (<Parameters.WHOLE: 'whole'>, <Parameters.SHARDED: 'sharded'>)
    """
    if isinstance(strategy, (ModelParallelStrategy, FSDPStrategy)) or getattr(strategy, "zero_stage_3", False):
        return Parameters.SHARDED
    if module is not None and _has_sharded_params(module):
        return Parameters.SHARDED
    if isinstance(strategy, (SingleDeviceStrategy, DDPStrategy)):  # DDP, DDP-spawn, XLA, DeepSpeed stage 1-2
        return Parameters.WHOLE
    return Parameters.UNKNOWN


def refuse_for_async(strategy: Strategy) -> None:
    """Async evaluation copies whole weights; a strategy that shards parameters has none to copy.

    Raises:
        ValueError: for a strategy whose parameters are sharded (FSDP, ModelParallel, DeepSpeed ZeRO stage 3).
    """
    if strategy_parameters(strategy) is Parameters.SHARDED:
        raise ValueError(
            f"`EvaluationCallback(mode='async')` does not support {type(strategy).__name__}: its parameters are "
            "sharded over the ranks, and the worker needs whole weights to evaluate a snapshot. Use mode='sync' "
            "(every rank runs the same forwards) or an unsharded strategy (ddp)."
        )


def forwards_in_lockstep(strategy: Strategy, module: nn.Module) -> bool:
    """True when every rank must run the same number of forward passes in an eval round.

    Call it after the strategy has applied its parallelism (e.g. in ``on_train_start``: Lightning
    calls ``configure_model`` after the callbacks' ``setup``).

    Args:
        strategy: the Trainer's strategy.
        module: the LightningModule the round evaluates.

    Returns:
        False when every rank holds whole parameters (`strategy_parameters`), True otherwise: an
        unknown strategy gets lockstep too, which is correct whenever each forward runs the same
        collectives, and costs only the padding forwards.

    Raises:
        UnsupportedStrategyError: a parameter is split over a tensor-parallel mesh dimension.

    Example:
        >>> forwards_in_lockstep(DDPStrategy(), nn.Linear(2, 2))
        False
    """
    split = _tensor_parallel_param(module)
    if split is not None:
        name, ranks = split
        raise UnsupportedStrategyError(
            f"EvaluationCallback cannot evaluate a tensor-parallel model: parameter {name!r} is split over the "
            f"{TENSOR_PARALLEL_DIM!r} mesh dimension of {ranks} ranks, which must all see the same batches, and the "
            "eval round deals every rank its own batches. Shard with fully_shard (FSDP2) only, e.g. "
            "ModelParallelStrategy(data_parallel_size=<world size>, tensor_parallel_size=1)"
        )
    kind = strategy_parameters(strategy, module)
    if kind is Parameters.UNKNOWN:
        log.info(
            "strategy %s is unknown to EvaluationCallback: evaluating with every rank's forwards in lockstep",
            type(strategy).__name__,
        )
    return kind is not Parameters.WHOLE
