"""areal_lightning.metrics.functional against independent plain-Python / NumPy references.

The ``ref_*`` functions below are the references; the class and DDP tests import them too.
"""

from __future__ import annotations

import inspect
import math
import re
import statistics
from collections import Counter
from fractions import Fraction

import numpy as np
import pytest
import torch

import areal_lightning.metrics as metrics_pkg
from areal_lightning.metrics import (
    ADVANTAGE_EPS,
    AdvantageStd,
    group_advantages,
    maj_at_k,
    maj_at_k_per_prompt,
    mean_at_n,
    pass_at_k,
    pass_at_k_per_prompt,
    wilson_interval,
    zero_std_groups,
)

NAN = float("nan")


# ----------------------------------------------------------------------------- references
def ref_group_advantages(
    rewards: list[list[float]], scale: bool, std: str = "sample", eps: float = ADVANTAGE_EPS
) -> list[list[float]]:
    out = []
    for row in rewards:
        finite = [r for r in row if not math.isnan(r)]
        if len(set(finite)) <= 1:
            out.append([0.0] * len(row))
            continue
        mean = sum(finite) / len(finite)
        spread = statistics.stdev(finite) if std == "sample" else statistics.pstdev(finite)
        div = spread + eps if scale else 1.0
        out.append([0.0 if math.isnan(r) else (r - mean) / div for r in row])
    return out


def ref_zero_std(rewards: list[list[float]]) -> list[bool]:
    return [len({r for r in row if not math.isnan(r)}) <= 1 for row in rewards]


def ref_pass_at_k(correct: list[list[int]], k: int) -> list[float]:
    return [1.0 - math.comb(len(row) - sum(row), k) / math.comb(len(row), k) for row in correct]


def ref_maj_at_k(ids: list[list[int]], correct: list[list[int]], k: int) -> list[float]:
    out = []
    for row_ids, row_ok in zip(ids, correct, strict=True):
        votes = Counter(a for a in row_ids[:k] if a != -1)
        if not votes:
            out.append(0.0)
            continue
        top = max(votes.values())
        winner = next(a for a in row_ids[:k] if votes.get(a) == top)  # first to appear among the tied
        out.append(float(any(ok for a, ok in zip(row_ids[:k], row_ok[:k], strict=True) if a == winner)))
    return out


def ref_wilson(s: float, t: float, confidence: float = 0.95, trials: float | None = None) -> tuple[float, float]:
    """Wilson bounds of the share ``s / t`` measured on ``trials`` independent trials (default ``t``)."""
    if t == 0:
        return 0.0, 1.0
    z = statistics.NormalDist().inv_cdf(0.5 + confidence / 2)
    p, n = s / t, t if trials is None else trials
    center = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    low, high = max(0.0, center - half), min(1.0, center + half)
    return 0.0 if s == 0 else low, 1.0 if s == t else high


def random_rewards(rng: np.random.Generator, p: int, g: int, nan_rate: float = 0.15) -> np.ndarray:
    # Few distinct values so that zero-std groups happen often.
    r = rng.choice([0.0, 0.25, 0.5, 0.8, 0.9, 1.0], size=(p, g))
    r[rng.random((p, g)) < nan_rate] = np.nan
    return r


