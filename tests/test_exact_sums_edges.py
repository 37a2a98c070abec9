"""Edges of the exact sums a user can reach: sums past float64's range, NaN and infinities in a
plain sum, the std of equal values, correctly rounded stds against a high-precision reference, and
merging stacked states (a metric that keeps two sums in one state)."""

from __future__ import annotations

import math
from decimal import Decimal, getcontext
from fractions import Fraction

import numpy as np
import pytest
import torch

from areal_lightning.metrics.exact import add_squares, add_values, merge_sums, new_sum, std_float, sum_float


def _sum(values: list[float]) -> torch.Tensor:
    return add_values(new_sum(), torch.tensor(values, dtype=torch.float64))


def test_a_sum_past_float64s_range_is_an_infinity_of_its_sign() -> None:
    big = 1.7e308
    assert sum_float(_sum([big, big])) == math.inf
    assert sum_float(_sum([-big, -big])) == -math.inf
    assert sum_float(_sum([big, big, -big])) == big  # exact in between: no overflow on the way


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ([1.0, math.nan], math.nan),
        ([1.0, math.inf], math.inf),
        ([-math.inf, 2.0], -math.inf),
        ([math.inf, -math.inf], math.nan),
    ],
)
def test_a_plain_sum_with_non_finite_values_is_the_ieee_sum(values: list[float], expected: float) -> None:
    got = sum_float(_sum(values))
    assert (math.isnan(got) and math.isnan(expected)) or got == expected


def _std(values: list[float]) -> float:
    x = torch.tensor(values, dtype=torch.float64)
    return std_float(add_values(new_sum(), x), add_squares(new_sum(), x))


def test_equal_values_have_a_std_of_exactly_zero() -> None:
    assert _std([3.0, 3.0, 3.0]) == 0.0 and _std([0.1]) == 0.0


def _reference_std(values: list[float]) -> float:
    exact = [Fraction(v) for v in values]
    n = len(exact)
    mean = sum(exact) / n
    var = sum((v - mean) ** 2 for v in exact) / n
    getcontext().prec = 120
    return float((Decimal(var.numerator) / Decimal(var.denominator)).sqrt())


def test_the_std_is_the_correctly_rounded_population_std() -> None:
    rng = np.random.default_rng(7)
    for _ in range(300):
        n = int(rng.integers(2, 6))
        values = (rng.integers(-1000, 1000, n) * 2.0 ** rng.integers(-8, 8, n)).tolist()
        assert _std(values) == _reference_std(values), values


def test_stacked_states_merge_row_by_row() -> None:
    a = torch.stack([_sum([1.0, 2.0]), _sum([10.0])])
    b = torch.stack([_sum([0.5]), _sum([-4.0, 1e-3])])
    merged = merge_sums(torch.stack([a, b]))
    assert merged.shape == a.shape
    assert [sum_float(row) for row in merged] == [3.5, 6.001]


def test_the_exact_fraction_of_a_sum_with_non_finite_values_is_the_ieee_sum() -> None:
    from areal_lightning.metrics.exact import sum_fraction

    assert math.isnan(sum_fraction(_sum([1.0, math.nan]))) and sum_fraction(_sum([1.0, math.inf])) == math.inf
    assert sum_fraction(_sum([0.5, 0.25])) == Fraction(3, 4)


def test_integers_and_half_precision_values_are_summed_exactly() -> None:
    """Counts beyond float32's 24 bits and float16 rewards: converted to float64 first, exactly."""
    big = 2**24 + 1  # not a float32
    assert sum_float(add_values(new_sum(), torch.tensor([big, 2], dtype=torch.int64))) == big + 2
    half = torch.tensor([0.5, 0.25, 1000.0], dtype=torch.float16)
    assert sum_float(add_values(new_sum(), half)) == 1000.75
    assert sum_float(add_squares(new_sum(), half)) == 0.25 + 0.0625 + 1e6


def test_the_square_of_either_infinity_is_plus_infinity() -> None:
    for values in ([-math.inf], [math.inf, -math.inf], [-math.inf, 2.0]):
        assert sum_float(add_squares(new_sum(), torch.tensor(values, dtype=torch.float64))) == math.inf
