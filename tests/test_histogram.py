"""The exact statistics of a histogram of integers (metrics/histogram.py) at their boundaries: the
count landing exactly on q·N, a single value, all values equal, nothing counted; and against
numpy's ``inverted_cdf`` on many small histograms, with quantiles that are exact binary fractions."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from areal_lightning.metrics.histogram import histogram_max, histogram_mean, histogram_quantile


def _histogram(values: list[int], bins: int) -> torch.Tensor:
    return torch.bincount(torch.tensor(values), minlength=bins).double()


# Eight values 0 1 1 2 3 3 3 5: at or below 0, 1, 2, 3, 5 lie 1, 3, 4, 7, 8 of them.
EIGHT = _histogram([0, 1, 1, 2, 3, 3, 3, 5], bins=7)


@pytest.mark.parametrize(
    ("q", "expected"),
    [
        (1 / 8, 0.0),  # q·N = 1: the first value alone reaches it
        (3 / 8, 1.0),  # q·N = 3, reached exactly at 1 (one bucket high would be 2)
        (4 / 8, 2.0),  # the median: q·N = 4, reached exactly at 2 (not 3)
        (7 / 8, 3.0),  # q·N = 7, reached exactly at 3 (not 5)
        (1.0, 5.0),  # the largest value
    ],
)
def test_a_count_landing_exactly_on_q_n_gives_the_value_that_reaches_it(q: float, expected: float) -> None:
    assert histogram_quantile(EIGHT, q) == expected


@pytest.mark.parametrize(("q", "expected"), [(3 / 8 + 2**-40, 2.0), (4 / 8 + 2**-40, 3.0), (7 / 8 + 2**-40, 5.0)])
def test_a_count_just_above_q_n_gives_the_next_value(q: float, expected: float) -> None:
    assert histogram_quantile(EIGHT, q) == expected


@pytest.mark.parametrize("q", [2**-50, 0.25, 0.5, 0.95, 1.0])
def test_a_single_value_is_every_quantile_and_the_mean_and_the_max(q: float) -> None:
    single = _histogram([6], bins=9)
    assert histogram_quantile(single, q) == 6.0 == histogram_mean(single) == histogram_max(single)


@pytest.mark.parametrize("q", [2**-50, 0.25, 0.5, 0.95, 1.0])
def test_all_values_equal_give_that_value_at_every_quantile(q: float) -> None:
    same = _histogram([4] * 12, bins=5)  # the value is the last bin
    assert histogram_quantile(same, q) == 4.0 == histogram_mean(same) == histogram_max(same)
    zeros = _histogram([0] * 5, bins=3)  # the value is the first bin
    assert histogram_quantile(zeros, q) == 0.0 == histogram_max(zeros)


def test_nothing_counted_is_nan_and_q_outside_the_interval_is_refused() -> None:
    empty = torch.zeros(4, dtype=torch.float64)
    assert math.isnan(histogram_quantile(empty, 0.5)) and math.isnan(histogram_mean(empty))
    assert math.isnan(histogram_max(empty))
    for q in (0.0, -0.5, 1.5):
        with pytest.raises(ValueError, match=r"must be a number in \(0, 1\], got"):
            histogram_quantile(EIGHT, q)


def test_quantiles_equal_numpys_inverted_cdf_on_small_histograms() -> None:
    rng = np.random.default_rng(45)
    for _ in range(300):
        n = int(rng.integers(1, 17))
        values = rng.integers(0, 6, size=n)
        hist = _histogram(values.tolist(), bins=6)
        for k in range(1, 17):  # k/16: exact in binary, so q·N is computed without rounding
            q = k / 16
            assert histogram_quantile(hist, q) == float(np.quantile(values, q, method="inverted_cdf")), (values, q)
