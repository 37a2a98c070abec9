"""A torchmetrics base whose float64 states stay float64 under any dtype conversion.

Our metrics keep their sums in float64 (exact sums of `metrics.exact`, integer counts, min / max):
a narrower dtype would round them silently (float16 counts stop at 2048, an exact-sum digit needs
up to 35 bits). torchmetrics converts states on ``set_dtype`` and on ``.to(dtype)`` of the metric
or of any module holding it (Lightning's ``16-true`` / ``bf16-true`` precision converts the whole
LightningModule). Here such a conversion moves those states to the new device, if any, and
leaves their dtype alone; other states convert as usual.

Example:
    >>> from areal_lightning.metrics import ExactMean
    >>> m = ExactMean()
    >>> m.update(torch.tensor([2049.0, 1.0], dtype=torch.float64))
    >>> m.set_dtype(torch.float16).total.dtype, m.compute().item()
    (torch.float64, 1025.0)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn
from torchmetrics import Metric
from typing_extensions import override


class Float64StateMetric(Metric):
    """A `Metric` whose float64 states (as declared by ``add_state``) keep float64 whatever dtype the
    metric, or a module holding it, is converted to; they follow device moves."""

    @override
    def _apply(self, fn: Callable[[Tensor], Tensor], exclude_state: Sequence[str] = ()) -> nn.Module:
        kept = [
            key
            for key, default in self._defaults.items()
            if isinstance(default, Tensor) and default.dtype == torch.float64 and key not in exclude_state
        ]
        this = super()._apply(fn, exclude_state=(*exclude_state, *kept))
        assert isinstance(this, Metric)  # Metric._apply returns the metric itself
        defaults: dict[str, Tensor] = this._defaults  # type: ignore[assignment]  # kept keys hold tensors
        for key in kept:
            # Where `fn` would put a float64 tensor of this state: the device only, never the dtype.
            device = fn(torch.zeros((), dtype=torch.float64, device=defaults[key].device)).device
            defaults[key] = defaults[key].to(device=device)
            setattr(this, key, getattr(this, key).to(device=device))
        return this


__all__ = ["Float64StateMetric"]