# ----------------------------------------------------------------------------- group advantages
def test_group_advantages_hand_made() -> None:
    rewards = torch.tensor([[1.0, 0.0], [1.0, 1.0], [0.0, 1.0]])
    assert group_advantages(rewards, scale=False).tolist() == [[0.5, -0.5], [0.0, 0.0], [-0.5, 0.5]]
    one_right = torch.tensor([[1.0, 0.0, 0.0, 0.0]], dtype=torch.float64)  # mean 1/4
    # Sample std (TRL, verl): sqrt((9/16 + 3/16) / 3) = 1/2. Population std: sqrt(3/16).
    assert group_advantages(one_right, eps=0.0).tolist() == [[1.5, -0.5, -0.5, -0.5]]
    third = 1 / math.sqrt(3)
    np.testing.assert_allclose(
        group_advantages(one_right, std="population", eps=0.0).numpy(), [[3 * third, -third, -third, -third]]
    )
    spread = torch.tensor([[0.0, 1.0, 2.0]], dtype=torch.float64)  # sample std 1, population std sqrt(2/3)
    eps = ADVANTAGE_EPS
    np.testing.assert_allclose(group_advantages(spread).numpy(), [[-1 / (1 + eps), 0.0, 1 / (1 + eps)]])
    pop = math.sqrt(2 / 3) + eps
    np.testing.assert_allclose(
        group_advantages(spread, std=AdvantageStd.POPULATION).numpy(), [[-1 / pop, 0.0, 1 / pop]]
    )


@pytest.mark.parametrize("std", ["sample", "population"])
def test_group_of_one_reward_gets_zero_advantage(std: str) -> None:
    # A single finite reward has no sample std (n - 1 = 0); it gives no signal, not NaN.
    rewards = torch.tensor([[0.7], [0.2]])
    assert group_advantages(rewards, std=std).tolist() == [[0.0], [0.0]]
    assert group_advantages(torch.tensor([[NAN, 0.3, NAN]]), std=std).tolist() == [[0.0, 0.0, 0.0]]


def test_group_advantages_nan_rewards_are_missing() -> None:
    rewards = torch.tensor([[1.0, NAN, 0.0], [NAN, 1.0, NAN], [NAN, NAN, NAN]], dtype=torch.float64)
    got = group_advantages(rewards)
    half = 0.5 / (math.sqrt(0.5) + ADVANTAGE_EPS)  # sample std of {1, 0}
    np.testing.assert_allclose(got.numpy(), [[half, 0.0, -half], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])


def test_constant_groups_give_exact_zero_and_dtype_is_kept() -> None:
    rewards = torch.full((3, 5), 0.1, dtype=torch.float32)  # mean(0.1 x 5) rounds in float32
    got = group_advantages(rewards)
    assert got.dtype == torch.float32 and torch.equal(got, torch.zeros(3, 5))
    assert group_advantages(torch.tensor([[1, 0]])).dtype == torch.get_default_dtype()


@pytest.mark.parametrize(("scale", "std"), [(True, "sample"), (True, "population"), (False, "sample")])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_group_advantages_random_against_reference(scale: bool, std: str, seed: int) -> None:
    rng = np.random.default_rng(seed)
    rewards = random_rewards(rng, 40, int(rng.integers(1, 9)))
    got = group_advantages(torch.tensor(rewards), scale=scale, std=std, eps=1e-3)
    expected = ref_group_advantages(rewards.tolist(), scale, std, eps=1e-3)
    np.testing.assert_allclose(got.numpy(), expected, atol=1e-12)
    assert zero_std_groups(torch.tensor(rewards)).tolist() == ref_zero_std(rewards.tolist())


def test_zero_std_groups_hand_made() -> None:
    rewards = torch.tensor([[1.0, 1.0, NAN], [0.0, 1.0, 1.0], [NAN, NAN, NAN], [NAN, 0.3, NAN]])
    assert zero_std_groups(rewards).tolist() == [True, False, True, True]
    assert zero_std_groups(torch.zeros(2, 0)).tolist() == [True, True]


@pytest.mark.parametrize("fn", [group_advantages, zero_std_groups])
def test_group_functions_reject_bad_rewards(fn) -> None:
    name = fn.__name__
    with pytest.raises(ValueError, match=rf"`{name}\(rewards=...\)` must be a 2-D tensor \[P, n\].*got shape \(4,\)"):
        fn(torch.zeros(4))
    with pytest.raises(ValueError, match=rf"`{name}\(rewards=...\)` must be finite or NaN.*got 1 infinite"):
        fn(torch.tensor([[0.0, math.inf]]))


