"""Exact statistics of integer values kept as a histogram of counts (bin ``i`` counts the value ``i``).

A histogram of integers sums over ranks without loss, so its mean, quantiles and maximum are the
same whatever the number of ranks: no sketch, no estimate. Counts are whole numbers in float64
(exact up to 2**53).
"""

from __future__ import annotations

import math
from fractions import Fraction

from torch import Tensor


def _counts(histogram: Tensor) -> list[int]:
    return [int(c) for c in histogram.detach().flatten().tolist()]


def histogram_mean(histogram: Tensor) -> float:
    """The float64 nearest to the exact mean of the counted values; NaN when nothing was counted.

    Example:
        >>> import torch
        >>> histogram_mean(torch.tensor([0.0, 2.0, 1.0]))  # values 1, 1, 2
        1.3333333333333333
    """
    counts = _counts(histogram)
    total = sum(counts)
    return sum(i * c for i, c in enumerate(counts)) / total if total else math.nan


def histogram_quantile(histogram: Tensor, q: float) -> float:
    """The q-quantile of the counted values by the inverted distribution function: the smallest
    value ``v`` with at least ``q`` of the values at or below it (numpy's ``method="inverted_cdf"``);
    always one of the values. NaN when nothing was counted.

    Args:
        histogram: 1-D counts, bin ``i`` for the value ``i``.
        q: a number in (0, 1], compared exactly (0.95 is the binary float nearest to it).

    Raises:
        ValueError: for a ``q`` outside (0, 1].

    Example:
        >>> import torch
        >>> hist = torch.tensor([0.0, 5.0, 3.0, 0.0, 2.0])  # five 1s, three 2s, two 4s
        >>> histogram_quantile(hist, 0.5), histogram_quantile(hist, 0.95), histogram_quantile(hist, 1.0)
        (1.0, 4.0, 4.0)
    """
    if not 0 < q <= 1:
        raise ValueError(f"`histogram_quantile(q=...)` must be a number in (0, 1], got {q!r}")
    counts = _counts(histogram)
    need = Fraction(q) * sum(counts)
    if need == 0:
        return math.nan
    seen = 0
    for value, count in enumerate(counts):
        seen += count
        if seen >= need:
            return float(value)
    raise AssertionError("unreachable: the last bin reaches the total")


def histogram_max(histogram: Tensor) -> float:
    """The largest counted value; NaN when nothing was counted.

    Example:
        >>> import torch
        >>> histogram_max(torch.tensor([1.0, 0.0, 3.0, 0.0]))
        2.0
    """
    counts = _counts(histogram)
    return float(max((i for i, c in enumerate(counts) if c), default=math.nan))
