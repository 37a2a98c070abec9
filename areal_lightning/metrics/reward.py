"""RewardMetric: mean, std, min and max of per-sample rewards, exact under DDP.

The mean and std come from (count, mean, M2) moments merged with Chan et al.'s parallel formula,
not from sums of squares: ``E[x^2] - E[x]^2`` cancels catastrophically once the rewards' offset
dwarfs their spread (for rewards ``1e8 + U(0, 1)`` it gives a std of 0.0 instead of 0.29).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor
from torchmetrics import Metric

from areal_lightning.metrics.functional import NanStrategy, _apply_nan_strategy, _check_nan_strategy


def _moments(values: Tensor) -> Tensor:
    """``[count, mean, M2]`` (float64) of a non-empty 1-D tensor, ``M2 = sum((x - mean)^2)``."""
    mean = values.mean()
    centered = values - mean
    return torch.stack([mean.new_tensor(values.numel()), mean, (centered * centered).sum()])


def _merge_moments(parts: Tensor) -> Tensor:
    """Merge ``[k, 3]`` rows of ``[count, mean, M2]`` into one row (Chan, Golub and LeVeque 1979).

    This is the ``dist_reduce_fx`` of :class:`RewardMetric`'s state: torchmetrics gives it the
    states of all ranks stacked (or, in ``forward``, the accumulated and the batch state). A row
    with count 0 (a rank without update) leaves the others unchanged.

    Example:
        >>> _merge_moments(torch.tensor([[2.0, 0.5, 0.5], [0.0, 0.0, 0.0], [1.0, 2.0, 0.0]]))
        tensor([3., 1., 2.])
    """
    count, mean, m2 = parts[0, 0], parts[0, 1], parts[0, 2]
    for other_count, other_mean, other_m2 in parts[1:]:
        total = count + other_count
        # Each weight is 0 when its side is empty, also when both are (no 0 / 0).
        weight = other_count / total.clamp_min(1)
        delta = other_mean - mean
        mean = mean + delta * weight
        m2 = m2 + other_m2 + delta * delta * count * weight
        count = total
    return torch.stack([count, mean, m2])


class RewardMetric(Metric):
    """Mean, population std, min and max of per-sample rewards.

    States: one float64 ``[count, mean, M2]`` tensor reduced over ranks by :func:`_merge_moments`,
    and a running min / max (``dist_reduce_fx`` "min" / "max"), so the result on several ranks
    equals the single-process result over the union of their data; every rank runs the same
    collectives, also a rank that saw no update (torchmetrics then warns "compute ... called
    before the update" on local rank 0 only; the synced result is still right).
    ``compute_with_cache`` defaults to False so that every ``compute()`` syncs on every rank:
    torchmetrics' cache would let a rank without updates since its last compute skip the gathers
    that the other ranks run. The std's relative error is about ``1e-16 * |mean| / std``; an
    infinite reward makes the mean infinite and the std NaN.

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

    moments: Tensor
    reward_min: Tensor
    reward_max: Tensor

    def __init__(self, nan_strategy: NanStrategy = "error", **kwargs: Any) -> None:
        # No compute cache: a cached compute skips the sync, so a rank without updates since its
        # last compute would skip the gathers the other ranks run (wrong values or a hang).
        super().__init__(**{"compute_with_cache": False, **kwargs})
        self.nan_strategy = _check_nan_strategy(nan_strategy, "RewardMetric")
        self.add_state("moments", torch.zeros(3, dtype=torch.float64), dist_reduce_fx=_merge_moments)
        self.add_state("reward_min", torch.tensor(math.inf, dtype=torch.float64), dist_reduce_fx="min")
        self.add_state("reward_max", torch.tensor(-math.inf, dtype=torch.float64), dist_reduce_fx="max")

    def update(self, rewards: Tensor) -> None:
        """Add per-sample rewards (any shape, flattened; bool / integer rewards are cast to float64)."""
        values = _apply_nan_strategy(rewards, self.nan_strategy, "RewardMetric.update")
        values = values.to(device=self.moments.device, dtype=torch.float64)
        if values.numel() == 0:
            return
        self.moments = _merge_moments(torch.stack([self.moments, _moments(values)]))
        self.reward_min = torch.minimum(self.reward_min, values.min())
        self.reward_max = torch.maximum(self.reward_max, values.max())

    def compute(self) -> dict[str, Tensor]:
        """Return ``{"mean", "std", "min", "max"}``; NaN for each when no sample was seen."""
        count, mean, m2 = self.moments
        empty = count == 0
        nan = torch.full_like(mean, math.nan)
        return {
            "mean": torch.where(empty, nan, mean),
            "std": torch.where(empty, nan, (m2 / count.clamp_min(1)).sqrt()),
            "min": torch.where(empty, nan, self.reward_min),
            "max": torch.where(empty, nan, self.reward_max),
        }