def test_group_advantages_rejects_negative_eps() -> None:
    with pytest.raises(ValueError, match=r"`group_advantages\(eps=...\)` must be a finite number >= 0, got -1.0"):
        group_advantages(torch.zeros(1, 2), eps=-1.0)


@pytest.mark.parametrize("bad", ["unbiased", "Sample", None, True, 1])
def test_group_advantages_rejects_unknown_std(bad: object) -> None:
    with pytest.raises(
        ValueError,
        match=rf"`group_advantages\(std=...\)` must be one of \['sample', 'population'\], got {re.escape(repr(bad))}",
    ):
        group_advantages(torch.zeros(1, 2), std=bad)


# ----------------------------------------------------------------------------- pass@k
def test_pass_at_k_hand_made() -> None:
    correct = torch.tensor([[1, 0, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1], [1, 1, 0, 0]])
    # 1 - C(3,2)/C(4,2) = 0.5; none correct: 0; all correct: 1; 1 - C(2,2)/C(4,2) = 5/6
    assert pass_at_k_per_prompt(correct, 2).tolist() == pytest.approx([0.5, 0.0, 1.0, 5 / 6])
    assert pass_at_k(correct, 2).item() == pytest.approx((0.5 + 1 + 5 / 6) / 4)
    assert pass_at_k(correct, 1).item() == pytest.approx(correct.double().mean().item())  # pass@1 = mean accuracy
    assert pass_at_k(correct.bool(), 4).item() == 0.75  # k == n: any correct
    assert pass_at_k(correct, 2).dtype == torch.float64


@pytest.mark.parametrize("seed", range(4))
def test_pass_at_k_random_against_math_comb(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 12))
    correct = (rng.random((30, n)) < rng.random((30, 1))).astype(int)
    for k in range(1, n + 1):
        expected = ref_pass_at_k(correct.tolist(), k)
        np.testing.assert_allclose(pass_at_k_per_prompt(torch.tensor(correct), k).numpy(), expected, atol=1e-12)
        assert pass_at_k(torch.tensor(correct), k).item() == pytest.approx(np.mean(expected), abs=1e-12)


def test_pass_at_k_is_stable_for_large_n() -> None:
    n, c, k = 1000, 7, 300  # C(1000, 300) has ~263 digits: overflows float64
    exact = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))
    correct = torch.zeros(1, n, dtype=torch.bool)
    correct[0, :c] = True
    assert pass_at_k(correct, k).item() == pytest.approx(float(exact), rel=1e-12)


@pytest.mark.parametrize("fn", [pass_at_k, pass_at_k_per_prompt])
def test_pass_at_k_errors(fn) -> None:
    name = fn.__name__
    good = torch.ones(2, 4)
    with pytest.raises(ValueError, match=rf"`{name}\(k=...\)` needs k <= n \(samples per prompt\), got k=5, n=4"):
        fn(good, 5)
    for bad_k in (0, -1, 2.0, True, None):
        with pytest.raises(ValueError, match=rf"`{name}\(k=...\)` must be a positive integer, got k={bad_k!r}"):
            fn(good, bad_k)
    with pytest.raises(ValueError, match=rf"`{name}\(correct=...\)` must be a 2-D tensor \[P, n\].*got shape \(4,\)"):
        fn(torch.ones(4), 1)
    with pytest.raises(ValueError, match=rf"`{name}\(correct=...\)` must hold booleans or 0/1 values, got 2"):
        fn(torch.tensor([[1, 2]]), 1)
    with pytest.raises(ValueError, match=rf"`{name}\(correct=...\)` must hold booleans or 0/1 values, got nan"):
        fn(torch.tensor([[1.0, NAN]]), 1)


