"""Exact sums: the metrics give the same float64, bit for bit, whatever the number of ranks and
however the samples are split between ranks and updates, and it is the correctly rounded value.

References are independent of the code: ``fractions.Fraction`` sums, ``statistics.mean`` (the
float nearest to the exact mean of floats) and ``statistics.pstdev`` (correctly rounded since
Python 3.11). The data is chosen so that float64 sums of it do depend on the split.
"""

from __future__ import annotations

import math
import statistics
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
import torch
from ddp_utils import run_ddp
from torchmetrics import Metric, SumMetric

from areal_lightning.eval_round import EvalBatch, EvalContext, EvalSet, run_round
from areal_lightning.metrics import AdvantageMetric, PassAtK, RewardMetric, pass_at_k_per_prompt
from areal_lightning.metrics.exact import (
    _sqrt_ratio,
    add_squares,
    add_values,
    mean_float,
    new_sum,
    std_float,
    sum_float,
    sum_fraction,
)
from areal_lightning.metrics.mean import ExactMean
from areal_lightning.metrics.paired import PairedChange

WORLD_SIZE = 2
NUM_VALUES = 3000
GROUP = 4  # rewards per group (advantages) and samples per prompt (pass@k)
SAMPLES_PER_PROMPT = 3  # pass@1 and pass@2 estimates of 0, 1/3, 2/3, 1
ROUND_SIZE = 1000


def hard_values(seed: int, n: int = NUM_VALUES) -> np.ndarray:
    """Rewards whose float64 sums depend on the order: lognormal of both signs over many orders of
    magnitude, ``1e8 + U(0, 1)``, thirds and tiny values, mixed."""
    rng = np.random.default_rng(seed)
    lognormal = rng.lognormal(0.0, 4.0, n) * rng.choice([-1.0, 1.0], n)
    return np.choose(
        rng.integers(0, 4, n), [lognormal, 1e8 + rng.random(n), rng.integers(0, 4, n) / 3, rng.random(n) * 1e-12]
    )


def split(values: np.ndarray, parts: int, order_seed: int) -> list[list[np.ndarray]]:
    """The values shuffled, cut into batches of random sizes, and the batches dealt round robin to ``parts``."""
    rng = np.random.default_rng(order_seed)
    shuffled = values[rng.permutation(len(values))]
    cuts = np.sort(rng.choice(np.arange(1, len(values)), size=40, replace=False))
    batches = np.split(shuffled, cuts)
    return [batches[part::parts] for part in range(parts)]


def merged(make: Any, shares: list[list[np.ndarray]]) -> Metric:
    """One metric per share, updated batch by batch, then merged as a sync over ranks merges them."""
    metrics = []
    for share in shares:
        metric = make()
        for batch in share:
            metric.update(torch.from_numpy(batch))
        metrics.append(metric)
    for other in metrics[1:]:
        metrics[0].merge_state(other)
    return metrics[0]


def floats(value: torch.Tensor | dict[str, torch.Tensor]) -> dict[str, float]:
    if isinstance(value, torch.Tensor):
        return {"value": value.item()}
    return {key: v.item() for key, v in value.items()}


def test_the_data_defeats_float64_sums() -> None:
    values = hard_values(0)
    sums = {math.fsum(values)} | {float(sum(part.sum() for part in split(values, 3, seed)[0])) for seed in range(3)}
    in_order = {float(sum(np.concatenate(split(values, 1, seed)[0]).tolist())) for seed in range(5)}
    assert len(sums) > 1 and len(in_order) > 1  # plain float64 sums of the same values differ


@pytest.mark.parametrize("parts", [1, 2, 3])
@pytest.mark.parametrize("order_seed", [0, 1, 2])
def test_reward_metric_is_the_same_float_for_any_split(parts: int, order_seed: int) -> None:
    values = hard_values(0)
    got = floats(merged(RewardMetric, split(values, parts, order_seed)).compute())
    reference = values.tolist()
    expected = {
        "mean": statistics.mean(reference),
        "std": statistics.pstdev(reference),
        "min": min(reference),
        "max": max(reference),
    }
    assert got == expected


