"""AdvantageMetric: statistics of GRPO group-relative advantages and the share of zero-std groups."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor
from torchmetrics import Metric

from areal_lightning.metrics.functional import (
    ADVANTAGE_EPS,
    _check_rewards_2d,
    _check_std,
    _group_advantages,
    _mean_std,
    _zero_std_groups,
)
from areal_lightning.metrics.options import AdvantageStd


class AdvantageMetric(Metric):
    """Mean, std and mean absolute value of group advantages, and the zero-std share.

    ``update`` takes the raw ``[P, G]`` rewards of ``P`` groups and computes
    :func:`~areal_lightning.metrics.functional.group_advantages` itself. Samples with a NaN
    (missing) reward are left out of "mean", "std" and "abs_mean" (their advantage is a
    placeholder 0). "zero_std_frac" is the share of groups whose finite rewards are all equal:
    they give GRPO no signal, and a rising share is the first sign of collapse. All states are
    float64 sums, exact under DDP (see :class:`~areal_lightning.metrics.RewardMetric`); the
    reported "std" is the population std of all counted advantages.

    Args:
        scale: divide advantages by the group std (+ ``ADVANTAGE_EPS``), as in GRPO.
        std: which group std divides them, ``"sample"`` (``n - 1``, as TRL and verl) or
            ``"population"`` (``n``); see :func:`~areal_lightning.metrics.group_advantages`.
        kwargs: passed to :class:`torchmetrics.Metric`.

    Raises:
        ValueError: if ``scale`` is not a bool or ``std`` is not one of the two conventions.

    ``compute()`` returns ``{"mean", "std", "abs_mean", "zero_std_frac"}`` (float64 scalars),
    NaN where nothing was counted.

    Example:
        >>> metric = AdvantageMetric(scale=False)
        >>> metric.update(torch.tensor([[1.0, 0.0], [1.0, 1.0]]))
        >>> {key: round(value.item(), 4) for key, value in metric.compute().items()}
        {'mean': 0.0, 'std': 0.3536, 'abs_mean': 0.25, 'zero_std_frac': 0.5}
    """

    is_differentiable = False
    higher_is_better = None
    full_state_update = False

    num_samples: Tensor
    adv_sum: Tensor
    adv_sq_sum: Tensor
    adv_abs_sum: Tensor
    num_groups: Tensor
    num_zero_std_groups: Tensor

    def __init__(self, scale: bool = True, std: AdvantageStd | str = AdvantageStd.SAMPLE, **kwargs: Any) -> None:
        # No compute cache: a cached compute skips the sync, so a rank without updates since its
        # last compute would skip the gathers the other ranks run (wrong values or a hang).
        super().__init__(**{"compute_with_cache": False, **kwargs})
        if not isinstance(scale, bool):
            raise ValueError(f"`AdvantageMetric(scale=...)` must be True or False, got {scale!r}")
        self.scale = scale
        self.std = _check_std(std, "AdvantageMetric")
        for name in ("num_samples", "adv_sum", "adv_sq_sum", "adv_abs_sum", "num_groups", "num_zero_std_groups"):
            self.add_state(name, torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, rewards: Tensor) -> None:
        """Add ``[P, G]`` rewards of ``P`` groups (NaN marks a missing reward)."""
        rewards = _check_rewards_2d(rewards, "AdvantageMetric.update").detach()
        advantages = _group_advantages(rewards, self.scale, self.std, ADVANTAGE_EPS).to(torch.float64)
        counted = advantages[~torch.isnan(rewards)].to(self.adv_sum.device)
        self.num_samples += counted.numel()
        self.adv_sum += counted.sum()
        self.adv_sq_sum += (counted * counted).sum()
        self.adv_abs_sum += counted.abs().sum()
        self.num_groups += rewards.shape[0]
        self.num_zero_std_groups += _zero_std_groups(rewards).sum().to(self.adv_sum.device)

    def compute(self) -> dict[str, Tensor]:
        """Return ``{"mean", "std", "abs_mean", "zero_std_frac"}``."""
        mean, std = _mean_std(self.num_samples, self.adv_sum, self.adv_sq_sum)
        nan = torch.full_like(mean, math.nan)
        abs_mean = torch.where(self.num_samples == 0, nan, self.adv_abs_sum / self.num_samples.clamp_min(1))
        frac = torch.where(self.num_groups == 0, nan, self.num_zero_std_groups / self.num_groups.clamp_min(1))
        return {"mean": mean, "std": std, "abs_mean": abs_mean, "zero_std_frac": frac}