# ----------------------------------------------------------------------------- maj@k
def test_maj_at_k_hand_made() -> None:
    ids = torch.tensor(
        [
            [3, 5, 5, 3],  # tie 3 vs 5: 3 appears first and is correct
            [5, 3, 3, 5],  # tie 5 vs 3: 5 appears first and is wrong
            [-1, -1, -1, 2],  # "no answer" never wins: 2 wins with one vote
            [-1, -1, -1, -1],  # no answer at all: incorrect
            [7, 8, 8, 8],  # 8 wins
        ]
    )
    ok = torch.tensor([[1, 0, 0, 1], [0, 1, 1, 0], [0, 0, 0, 1], [1, 1, 1, 1], [0, 1, 0, 0]])
    # last row: the sample of answer 8 marked correct makes answer 8 correct
    assert maj_at_k_per_prompt(ids, ok, 4).tolist() == [1.0, 0.0, 1.0, 0.0, 1.0]
    assert maj_at_k(ids, ok, 4).item() == pytest.approx(0.6)
    # only the first k samples vote: with k=1 row 4 is answer 7, wrong
    assert maj_at_k_per_prompt(ids, ok, 1).tolist() == [1.0, 0.0, 0.0, 0.0, 0.0]


@pytest.mark.parametrize("seed", range(4))
def test_maj_at_k_random_against_reference(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 10))
    ids = rng.integers(-1, 4, size=(40, n))
    correct = (ids == 2).astype(int)  # answer 2 is the right one
    correct[rng.random((40, n)) < 0.1] ^= 1  # and a noisy grader
    for k in range(1, n + 1):
        expected = ref_maj_at_k(ids.tolist(), correct.tolist(), k)
        assert maj_at_k_per_prompt(torch.tensor(ids), torch.tensor(correct), k).tolist() == expected
        assert maj_at_k(torch.tensor(ids), torch.tensor(correct), k).item() == pytest.approx(np.mean(expected))


@pytest.mark.parametrize("fn", [maj_at_k, maj_at_k_per_prompt])
def test_maj_at_k_errors(fn) -> None:
    name = fn.__name__
    ids, ok = torch.zeros(2, 4, dtype=torch.long), torch.ones(2, 4)
    with pytest.raises(ValueError, match=rf"`{name}\(k=...\)` needs k <= n \(samples per prompt\), got k=5, n=4"):
        fn(ids, ok, 5)
    with pytest.raises(ValueError, match=rf"`{name}\(k=...\)` must be a positive integer, got k=0"):
        fn(ids, ok, 0)
    with pytest.raises(
        ValueError, match=rf"`{name}\(correct=...\)` must have the shape of answer_ids \(2, 4\), " rf"got \(2, 3\)"
    ):
        fn(ids, torch.ones(2, 3), 1)
    with pytest.raises(
        ValueError, match=rf"`{name}\(answer_ids=...\)` must be an integer tensor.*got dtype " rf"torch.float32"
    ):
        fn(ids.float(), ok, 1)
    with pytest.raises(ValueError, match=rf"`{name}\(answer_ids=...\)` must be >= -1 \(-1 means no answer\), got -2"):
        fn(ids - 2, ok, 1)
    with pytest.raises(ValueError, match=rf"`{name}\(answer_ids=...\)` must be a 2-D tensor.*got shape \(4,\)"):
        fn(ids[0], ok[0], 1)
    with pytest.raises(ValueError, match=rf"`{name}\(correct=...\)` must hold booleans or 0/1 values, got 3"):
        fn(ids, ok * 3, 1)


# ----------------------------------------------------------------------------- mean@n
def test_mean_at_n_against_numpy() -> None:
    assert mean_at_n(torch.tensor([[1.0, 0.0], [1.0, 1.0]])).item() == 0.75
    values = np.random.default_rng(0).random((17, 5)).astype(np.float32)
    got = mean_at_n(torch.tensor(values))
    assert got.dtype == torch.float64
    assert got.item() == pytest.approx(values.astype(np.float64).mean(axis=1).mean(), abs=1e-15)


