"""RewardMetric: mean, std, min and max of per-sample rewards, exact under DDP."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor
from torchmetrics import Metric

from areal_lightning.metrics.functional import NanStrategy, _apply_nan_strategy, _check_nan_strategy, _mean_std


class RewardMetric(Metric):
    """Mean, population std, min and max of per-sample rewards.

    States are float64 sums (count, sum, sum of squares) and a running min / max, each with its
    ``dist_reduce_fx``, so the result on several ranks equals the single-process result over the
    union of their data; every rank runs the same collectives, also a rank that saw no update
    (torchmetrics then warns "compute ... called before the update" on local rank 0 only; the
    synced result is still right). ``compute_with_cache`` defaults to False so that every
    ``compute()`` syncs on every rank: torchmetrics' cache would let a rank without updates since
    its last compute skip the gathers that the other ranks run. The std comes from
    ``E[x^2] - E[x]^2`` in float64, accurate while ``|mean| / std`` stays far below ``1e7``
    (true for rewards in [0, 1]); an infinite reward makes the mean infinite and the std NaN.

    Args:
        nan_strategy: what a NaN reward means, in torchmetrics' words: ``"error"`` raises a
            ``ValueError`` naming how many NaN were seen, ``"ignore"`` drops them, ``"warn"`` drops
            them with a warning, ``"disable"`` skips the check (a NaN then makes every result
            NaN), a float replaces them (``0.0``: a missing reward counts as a failure).
        kwargs: passed to :class:`torchmetrics.Metric` (``dist_sync_fn``, ``process_group``, ...).

    Raises:
        ValueError: if ``nan_strategy`` is neither one of those names nor a finite float.

    ``compute()`` returns ``{"mean", "std", "min", "max"}`` (float64 scalars); with no sample at
    all (nothing updated yet, or only ignored NaN) each is NaN.

    Example:
        >>> metric = RewardMetric()
        >>> metric.update(torch.tensor([1.0, 0.0]))
        >>> metric.update(torch.tensor([[0.5]]))
        >>> {key: round(value.item(), 4) for key, value in metric.compute().items()}
        {'mean': 0.5, 'std': 0.4082, 'min': 0.0, 'max': 1.0}
    """

    is_differentiable = False
    higher_is_better = True
    full_state_update = False

    num_samples: Tensor
    reward_sum: Tensor
    reward_sq_sum: Tensor
    reward_min: Tensor
    reward_max: Tensor

    def __init__(self, nan_strategy: NanStrategy = "error", **kwargs: Any) -> None:
        # No compute cache: a cached compute skips the sync, so a rank without updates since its
        # last compute would skip the gathers the other ranks run (wrong values or a hang).
        super().__init__(**{"compute_with_cache": False, **kwargs})
        self.nan_strategy = _check_nan_strategy(nan_strategy, "RewardMetric")
        zero = torch.zeros((), dtype=torch.float64)
        self.add_state("num_samples", zero.clone(), dist_reduce_fx="sum")
        self.add_state("reward_sum", zero.clone(), dist_reduce_fx="sum")
        self.add_state("reward_sq_sum", zero.clone(), dist_reduce_fx="sum")
        self.add_state("reward_min", torch.tensor(math.inf, dtype=torch.float64), dist_reduce_fx="min")
        self.add_state("reward_max", torch.tensor(-math.inf, dtype=torch.float64), dist_reduce_fx="max")

    def update(self, rewards: Tensor) -> None:
        """Add per-sample rewards (any shape, flattened; bool / integer rewards are cast to float64)."""
        values = _apply_nan_strategy(rewards, self.nan_strategy, "RewardMetric.update")
        values = values.to(device=self.reward_sum.device, dtype=torch.float64)
        if values.numel() == 0:
            return
        self.num_samples += values.numel()
        self.reward_sum += values.sum()
        self.reward_sq_sum += (values * values).sum()
        self.reward_min = torch.minimum(self.reward_min, values.min())
        self.reward_max = torch.maximum(self.reward_max, values.max())

    def compute(self) -> dict[str, Tensor]:
        """Return ``{"mean", "std", "min", "max"}``; NaN for each when no sample was seen."""
        mean, std = _mean_std(self.num_samples, self.reward_sum, self.reward_sq_sum)
        empty = self.num_samples == 0
        nan = torch.full_like(mean, math.nan)
        return {
            "mean": mean,
            "std": std,
            "min": torch.where(empty, nan, self.reward_min),
            "max": torch.where(empty, nan, self.reward_max),
        }
