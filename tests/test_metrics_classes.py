"""The torchmetrics classes of areal_lightning.metrics in one process, against plain references."""

from __future__ import annotations

import math
import re
import statistics
import warnings

import numpy as np
import pytest
import torch
from test_metrics_functional import (
    random_rewards,
    ref_group_advantages,
    ref_maj_at_k,
    ref_pass_at_k,
    ref_wilson,
    ref_zero_std,
)
from torchmetrics import Metric

from areal_lightning.metrics import AccuracyMetric, AdvantageMetric, MajAtK, PassAtK, RewardMetric

NAN = float("nan")
BEFORE_UPDATE = r"was called before the ``update`` method"


def as_floats(result: dict[str, torch.Tensor]) -> dict[str, float]:
    return {key: value.item() for key, value in result.items()}


def nan_equal(a: dict[str, float], b: dict[str, float], tol: float = 1e-12) -> bool:
    return a.keys() == b.keys() and all(
        (math.isnan(a[k]) and math.isnan(b[k])) or math.isclose(a[k], b[k], rel_tol=tol, abs_tol=tol) for k in a
    )


# ----------------------------------------------------------------------------- shared properties
@pytest.mark.parametrize(
    ("metric", "higher_is_better"),
    [
        (RewardMetric(), True),
        (AdvantageMetric(), None),
        (AccuracyMetric(), True),
        (PassAtK(1), True),
        (MajAtK(1), True),
    ],
)
def test_class_attributes_and_float64_states(metric: Metric, higher_is_better: bool | None) -> None:
    assert metric.higher_is_better is higher_is_better
    assert metric.full_state_update is False
    for name, default in metric._defaults.items():
        assert isinstance(default, torch.Tensor) and default.dtype == torch.float64, name  # no cat states
        assert callable(metric._reductions[name]), name  # synced across ranks, not kept per rank


# ----------------------------------------------------------------------------- RewardMetric
def test_reward_metric_hand_made() -> None:
    metric = RewardMetric()
    metric.update(torch.tensor([1.0, 0.0]))
    metric.update(torch.tensor([[0.5], [0.25]]))
    got = as_floats(metric.compute())
    values = [1.0, 0.0, 0.5, 0.25]
    assert nan_equal(got, {"mean": 0.4375, "std": float(np.std(values)), "min": 0.0, "max": 1.0})


def test_reward_metric_random_batches_against_numpy() -> None:
    rng = np.random.default_rng(0)
    metric, seen = RewardMetric(nan_strategy="ignore"), []
    for _ in range(20):
        batch = random_rewards(rng, int(rng.integers(0, 6)), int(rng.integers(1, 7))).astype(np.float32)
        metric.update(torch.tensor(batch))
        seen.append(batch.astype(np.float64).ravel())
    values = np.concatenate(seen)
    values = values[~np.isnan(values)]
    expected = {"mean": values.mean(), "std": values.std(), "min": values.min(), "max": values.max()}
    assert nan_equal(as_floats(metric.compute()), expected)


def test_reward_metric_accumulates_in_float64() -> None:
    metric = RewardMetric()
    batch = torch.full((10_000,), 0.1, dtype=torch.float32)
    for _ in range(100):
        metric.update(batch)
    # A float32 running sum is off by ~1e-7 here (relative); the float64 states stay within 1e-12.
    assert metric.compute()["mean"].item() == pytest.approx(float(np.float32(0.1)), rel=1e-12)


def test_reward_metric_std_survives_a_large_offset() -> None:
    # E[x^2] - E[x]^2 gave 0.0 here (true std 0.29): rounding of the squared offset swamps the spread.
    rng = np.random.default_rng(11)
    metric, seen = RewardMetric(), []
    for _ in range(20):
        batch = 1e8 + rng.random(int(rng.integers(1, 40)))
        metric.update(torch.tensor(batch))
        seen += batch.tolist()
    got = as_floats(metric.compute())
    # Exact references (statistics works in fractions); the float64 mean limits us to ~1e-16 * mean / std.
    assert got["std"] == pytest.approx(statistics.pstdev(seen), rel=1e-7)
    assert got["mean"] == pytest.approx(statistics.fmean(seen), rel=1e-15)