def test_mean_at_n_errors() -> None:
    with pytest.raises(ValueError, match=r"`mean_at_n\(values=...\)` must be a 2-D tensor.*got shape \(3,\)"):
        mean_at_n(torch.ones(3))
    with pytest.raises(
        ValueError, match=r"`mean_at_n\(values=...\)` needs n >= 1 samples per prompt, got shape " r"\(3, 0\)"
    ):
        mean_at_n(torch.ones(3, 0))


# ----------------------------------------------------------------------------- Wilson interval
def test_wilson_hand_made() -> None:
    low, high = wilson_interval(8, 10)
    assert (low.item(), high.item()) == pytest.approx((0.4901624, 0.9433178), abs=1e-6)  # textbook values
    assert low.dtype == torch.float64
    assert [x.item() for x in wilson_interval(0, 0)] == [0.0, 1.0]
    assert wilson_interval(0, 20)[0].item() == 0.0 and wilson_interval(20, 20)[1].item() == 1.0


@pytest.mark.parametrize("confidence", [0.5, 0.9, 0.95, 0.99])
def test_wilson_against_reference(confidence: float) -> None:
    totals = torch.tensor([0, 1, 2, 5, 10, 37, 100, 1000], dtype=torch.float64)
    for frac in (0.0, 0.1, 0.5, 0.77, 1.0):
        successes = torch.round(totals * frac)
        low, high = wilson_interval(successes, totals, confidence)
        expected = [ref_wilson(s, t, confidence) for s, t in zip(successes.tolist(), totals.tolist(), strict=True)]
        np.testing.assert_allclose(low.numpy(), [e[0] for e in expected], atol=1e-12)
        np.testing.assert_allclose(high.numpy(), [e[1] for e in expected], atol=1e-12)
        assert bool(((low <= successes / totals.clamp_min(1)) | (totals == 0)).all())


def test_wilson_errors() -> None:
    for bad in (0, 1, 1.5, -0.1, True, "0.95"):
        with pytest.raises(
            ValueError, match=rf"`wilson_interval\(confidence=...\)` must be a number in \(0, 1\), got " rf"{bad!r}"
        ):
            wilson_interval(1, 2, bad)
    for bad_total in (-1, 0.5, 2.5, math.inf, NAN):
        with pytest.raises(
            ValueError,
            match=rf"`wilson_interval\(total=...\)` must be a whole number >= 0 \(a count of trials\), "
            rf"got {float(bad_total)}",
        ):
            wilson_interval(0, bad_total)
    for bad_successes, total in ((3, 2), (-1, 2), (0.8, 10), (NAN, 2)):
        with pytest.raises(
            ValueError,
            match=r"`wilson_interval\(successes=...\)` must be a whole number in \[0, total\], got "
            rf"successes={float(bad_successes)}, total={float(total)}",
        ):
            wilson_interval(bad_successes, total)
    # A fractional total below 1 is refused, not taken as 1 (0.25 of 0.5 would get the interval of 0.25 of 1).
    with pytest.raises(ValueError, match=r"`wilson_interval\(total=...\)` .* got 0.5"):
        wilson_interval(torch.tensor([1.0, 0.5]), torch.tensor([2.0, 0.5]))


def test_package_exports_exactly_its_public_names() -> None:
    # Every listed name is defined (each loads on first use, PEP 562), and every public name the
    # package then holds is listed (besides the `Any`, `TYPE_CHECKING` and `annotations` of its own code).
    for name in metrics_pkg.__all__:
        getattr(metrics_pkg, name)
    names = vars(metrics_pkg)
    public = [
        name
        for name, value in names.items()
        if not name.startswith("_")
        and not inspect.ismodule(value)
        and name not in ("Any", "TYPE_CHECKING", "annotations")
    ]
    assert sorted(metrics_pkg.__all__) == sorted(public)
