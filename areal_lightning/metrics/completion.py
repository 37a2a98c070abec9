"""What the completions of a round look like: their length, how they ended, how sure the policy was.

Three thin metrics, each exact under DDP (integer counts and exact sums, reduced by summing):

- :class:`CompletionLength`: length in tokens, from a histogram of integer counts (mean, p50, p95,
  max; the quantiles are exact values, not estimates);
- :class:`Share`: the share of completions with a property (truncated, ended by a stop string,
  no final answer);
- :class:`TokenMean`: a per-token mean (log-probability, entropy) over every generated token.

A custom ``evaluate_fn`` creates them with ``ctx.metric(...)`` as the default evaluation does
(``completion/length``, ``completion/truncated``, ... in ``rl/completion_stats.py``).
"""

from __future__ import annotations

import numbers
from typing import Any

import torch
from torch import Tensor

from areal_lightning.errors import ArgumentError
from areal_lightning.metrics.checks import _check_binary
from areal_lightning.metrics.exact import add_values, merge_sums, new_sum, sum_over
from areal_lightning.metrics.float64_states import Float64StateMetric
from areal_lightning.metrics.histogram import histogram_max, histogram_mean, histogram_quantile

LENGTH_QUANTILES = {"p50": 0.5, "p95": 0.95}
"""The quantiles `CompletionLength` reports, by key."""


def _as_scalar(value: float, like: Tensor) -> Tensor:
    return torch.tensor(value, dtype=torch.float64, device=like.device)