@pytest.mark.parametrize("parts", [1, 2, 3])
@pytest.mark.parametrize("order_seed", [0, 1])
def test_exact_mean_is_the_same_float_for_any_split(parts: int, order_seed: int) -> None:
    values = hard_values(1)
    assert floats(merged(ExactMean, split(values, parts, order_seed)).compute()) == {
        "value": statistics.mean(values.tolist())
    }


def _extreme_values(seed: int) -> list[float]:
    rng = np.random.default_rng(seed)
    size = int(rng.integers(1, 50))
    exponents = rng.integers(-1074, 1024, size)
    values = np.ldexp(rng.random(size), exponents) * rng.choice([-1.0, 1.0], size)
    special = [5e-324, -5e-324, 2.2e-308, 1.7e308, -1.7e308, 0.0, -0.0, 1e-300, 3e-310]
    return [*values.tolist(), *rng.choice(special, int(rng.integers(0, 4))).tolist()]


@pytest.mark.parametrize("seed", range(20))
def test_exact_sums_of_subnormal_to_huge_values_are_the_fraction_sums(seed: int) -> None:
    values = _extreme_values(seed)
    tensor = torch.tensor(values, dtype=torch.float64)
    sums, squares = add_values(new_sum(), tensor), add_squares(new_sum(), tensor)
    total = sum(map(Fraction, values), Fraction(0))
    assert sum_fraction(sums) == total
    assert sum_fraction(squares) == sum((Fraction(v) ** 2 for v in values), Fraction(0))
    assert sum_float(sums) == (float(total) if abs(total) < 2**1024 else math.inf if total > 0 else -math.inf)
    assert mean_float(sums) == statistics.mean(values)
    assert std_float(sums, squares) == statistics.pstdev(values)