def test_reward_metric_nan_strategies() -> None:
    batch = torch.tensor([1.0, NAN, 0.0, NAN])
    with pytest.raises(
        ValueError,
        match=r"`RewardMetric.update\(rewards=...\)` got 2 NaN value\(s\) out of 4 "
        r"with nan_strategy='error'; pass nan_strategy='ignore'",
    ):
        RewardMetric().update(batch)
    dropped = {"mean": 0.5, "std": 0.5, "min": 0.0, "max": 1.0}
    for strategy in ("ignore", "warn"):
        metric = RewardMetric(nan_strategy=strategy)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            metric.update(batch)
        assert [str(w.message) for w in caught] == (
            ["`RewardMetric.update(rewards=...)` got 2 NaN value(s) out of 4; dropped them (nan_strategy='warn')"]
            if strategy == "warn"
            else []
        )
        assert nan_equal(as_floats(metric.compute()), dropped)
    zero = RewardMetric(nan_strategy=0.0)
    zero.update(batch)
    zero_expected = {"mean": 0.25, "std": float(np.std([1, 0, 0, 0])), "min": 0.0, "max": 1.0}
    assert nan_equal(as_floats(zero.compute()), zero_expected)
    assert torch.isnan(batch).sum().item() == 2  # the replacement did not write into the caller's rewards
    disabled = RewardMetric(nan_strategy="disable")
    disabled.update(batch)
    assert all(math.isnan(v) for v in as_floats(disabled.compute()).values())


@pytest.mark.parametrize("bad", ["zero", "drop", None, True, NAN, math.inf])
def test_reward_metric_rejects_unknown_nan_strategy(bad: object) -> None:
    with pytest.raises(
        ValueError,
        match=r"`RewardMetric\(nan_strategy=...\)` must be one of \('error', 'warn', 'ignore', 'disable'\) "
        rf"or a finite float that replaces NaN, got {re.escape(repr(bad))}",
    ):
        RewardMetric(nan_strategy=bad)


def test_reward_metric_without_samples_is_nan() -> None:
    metric = RewardMetric(nan_strategy="ignore")
    with pytest.warns(UserWarning, match=BEFORE_UPDATE):
        assert all(math.isnan(v) for v in as_floats(metric.compute()).values())
    batch_value = metric(torch.tensor([NAN]))  # forward of only ignored values: nothing counted
    assert all(math.isnan(v) for v in as_floats(batch_value).values())
    assert all(math.isnan(v) for v in as_floats(metric.compute()).values())
    metric.update(torch.tensor([1.0, 0.0]))  # merging two empty states left no NaN behind
    assert nan_equal(as_floats(metric.compute()), {"mean": 0.5, "std": 0.5, "min": 0.0, "max": 1.0})


def test_reward_metric_forward_reset_and_integer_rewards() -> None:
    metric = RewardMetric()
    batch_value = metric(torch.tensor([1, 1, 0]))  # forward: this batch only, and accumulate
    assert batch_value["mean"].item() == pytest.approx(2 / 3)
    metric(torch.tensor([0.0]))
    assert metric.compute()["mean"].item() == 0.5
    metric.reset()
    metric.update(torch.tensor([True, False]))
    assert metric.compute()["mean"].item() == 0.5


# ----------------------------------------------------------------------------- AdvantageMetric
def reference_advantage_stats(batches: list[np.ndarray], scale: bool, std: str = "sample") -> dict[str, float]:
    counted, zero, groups = [], 0, 0
    for rewards in batches:
        adv = np.array(ref_group_advantages(rewards.tolist(), scale, std), dtype=np.float64).reshape(rewards.shape)
        counted.append(adv[~np.isnan(rewards)])
        zero += sum(ref_zero_std(rewards.tolist()))
        groups += rewards.shape[0]
    adv = np.concatenate(counted)
    nan = float("nan")
    return {
        "mean": adv.mean() if adv.size else nan,
        "std": adv.std() if adv.size else nan,
        "abs_mean": np.abs(adv).mean() if adv.size else nan,
        "zero_std_frac": zero / groups if groups else nan,
    }


def test_advantage_metric_hand_made() -> None:
    metric = AdvantageMetric(scale=False)
    metric.update(torch.tensor([[1.0, 0.0, NAN], [1.0, 1.0, 1.0]]))
    # counted advantages: 0.5, -0.5 (row 0, NaN left out), 0, 0, 0 (row 1: zero std)
    expected = {"mean": 0.0, "std": float(np.std([0.5, -0.5, 0, 0, 0])), "abs_mean": 0.2, "zero_std_frac": 0.5}
    assert nan_equal(as_floats(metric.compute()), expected)


