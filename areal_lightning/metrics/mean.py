"""ExactMean: a torchmetrics mean whose value does not depend on how the values were split.

torchmetrics' ``MeanMetric`` keeps a float sum, whose last bits depend on the order of the
additions, so the same values on 1 or 2 ranks give means a few ulps apart. This one keeps the
exact sum (:mod:`areal_lightning.metrics.exact`) and rounds once.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from areal_lightning.metrics.exact import add_values, mean_float, merge_sums, new_sum
from areal_lightning.metrics.float64_states import Float64StateMetric


class ExactMean(Float64StateMetric):
    """Mean of float64 values: the float64 nearest to their exact mean, whatever the ranks and updates.

    NaN and infinite values are kept (torchmetrics' ``nan_strategy="disable"``): the mean is
    then what IEEE arithmetic gives (NaN, or an infinity). ``compute_with_cache`` defaults to
    False so that every ``compute()`` syncs on every rank.

    ``compute()`` returns a float64 scalar, NaN before any value.

    Example:
        >>> metric = ExactMean()
        >>> metric.update(torch.tensor([0.1, 0.2], dtype=torch.float64))
        >>> metric.update(torch.tensor(0.3, dtype=torch.float64))
        >>> metric.compute()
        tensor(0.2000, dtype=torch.float64)
    """

    is_differentiable = False
    higher_is_better: bool | None = None
    full_state_update = False

    total: Tensor

    def __init__(self, **kwargs: Any) -> None:
        # No compute cache: a cached compute skips the sync, so a rank without updates since its
        # last compute would skip the gathers the other ranks run (wrong values or a hang).
        super().__init__(**{"compute_with_cache": False, **kwargs})
        self.add_state("total", new_sum(), dist_reduce_fx=merge_sums)

    def update(self, values: Tensor) -> None:
        """Add ``values`` (any shape, flattened, converted to float64)."""
        self.total = add_values(self.total, torch.as_tensor(values))

    def compute(self) -> Tensor:
        """Return the mean, a float64 scalar; NaN before any value."""
        return torch.tensor(mean_float(self.total), dtype=torch.float64, device=self.total.device)