class CompletionLength(Float64StateMetric):
    """Completion length in tokens: ``{"mean", "p50", "p95", "max"}``, exact on any number of ranks.

    The state is a histogram of lengths ``0 .. max_length`` (float64 counts, summed over ranks), so
    the quantiles are computed from every length, not estimated: ``p50`` and ``p95`` are the
    smallest lengths with at least 50% and 95% of the completions at or below them (numpy's
    ``method="inverted_cdf"``).

    Args:
        max_length: the longest possible completion (``max_new_tokens``).
        kwargs: passed to :class:`torchmetrics.Metric`.

    Raises:
        ArgumentError: for a ``max_length`` that is not a positive integer.

    ``compute()`` returns float64 scalars, NaN before any completion.

    Example:
        >>> metric = CompletionLength(max_length=8)
        >>> metric.update(torch.tensor([3, 3, 4, 8]))
        >>> {key: value.item() for key, value in metric.compute().items()}
        {'mean': 4.5, 'p50': 3.0, 'p95': 8.0, 'max': 8.0}
    """

    is_differentiable = False
    higher_is_better: bool | None = None
    full_state_update = False

    histogram: Tensor
    max_length: int

    def __init__(self, max_length: int, **kwargs: Any) -> None:
        # No compute cache: a rank without updates since its last compute would skip the gathers.
        super().__init__(**{"compute_with_cache": False, **kwargs})
        if isinstance(max_length, bool) or not isinstance(max_length, numbers.Integral) or max_length < 1:
            raise ArgumentError("CompletionLength", "max_length", max_length, "a positive integer (max_new_tokens)")
        self.max_length = int(max_length)
        self.add_state("histogram", torch.zeros(self.max_length + 1, dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, lengths: Tensor) -> None:
        """Add the lengths (any shape of integers in ``[0, max_length]``) of some completions.

        Raises:
            ValueError: for a length that is not a whole number in ``[0, max_length]``.
        """
        lengths = torch.as_tensor(lengths).detach().flatten()
        if lengths.dtype == torch.bool or lengths.is_complex():
            raise ValueError(f"`CompletionLength.update(lengths=...)` must hold integers, got dtype {lengths.dtype}")
        whole = (
            lengths == lengths.floor() if lengths.is_floating_point() else torch.ones_like(lengths, dtype=torch.bool)
        )
        bad = (lengths < 0) | (lengths > self.max_length) | ~whole
        if bool(bad.any()):
            raise ValueError(
                f"`CompletionLength.update(lengths=...)` must hold whole numbers in [0, max_length={self.max_length}], "
                f"got {lengths[bad][0].item()!r}"
            )
        counts = torch.bincount(lengths.long().to(self.histogram.device), minlength=self.max_length + 1)
        self.histogram = self.histogram + counts.to(torch.float64)

    def compute(self) -> dict[str, Tensor]:
        """Mean, quantiles and maximum, float64 scalars."""
        out = {"mean": _as_scalar(histogram_mean(self.histogram), self.histogram)}
        for key, q in LENGTH_QUANTILES.items():
            out[key] = _as_scalar(histogram_quantile(self.histogram, q), self.histogram)
        out["max"] = _as_scalar(histogram_max(self.histogram), self.histogram)
        return out


class Share(Float64StateMetric):
    """The share of items (completions) for which a flag holds: flagged / all, exact under DDP.

    ``compute()`` returns a float64 scalar, NaN before any item.

    Example:
        >>> metric = Share()
        >>> metric.update(torch.tensor([True, False, False]))
        >>> metric.update(torch.tensor([1, 0]))
        >>> metric.compute()
        tensor(0.4000, dtype=torch.float64)
    """

    is_differentiable = False
    higher_is_better: bool | None = None
    full_state_update = False

    flagged: Tensor
    total: Tensor

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**{"compute_with_cache": False, **kwargs})
        self.add_state("flagged", torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("total", torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, flags: Tensor) -> None:
        """Add items: one bool or 0/1 flag each (any shape).

        Raises:
            ValueError: for a flag that is neither a bool nor 0 or 1.
        """
        flags = _check_binary(torch.as_tensor(flags).detach().flatten()[None], "flags", "Share.update")
        self.flagged = self.flagged + flags.sum().to(self.flagged)
        self.total = self.total + flags.numel()

    def compute(self) -> Tensor:
        """flagged / all, a float64 scalar; NaN before any item."""
        flagged, total = int(self.flagged.item()), int(self.total.item())
        return _as_scalar(flagged / total if total else float("nan"), self.total)


class TokenMean(Float64StateMetric):
    """The mean of a per-token value (log-probability, entropy) over all tokens given, exact under DDP:
    the float64 nearest to the exact sum of the values over their number.

    ``compute()`` returns a float64 scalar, NaN before any token (a policy that gives no scores).

    Example:
        >>> metric = TokenMean()
        >>> values = torch.tensor([[-0.5, -1.5, 0.0], [-1.0, 0.0, 0.0]])
        >>> metric.update(values, mask=torch.tensor([[True, True, False], [True, False, False]]))
        >>> metric.compute()
        tensor(-1., dtype=torch.float64)
    """

    is_differentiable = False
    higher_is_better: bool | None = None
    full_state_update = False

    values: Tensor
    tokens: Tensor

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**{"compute_with_cache": False, **kwargs})
        self.add_state("values", new_sum(), dist_reduce_fx=merge_sums)
        self.add_state("tokens", torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, values: Tensor, mask: Tensor | None = None) -> None:
        """Add per-token `values` (any shape); `mask` (same shape, bool) selects the tokens that count.

        Raises:
            ValueError: for a mask whose shape is not the values'.
        """
        values = torch.as_tensor(values).detach()
        if mask is not None:
            mask = torch.as_tensor(mask, device=values.device)
            if mask.shape != values.shape:
                raise ValueError(
                    f"`TokenMean.update(mask=...)` must have the shape of values {tuple(values.shape)}, "
                    f"got {tuple(mask.shape)}"
                )
            values = values[mask.bool()]
        self.values = add_values(self.values, values)
        self.tokens = self.tokens + values.numel()

    def compute(self) -> Tensor:
        """The per-token mean, a float64 scalar; NaN before any token."""
        return _as_scalar(sum_over(self.values, int(self.tokens.item())), self.tokens)
