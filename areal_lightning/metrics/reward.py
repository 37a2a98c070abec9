"""RewardMetric: mean, std, min and max of per-sample rewards, the same whatever the ranks.

The mean and std come from the exact sums of the rewards and of their squares
(:mod:`areal_lightning.metrics.exact`): an integer state, so the sum over ranks and updates is the
same whatever the split, rounded once at the end. The variance ``Q / n - (S / n)^2`` is computed
exactly too; in float64 it cancels catastrophically once the rewards' offset dwarfs their spread
(for rewards ``1e8 + U(0, 1)`` it gives a std of 0.0 instead of 0.29).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from areal_lightning.metrics.checks import NanStrategy, _apply_nan_strategy, _check_nan_strategy
from areal_lightning.metrics.exact import add_squares, add_values, mean_float, merge_sums, new_sum, std_float, sum_count
from areal_lightning.metrics.float64_states import Float64StateMetric


class RewardMetric(Float64StateMetric):
    """Mean, population std, min and max of per-sample rewards.

    States: the exact sums of the rewards and of their squares (reduced over ranks by
    :func:`~areal_lightning.metrics.exact.merge_sums`) and a running min / max
    (``dist_reduce_fx`` "min" / "max"), so the result on several ranks is bit for bit the
    single-process result over the union of their data: "mean" is the float64 nearest to the
    exact mean of the float64 rewards, "std" the float64 nearest to their exact population std.
    Every rank runs the same collectives, also a rank that saw no update (torchmetrics then warns
    "compute ... called before the update" on local rank 0 only; the synced result is still right).
    ``compute_with_cache`` defaults to False so that every ``compute()`` syncs on every rank:
    torchmetrics' cache would let a rank without updates since its last compute skip the gathers
    that the other ranks run. An infinite reward makes the mean infinite and the std NaN.

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

    reward_sum: Tensor
    reward_sq_sum: Tensor
    reward_min: Tensor
    reward_max: Tensor

    def __init__(self, nan_strategy: NanStrategy = "error", **kwargs: Any) -> None:
        # No compute cache: a cached compute skips the sync, so a rank without updates since its
        # last compute would skip the gathers the other ranks run (wrong values or a hang).
        super().__init__(**{"compute_with_cache": False, **kwargs})
        self.nan_strategy = _check_nan_strategy(nan_strategy, "RewardMetric")
        self.add_state("reward_sum", new_sum(), dist_reduce_fx=merge_sums)
        self.add_state("reward_sq_sum", new_sum(), dist_reduce_fx=merge_sums)
        self.add_state("reward_min", torch.tensor(math.inf, dtype=torch.float64), dist_reduce_fx="min")
        self.add_state("reward_max", torch.tensor(-math.inf, dtype=torch.float64), dist_reduce_fx="max")

    def update(self, rewards: Tensor) -> None:
        """Add per-sample rewards (any shape, flattened; bool / integer rewards are cast to float64)."""
        values = _apply_nan_strategy(rewards, self.nan_strategy, "RewardMetric.update")
        values = values.to(device=self.reward_sum.device, dtype=torch.float64)
        if values.numel() == 0:
            return
        self.reward_sum = add_values(self.reward_sum, values)
        self.reward_sq_sum = add_squares(self.reward_sq_sum, values)
        self.reward_min = torch.minimum(self.reward_min, values.min())
        self.reward_max = torch.maximum(self.reward_max, values.max())

    def compute(self) -> dict[str, Tensor]:
        """Return ``{"mean", "std", "min", "max"}``; NaN for each when no sample was seen."""
        result = {
            "mean": mean_float(self.reward_sum),
            "std": std_float(self.reward_sum, self.reward_sq_sum),
            "min": self.reward_min.item(),
            "max": self.reward_max.item(),
        }
        if sum_count(self.reward_sum) == 0:  # min / max hold their identities +-inf
            result = dict.fromkeys(result, math.nan)
        device = self.reward_sum.device
        return {key: torch.tensor(value, dtype=torch.float64, device=device) for key, value in result.items()}
