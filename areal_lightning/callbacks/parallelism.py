"""Does the module's forward run collectives under this strategy? The answer decides whether the
eval round keeps every rank's forwards in lockstep (see `eval_round.run_round(lockstep=...)`).

Sharded parameters (FSDP2 `fully_shard` under `ModelParallelStrategy`, Lightning's `FSDPStrategy`,
DeepSpeed ZeRO stage 3) are all-gathered inside every forward: a rank that runs one forward more
than another pairs that all-gather with whatever collective the other rank runs next (the round's
own gather), which hangs, crashes or returns wrong numbers. Tensor parallelism is refused: its ranks
must all see the same batch, and the round deals every rank different batches.
"""

from __future__ import annotations

import logging

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


def forwards_in_lockstep(strategy: Strategy, module: nn.Module) -> bool:
    """True when every rank must run the same number of forward passes in an eval round.

    Call it after the strategy has applied its parallelism (e.g. in ``on_train_start``: Lightning
    calls ``configure_model`` after the callbacks' ``setup``).

    Args:
        strategy: the Trainer's strategy.
        module: the LightningModule the round evaluates.

    Returns:
        True for `ModelParallelStrategy`, `FSDPStrategy`, DeepSpeed ZeRO stage 3 and any strategy
        that left sharded (DTensor) parameters in the module; False for single-device and DDP-like
        strategies (whole parameters on every rank). Another strategy gets True: lockstep is correct
        whenever each forward runs the same collectives, and costs only the padding forwards.

    Raises:
        UnsupportedStrategyError: a parameter is split over a tensor-parallel mesh dimension.

    Example:
        >>> from lightning.pytorch.strategies import DDPStrategy
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
    if isinstance(strategy, (ModelParallelStrategy, FSDPStrategy)) or getattr(strategy, "zero_stage_3", False):
        return True
    if _has_sharded_params(module):
        return True
    if isinstance(strategy, (SingleDeviceStrategy, DDPStrategy)):  # DDP, DDP-spawn, XLA, DeepSpeed stage 1-2
        return False
    log.info(
        "strategy %s is unknown to EvaluationCallback: evaluating with every rank's forwards in lockstep",
        type(strategy).__name__,
    )
    return True