def test_millions_of_values_in_one_update_are_summed_exactly() -> None:
    # Each value adds up to 2**33 to a digit: 2**22 of them need the carries between digits.
    values = torch.rand(1 << 22, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    units = (values.numpy() * 2.0**53).astype(np.int64)  # torch.rand draws multiples of 2**-53
    total = sum(int(chunk) for chunk in units.reshape(-1, 1024).sum(axis=1))
    assert sum_fraction(add_values(new_sum(), values)) == Fraction(total, 1 << 53)


def test_the_std_is_rounded_once_also_next_to_a_halfway_point() -> None:
    midpoint = Fraction(1.0) + Fraction(1, 2**53)  # halfway between 1.0 (even) and 1 + 2**-52
    assert _sqrt_ratio((midpoint**2).numerator, (midpoint**2).denominator) == 1.0  # a tie: to even
    # A root just above the midpoint rounds up; cut to a few bits more than float64's 53 without a
    # sticky bit, it would sit on the midpoint and round down.
    variance = midpoint**2 + Fraction(1, 2**200)
    assert _sqrt_ratio(variance.numerator, variance.denominator) == 1.0 + 2.0**-52


def test_nan_and_infinite_values_give_the_ieee_result() -> None:
    def mean_and_std(*values: float) -> tuple[float, float]:
        tensor = torch.tensor(values, dtype=torch.float64)
        return mean_float(add_values(new_sum(), tensor)), std_float(
            add_values(new_sum(), tensor), add_squares(new_sum(), tensor)
        )

    mean, std = mean_and_std(1.0, math.inf)
    assert mean == math.inf and math.isnan(std)
    assert mean_and_std(-math.inf, 2.0)[0] == -math.inf
    assert all(
        math.isnan(x) for x in (*mean_and_std(math.inf, -math.inf), *mean_and_std(math.nan, 1.0), *mean_and_std())
    )
    assert sum_float(add_values(new_sum(), torch.tensor([1.7e308, 1.7e308], dtype=torch.float64))) == math.inf


# ----------------------------------------------------------------------------- 1 rank against 2
def _all_batches() -> list[np.ndarray]:
    return np.split(hard_values(2), np.arange(97, NUM_VALUES, 97))  # 31 batches: uneven over 2 ranks


def _correct(index: int, batch: np.ndarray) -> torch.Tensor:
    """``[P, 3]`` correctness of batch ``index``: pass@k estimates of 0, 1/3, 2/3 and 1."""
    rng = np.random.default_rng(index)
    return torch.from_numpy(rng.random((len(batch) // SAMPLES_PER_PROMPT, SAMPLES_PER_PROMPT)) < 0.5)


def _groups(batch: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(batch[: len(batch) // GROUP * GROUP].reshape(-1, GROUP))


def _paired(index: int, batch: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """Each prompt's mean reward in this round and in the one before."""
    current, previous = np.random.default_rng(2000 + index).random((2, len(batch)))
    return torch.from_numpy(current), torch.from_numpy(previous)


def _round_values() -> np.ndarray:
    """Per-sample values of an eval round over 7 orders of magnitude (seed: float sums differ on 1 and 2 ranks)."""
    rng = np.random.default_rng(7)
    return rng.random(ROUND_SIZE) * 10.0 ** rng.integers(-3, 4, ROUND_SIZE)


def _per_sample_values(module: Any, batches: list[EvalBatch], ctx: EvalContext) -> dict[str, Any]:
    values = _round_values()
    return {"value": torch.tensor([values[i] for b in batches for i in b.indices], dtype=torch.float64)}


def _results(rank: int, world_size: int) -> dict[str, dict[str, float]]:
    """Every exact metric over this rank's deal of the batches (all of them on one process)."""
    metrics: dict[str, Metric] = {
        "reward": RewardMetric(),
        "mean": ExactMean(),
        "advantage": AdvantageMetric(),
        "pass@1": PassAtK(k=1),
        "pass@2": PassAtK(k=2),
        "paired": PairedChange(),
    }
    for index, batch in enumerate(_all_batches()):
        if index % world_size != rank:
            continue
        metrics["reward"].update(torch.from_numpy(batch))
        metrics["mean"].update(torch.from_numpy(batch))
        metrics["advantage"].update(_groups(batch))
        metrics["pass@1"].update(_correct(index, batch))
        metrics["pass@2"].update(_correct(index, batch))
        metrics["paired"].update(*_paired(index, batch))
    out = {name: floats(metric.compute()) for name, metric in metrics.items() if name != "paired"}
    out["paired"] = metrics["paired"].compute()._asdict()
    (result,) = run_round(
        torch.nn.Identity(),
        [EvalSet("s", list(range(ROUND_SIZE)), batch_size=7)],
        _per_sample_values,
        seed=0,
        global_step=0,
        epoch=0,
    )
    out["round"] = result.metrics
    return out


NAMES = ("reward", "mean", "advantage", "pass@1", "pass@2", "paired", "round")


@pytest.fixture(scope="module")
def one_process() -> dict[str, dict[str, float]]:
    return _results(0, 1)  # no process group here: one process sees every batch


@pytest.fixture(scope="module")
def two_ranks() -> list[dict[str, dict[str, float]]]:
    return run_ddp(_results, WORLD_SIZE)


@pytest.mark.ddp
@pytest.mark.parametrize("name", NAMES)
def test_two_ranks_give_the_one_process_floats_bit_for_bit(
    name: str, one_process: dict[str, dict[str, float]], two_ranks: list[dict[str, dict[str, float]]]
) -> None:
    assert sorted(one_process) == sorted(NAMES)
    assert two_ranks[0][name] == two_ranks[1][name] == one_process[name]


def test_one_process_floats_are_the_correctly_rounded_values(one_process: dict[str, dict[str, float]]) -> None:
    one = one_process
    values = np.concatenate(_all_batches()).tolist()
    assert one["reward"]["mean"] == one["mean"]["value"] == statistics.mean(values)
    assert one["reward"]["std"] == statistics.pstdev(values)
    assert one["round"]["value"] == statistics.mean(_round_values().tolist())
    thirds = {1: {0.0, 1 / 3, 2 / 3, 1.0}, 2: {0.0, 2 / 3, 1.0}}  # n = 3 samples per prompt
    for k in (1, 2):
        estimates = torch.cat([pass_at_k_per_prompt(_correct(i, b), k) for i, b in enumerate(_all_batches())]).tolist()
        assert {round(e, 12) for e in estimates} == {round(e, 12) for e in thirds[k]}
        assert one[f"pass@{k}"]["value"] == statistics.mean(estimates)


def _converted(metric: Metric, how: str) -> Metric:
    if how == "set_dtype(float16)":
        return metric.set_dtype(torch.float16)
    if how == "set_dtype(bfloat16)":
        return metric.set_dtype(torch.bfloat16)
    if how == "to(float32)":
        return metric.to(torch.float32)
    holder = torch.nn.Module()  # a LightningModule holding the metric, converted whole (16-true precision)
    holder.metric = metric
    holder.half() if how == "holder.half()" else holder.to(torch.bfloat16)
    return metric


# 3000 values: a float16 count stops at 2048, and 1e8 + 0.25 has no float32, let alone float16.
_WIDE = torch.tensor([1e8 + 0.25, 1e8 + 0.5, 0.75] * 1000, dtype=torch.float64)
NARROWED = {
    "reward": (RewardMetric, _WIDE),
    "advantage": (AdvantageMetric, _WIDE.reshape(-1, 2)),
    "pass@1": (lambda: PassAtK(k=1), (torch.arange(3000) % 3 == 0).reshape(-1, 1)),
}


@pytest.mark.parametrize(
    "how", ["set_dtype(float16)", "set_dtype(bfloat16)", "to(float32)", "holder.half()", "holder.to(bf16)"]
)
@pytest.mark.parametrize("name", list(NARROWED))
def test_a_narrower_dtype_leaves_the_exact_states_float64_and_the_result_unchanged(name: str, how: str) -> None:
    make, values = NARROWED[name]
    half = len(values) // 2
    plain, converted = make(), make()
    for m in (plain, converted):
        m.update(values[:half])
    converted = _converted(converted, how)
    for m in (plain, converted):
        m.update(values[half:])  # updates after the conversion count as before it
    states = [v for v in converted.metric_state.values() if isinstance(v, torch.Tensor)]
    assert states and all(v.dtype == torch.float64 for v in states)
    got, want = converted.compute(), plain.compute()
    got, want = (got, want) if isinstance(want, dict) else ({"value": got}, {"value": want})
    assert got.keys() == want.keys()
    for key in want:
        assert torch.equal(got[key], want[key]) or (got[key].isnan() and want[key].isnan()), key


def _float64_sum(module: Any, batches: list[EvalBatch], ctx: EvalContext) -> dict[str, Any]:
    total = ctx.metric("total", lambda: SumMetric().set_dtype(torch.float64))  # a user's float64 metric
    for batch in batches:
        total.update(torch.tensor([1e8 + 0.125] * len(batch.indices), dtype=torch.float64))
    return {}


def test_a_users_float64_metric_stays_float64_through_the_round() -> None:
    # torchmetrics' `.to(device)` resets a metric's dtype to float32, and a SumMetric casts what it
    # is given to its dtype: moved to the round's device unguarded, 1e8 + 0.125 would count as 1e8.
    (result,) = run_round(
        torch.nn.Identity(), [EvalSet("s", list(range(4)), batch_size=2)], _float64_sum, seed=0, global_step=0, epoch=0
    )
    assert result.metrics["total"] == 4 * (1e8 + 0.125)