@pytest.mark.parametrize(("scale", "std"), [(True, "sample"), (True, "population"), (False, "sample")])
def test_advantage_metric_random_against_reference(scale: bool, std: str) -> None:
    rng = np.random.default_rng(3)
    batches = [random_rewards(rng, int(rng.integers(1, 6)), int(rng.integers(1, 7))) for _ in range(15)]
    metric = AdvantageMetric(scale=scale, std=std)
    for rewards in batches:
        metric.update(torch.tensor(rewards))
    assert nan_equal(as_floats(metric.compute()), reference_advantage_stats(batches, scale, std), tol=1e-9)


def test_advantage_metric_errors_and_empty() -> None:
    with pytest.raises(ValueError, match=r"`AdvantageMetric\(scale=...\)` must be True or False, got 'yes'"):
        AdvantageMetric(scale="yes")
    with pytest.raises(
        ValueError, match=r"`AdvantageMetric\(std=...\)` must be one of \['sample', 'population'\], got 'biased'"
    ):
        AdvantageMetric(std="biased")
    with pytest.raises(
        ValueError, match=r"`AdvantageMetric.update\(rewards=...\)` must be a 2-D tensor.*got " r"shape \(3,\)"
    ):
        AdvantageMetric().update(torch.zeros(3))
    with pytest.warns(UserWarning, match=BEFORE_UPDATE):
        assert all(math.isnan(v) for v in as_floats(AdvantageMetric().compute()).values())


# ----------------------------------------------------------------------------- AccuracyMetric
def test_accuracy_metric_hand_made_threshold_is_strict_as_in_seed() -> None:
    metric = AccuracyMetric(threshold=0.8)
    metric.update(torch.tensor([1.0, 0.9, 0.8, 0.0]))  # float32 0.8 is not above 0.8, as `rewards > 0.8`
    low, high = ref_wilson(2, 4)
    assert nan_equal(as_floats(metric.compute()), {"accuracy": 0.5, "ci_low": low, "ci_high": high})


@pytest.mark.parametrize(("threshold", "confidence"), [(0.8, 0.95), (0.5, 0.9), (0.0, 0.99), (1.0, 0.95)])
def test_accuracy_metric_random_against_reference(threshold: float, confidence: float) -> None:
    rng = np.random.default_rng(5)
    metric = AccuracyMetric(threshold=threshold, confidence=confidence, nan_strategy=0.0)
    successes = total = prompts = 0
    for _ in range(12):
        batch = random_rewards(rng, int(rng.integers(0, 5)), 4).astype(np.float32)
        metric.update(torch.tensor(batch))
        successes += int((np.nan_to_num(batch, nan=0.0) > np.float32(threshold)).sum())
        total += batch.size
        prompts += batch.shape[0]  # a row is one prompt's samples: the interval counts prompts
    low, high = ref_wilson(successes / total * prompts, prompts, confidence)
    expected = {"accuracy": successes / total, "ci_low": low, "ci_high": high}
    assert nan_equal(as_floats(metric.compute()), expected)


def test_accuracy_interval_counts_prompts_not_their_samples() -> None:
    # Two prompts, four samples each: one always solved, one never. Eight samples, but two things
    # measured: the interval is that of 1 success in 2 trials, not of 4 in 8.
    metric = AccuracyMetric()
    metric.update(torch.tensor([[1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0]]))
    out = as_floats(metric.compute())
    assert out["accuracy"] == 0.5
    assert (out["ci_low"], out["ci_high"]) == pytest.approx(ref_wilson(1, 2))
    assert out["ci_high"] - out["ci_low"] > 1.4 * (ref_wilson(4, 8)[1] - ref_wilson(4, 8)[0])
    flat = AccuracyMetric()  # one sample a prompt: eight prompts
    flat.update(torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0]))
    assert (as_floats(flat.compute())["ci_low"], as_floats(flat.compute())["ci_high"]) == pytest.approx(
        ref_wilson(4, 8)
    )
    dropped = AccuracyMetric(nan_strategy="ignore")  # a prompt whose every reward is dropped is not counted
    dropped.update(torch.tensor([[1.0, 0.0], [math.nan, math.nan], [1.0, 1.0]]))
    assert (as_floats(dropped.compute())["ci_low"], as_floats(dropped.compute())["ci_high"]) == pytest.approx(
        ref_wilson(0.75 * 2, 2)
    )


