"""AdvantageMetric: statistics of GRPO group-relative advantages and the share of zero-std groups."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from areal_lightning.metrics.checks import _check_rewards_2d
from areal_lightning.metrics.constants import AdvantageStd
from areal_lightning.metrics.exact import add_squares, add_values, mean_float, merge_sums, new_sum, std_float
from areal_lightning.metrics.float64_states import Float64StateMetric
from areal_lightning.metrics.functional import (
    ADVANTAGE_EPS,
    _check_std,
    _group_advantages,
    _zero_std_groups,
)


class AdvantageMetric(Float64StateMetric):
    """Mean, std and mean absolute value of group advantages, and the zero-std share.

    ``update`` takes the raw ``[P, G]`` rewards of ``P`` groups and computes
    :func:`~areal_lightning.metrics.functional.group_advantages` itself. Samples with a NaN
    (missing) reward are left out of "mean", "std" and "abs_mean" (their advantage is a
    placeholder 0). "zero_std_frac" is the share of groups whose finite rewards are all equal:
    they give GRPO no signal, and a rising share is the first sign of collapse. The advantages'
    sums (of values, squares and absolute values) are exact sums (see
    :mod:`~areal_lightning.metrics.exact`) and the group counts whole numbers, so the result is bit
    for bit the same whatever the ranks and updates, as long as each group stays whole in one
    update: "mean", "std" (the population std of all counted advantages) and "abs_mean" are the
    float64 nearest to the exact values over the float64 advantages.

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
        for name in ("adv_sum", "adv_sq_sum", "adv_abs_sum"):
            self.add_state(name, new_sum(), dist_reduce_fx=merge_sums)
        for name in ("num_groups", "num_zero_std_groups"):
            self.add_state(name, torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, rewards: Tensor) -> None:
        """Add ``[P, G]`` rewards of ``P`` groups (NaN marks a missing reward)."""
        rewards = _check_rewards_2d(rewards, "AdvantageMetric.update").detach()
        advantages = _group_advantages(rewards, self.scale, self.std, ADVANTAGE_EPS).to(torch.float64)
        counted = advantages[~torch.isnan(rewards)].to(self.adv_sum.device)
        self.adv_sum = add_values(self.adv_sum, counted)
        self.adv_sq_sum = add_squares(self.adv_sq_sum, counted)
        self.adv_abs_sum = add_values(self.adv_abs_sum, counted.abs())
        self.num_groups += rewards.shape[0]
        self.num_zero_std_groups += _zero_std_groups(rewards).sum().to(self.adv_sum.device)

    def compute(self) -> dict[str, Tensor]:
        """Return ``{"mean", "std", "abs_mean", "zero_std_frac"}``."""
        device = self.adv_sum.device
        stats = [mean_float(self.adv_sum), std_float(self.adv_sum, self.adv_sq_sum), mean_float(self.adv_abs_sum)]
        mean, std, abs_mean = (torch.tensor(value, dtype=torch.float64, device=device) for value in stats)
        frac = torch.where(self.num_groups == 0, math.nan, self.num_zero_std_groups / self.num_groups.clamp_min(1))
        return {"mean": mean, "std": std, "abs_mean": abs_mean, "zero_std_frac": frac}
