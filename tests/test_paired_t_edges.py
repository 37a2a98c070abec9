"""Student's t of the paired change at its edges, against scipy: huge and tiny degrees of freedom,
far tails, and the point where the incomplete beta switches between its two forms."""

from __future__ import annotations

import math

import pytest
from scipy import special, stats

from areal_lightning.metrics.paired import paired_change, t_cdf, t_quantile

T_VALUES = [-1e3, -40.0, -9.0, -3.0, -1.5, -0.2, 0.3, 1.0, 2.5, 7.0, 30.0, 1e3]


def _tail_error(got: float, want: float) -> float:
    """Error relative to the smaller of the two tails: a cdf near 1 is compared by its upper tail."""
    tail = min(want, 1.0 - want)
    return abs(got - want) / tail if tail > 0 else abs(got - want)


@pytest.mark.parametrize("df", [1e6, 1e8, 1e9, 1e12])
def test_t_cdf_is_exact_for_a_million_prompts_and_more(df: float) -> None:
    worst = max(_tail_error(t_cdf(t, df), stats.t.cdf(t, df)) for t in T_VALUES)
    assert worst < 1e-12, f"t_cdf with df={df:g} is {worst:.3g} off scipy"


def test_the_interval_of_a_million_pairs_matches_scipy() -> None:
    n, mean, sd = 2_000_000, 1e-4, 0.3
    change = paired_change(n, n * mean, (n - 1) * sd * sd + n * mean * mean)
    half = stats.t.ppf(0.975, n - 1) * sd / math.sqrt(n)
    assert math.isclose(change.low, mean - half, rel_tol=1e-11)
    assert math.isclose(change.high, mean + half, rel_tol=1e-11)


@pytest.mark.parametrize("df", [0.5, 1.0, 2.0, 3.0, 10.0, 137.0, 2_000.0, 4_999.0, 5_000.0, 20_000.0])
def test_t_cdf_far_tails_match_scipy(df: float) -> None:
    worst = max(_tail_error(t_cdf(t, df), stats.t.cdf(t, df)) for t in T_VALUES)
    assert worst < (1e-12 if df < 1000 else 1e-10), f"t_cdf with df={df:g} is {worst:.3g} off scipy in a tail"


@pytest.mark.parametrize("df", [0.5, 1.0, 4.0, 60.0, 999.0])
@pytest.mark.parametrize("side", [-1.0, 0.0, 1.0])
def test_t_cdf_at_the_switch_between_the_two_forms(df: float, side: float) -> None:
    """``x = df / (df + t^2)`` at (and one step either side of) ``(a + 1) / (a + b + 2)``."""
    a, b = df / 2.0, 0.5
    x = (a + 1.0) / (a + b + 2.0)
    x = math.nextafter(x, 2.0 * side) if side else x
    t = math.sqrt(df * (1.0 - x) / x)
    assert math.isclose(special.betainc(a, b, x), 2.0 * stats.t.sf(t, df), rel_tol=1e-9)
    for value in (t, -t):
        assert _tail_error(t_cdf(value, df), stats.t.cdf(value, df)) < 1e-11


@pytest.mark.parametrize("df", [0.5, 1.0, 3.0, 30.0, 4_999.0, 1e6, 1e10])
@pytest.mark.parametrize("p", [1e-12, 1e-6, 0.6, 0.9, 0.999999, 1.0 - 1e-10])
def test_t_quantile_in_the_tails_matches_scipy(df: float, p: float) -> None:
    want = stats.t.ppf(p, df)
    assert math.isclose(t_quantile(p, df), want, rel_tol=1e-11), (t_quantile(p, df), want)


@pytest.mark.parametrize("df", [0.5, 3.0, 100.0, 4_999.0])
def test_t_cdf_near_zero_moves_with_t(df: float) -> None:
    """Close to ``t = 0``, ``x = df / (df + t^2)`` rounds to 1: ``1 - x`` must come from ``t`` itself,
    or the cdf stays 0.5 for every ``|t|`` below about ``sqrt(df * 1e-16)``, and so does a quantile
    just above 1/2."""
    for t in (-2e-6, -1e-9, 1e-12, 3e-7):
        assert math.isclose(t_cdf(t, df), stats.t.cdf(t, df), rel_tol=1e-15), t
    assert math.isclose(t_quantile(0.5 + 1e-6, df), stats.t.ppf(0.5 + 1e-6, df), rel_tol=1e-9)


@pytest.mark.parametrize("df", [0.5, 3.0, 4_999.0, 1e6])
def test_the_median_is_zero(df: float) -> None:
    assert t_quantile(0.5, df) == 0.0
    assert t_quantile(math.nextafter(0.5, 1.0), df) > 0.0 > t_quantile(math.nextafter(0.5, 0.0), df)


# Points where a small change to the continued fraction, to where `_betainc` switches between its
# two forms, or to Hill's expansion, leaves `t_cdf` several times further from scipy (which is within
# 1e-15 of mpmath at 40 digits at each point); `t_cdf` itself is within the tolerance there.
HARDEST = [
    # the fraction stops once it has converged: all 300 steps give 4.2e-13 (1.4e-13 here)
    (1.7937266491209154, 4421.275198327133, 2.5e-13),
    # it takes 88 steps to converge (97 at most below df 5000): a bound of 30 steps gives 2.2e-11
    (1.7432596104070772, 4999.999, 1e-12),
    # x exactly on the switch point: the other form gives 3.7e-13 (9.2e-15 here)
    (1.7285339495087926, 491.0, 5e-14),
    # just past the switch point: the direct form further on gives 8.5e-13 (4.7e-13 here)
    (1.3188649719819239, 4999.999, 6.5e-13),
    # just before it: the complement form earlier gives 1.0e-10 (3.1e-12 here)
    (2.157197043286552, 3564.990701841319, 1e-11),
    # df = 5000 is Hill's: the fraction there gives 1.4e-11 (5e-16 here)
    (1.6993696584061975, 5000.0, 1e-13),
    # a far tail (1.6e-292): Hill's 24 as 25 gives 4.5e-13 (1.0e-13 here)
    (37.32200409545262, 15777.1997458497, 2e-13),
]


@pytest.mark.parametrize(("t", "df", "tolerance"), HARDEST)
def test_t_cdf_at_its_hardest_points(t: float, df: float, tolerance: float) -> None:
    for value in (t, -t):
        assert _tail_error(t_cdf(value, df), stats.t.cdf(value, df)) < tolerance