def test_accuracy_metric_nan_strategy_and_empty() -> None:
    batch = torch.tensor([1.0, NAN])
    with pytest.raises(ValueError, match=r"`AccuracyMetric.update\(rewards=...\)` got 1 NaN value\(s\) out of 2"):
        AccuracyMetric().update(batch)
    ignore, zero = AccuracyMetric(nan_strategy="ignore"), AccuracyMetric(nan_strategy=0.0)
    disabled, correct = AccuracyMetric(nan_strategy="disable"), AccuracyMetric(nan_strategy=1.0)
    for metric in (ignore, zero, disabled, correct):
        metric.update(batch)
    assert [m.compute()["accuracy"].item() for m in (ignore, zero, disabled, correct)] == [1.0, 0.5, 0.5, 1.0]
    with pytest.warns(UserWarning, match=BEFORE_UPDATE):
        empty = as_floats(AccuracyMetric().compute())
    assert math.isnan(empty["accuracy"]) and (empty["ci_low"], empty["ci_high"]) == (0.0, 1.0)


def test_accuracy_metric_constructor_errors() -> None:
    for bad in (-0.1, 1.5, NAN, math.inf, True, "0.8", None):
        with pytest.raises(
            ValueError,
            match=rf"`AccuracyMetric\(threshold=...\)` must be a finite number in \[0, "
            rf"1\].*got {bad!r}",
        ):
            AccuracyMetric(threshold=bad)
    with pytest.raises(ValueError, match=r"`AccuracyMetric\(confidence=...\)` must be a number in \(0, 1\), got 95"):
        AccuracyMetric(confidence=95)
    with pytest.raises(ValueError, match=r"`AccuracyMetric\(nan_strategy=...\)` must be one of .*got 'zero'"):
        AccuracyMetric(nan_strategy="zero")


# ----------------------------------------------------------------------------- PassAtK, MajAtK
def test_pass_at_k_metric_hand_made_and_random_with_varying_n() -> None:
    metric = PassAtK(k=2)
    metric.update(torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0]]))
    assert metric.compute().item() == pytest.approx((0.5 + 5 / 6) / 2)
    rng = np.random.default_rng(7)
    metric, expected = PassAtK(k=3), []
    for _ in range(10):
        correct = rng.random((int(rng.integers(0, 6)), int(rng.integers(3, 9)))) < 0.3
        metric.update(torch.tensor(correct))
        expected += ref_pass_at_k(correct.astype(int).tolist(), 3)
    assert metric.compute().item() == pytest.approx(np.mean(expected), abs=1e-12)


def test_maj_at_k_metric_hand_made_and_random() -> None:
    metric = MajAtK(k=4)
    metric.update(torch.tensor([[3, 5, 5, 3], [5, 3, 3, 5]]), torch.tensor([[1, 0, 0, 1], [0, 1, 1, 0]]))
    assert metric.compute().item() == 0.5  # both ties go to the answer that appears first
    rng = np.random.default_rng(8)
    metric, expected = MajAtK(k=3), []
    for _ in range(10):
        ids = rng.integers(-1, 3, size=(int(rng.integers(0, 6)), int(rng.integers(3, 8))))
        correct = (ids == 1).astype(int)
        metric.update(torch.tensor(ids), torch.tensor(correct))
        expected += ref_maj_at_k(ids.tolist(), correct.tolist(), 3)
    assert metric.compute().item() == pytest.approx(np.mean(expected), abs=1e-12)


@pytest.mark.parametrize("cls", [PassAtK, MajAtK])
def test_k_metrics_errors_name_the_class(cls: type[Metric]) -> None:
    name = cls.__name__
    for bad in (0, -2, 1.5, True, "3"):
        with pytest.raises(ValueError, match=rf"`{name}\(k=...\)` must be a positive integer, got k={bad!r}"):
            cls(bad)
    metric = cls(k=5)
    args = (torch.zeros(2, 4, dtype=torch.long), torch.zeros(2, 4)) if cls is MajAtK else (torch.zeros(2, 4),)
    arg = "answer_ids" if cls is MajAtK else "correct"
    with pytest.raises(
        ValueError, match=rf"`{name}.update\({arg}=...\)` needs k <= n \(samples per prompt\), got " rf"k=5, n=4"
    ):
        metric.update(*args)
    with pytest.raises(ValueError, match=rf"`{name}.update\({arg}=...\)` must be a 2-D tensor.*got shape \(4,\)"):
        metric.update(*(a[0] for a in args))
    assert math.isnan(metric.compute().item())  # rejected batches leave no trace
    with pytest.warns(UserWarning, match=BEFORE_UPDATE):
        assert math.isnan(cls(k=5).compute().item())  # no prompt yet


def test_maj_at_k_metric_rejects_mismatched_correct() -> None:
    with pytest.raises(
        ValueError, match=r"`MajAtK.update\(correct=...\)` must have the shape of answer_ids \(2, " r"4\), got \(2, 5\)"
    ):
        MajAtK(k=2).update(torch.zeros(2, 4, dtype=torch.long), torch.zeros(2, 5))
