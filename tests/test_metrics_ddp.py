"""Exactness under DDP: 2 gloo CPU processes with uneven updates equal one process over the union.

One spawn (a module-scoped fixture) runs every metric through every scenario; the tests compare
what each rank computed with a single-process metric (bit for bit: the float sums are exact) and
with an independent reference.
Every metric is computed twice (after the first half of its updates, then after all of them),
so computing in the middle must not disturb the accumulation, and a rank that gets no update
between two computes must still join the second sync (torchmetrics' compute cache would skip it).
"""

from __future__ import annotations

import math
import os
import time
import warnings
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist
from ddp_utils import run_ddp
from test_metrics_classes import BEFORE_UPDATE, nan_equal, reference_advantage_stats
from test_metrics_functional import random_rewards, ref_maj_at_k, ref_pass_at_k, ref_wilson
from torchmetrics import Metric
from torchmetrics.utilities.distributed import gather_all_tensors

from areal_lightning.metrics import (
    ADVANTAGE_EPS,
    AccuracyMetric,
    AdvantageMetric,
    CompletionLength,
    MajAtK,
    PassAtK,
    PassHatK,
    RewardMetric,
    Share,
    TokenMean,
)

pytestmark = pytest.mark.ddp

WORLD_SIZE = 2
LENGTH_MAX = 9
NAN = float("nan")
PHASES = ("mid", "final")

METRICS: dict[str, Callable[..., Metric]] = {
    "reward": lambda **kw: RewardMetric(nan_strategy="ignore", **kw),
    "reward@1e8": lambda **kw: RewardMetric(**kw),  # rewards 1e8 + U(0, 1): the std must survive the offset
    "advantage": lambda **kw: AdvantageMetric(scale=True, std="sample", **kw),
    "accuracy": lambda **kw: AccuracyMetric(threshold=0.8, nan_strategy=0.0, **kw),
    "pass@2": lambda **kw: PassAtK(k=2, **kw),
    "maj@3": lambda **kw: MajAtK(k=3, **kw),
    "pass^2": lambda **kw: PassHatK(k=2, stderr=True, **kw),
    "length": lambda **kw: CompletionLength(max_length=LENGTH_MAX, **kw),
    "share": lambda **kw: Share(**kw),
    "token_mean": lambda **kw: TokenMean(**kw),
}

# Number of updates on (rank 0, rank 1); "hand" uses the hand-made batches of HAND.
SCENARIOS: dict[str, tuple[int, int]] = {"hand": (1, 1), "rank1_idle": (4, 0), "rank0_idle": (0, 3), "uneven": (1, 3)}

Batch = tuple[np.ndarray, ...]
HAND: dict[str, tuple[list[Batch], list[Batch]]] = {
    "reward": ([(np.array([[1.0, 0.0]]),)], [(np.array([[0.5, NAN]]),)]),
    "reward@1e8": ([(np.array([[1e8 + 0.25, 1e8 + 0.75]]),)], [(np.array([[1e8 + 0.5]]),)]),
    "advantage": ([(np.array([[1.0, 0.0]]),)], [(np.array([[1.0, 1.0], [NAN, 0.5]]),)]),
    "accuracy": ([(np.array([[1.0, 0.8]], dtype=np.float32),)], [(np.array([[0.9, NAN, 0.0]], dtype=np.float32),)]),
    "pass@2": ([(np.array([[1, 0, 0, 0]]),)], [(np.array([[1, 1, 0, 0]]),)]),
    "maj@3": ([(np.array([[3, 5, 5]]), np.array([[0, 1, 1]]))], [(np.array([[-1, -1, -1]]), np.array([[0, 0, 0]]))]),
    "pass^2": ([(np.array([[1, 1, 1, 0]]),)], [(np.array([[1, 1, 0, 0]]),)]),
    "length": ([(np.array([1, 9, 3]),)], [(np.array([3, 3]),)]),
    "share": ([(np.array([True, False]),)], [(np.array([True, True, False]),)]),
    "token_mean": (
        [(np.array([[-0.5, -1.0, 7.0]]), np.array([[True, True, False]]))],
        [(np.array([[-1.5, 7.0, 7.0]]), np.array([[True, False, False]]))],
    ),
}
_HALF = 0.5 / (math.sqrt(0.5) + ADVANTAGE_EPS)  # rank 0: {1, 0}, sample std sqrt(1/2)
HAND_EXPECTED: dict[str, dict[str, float]] = {
    "reward": {"mean": 0.5, "std": math.sqrt(1 / 6), "min": 0.0, "max": 1.0},
    "reward@1e8": {"mean": 1e8 + 0.5, "std": math.sqrt(1 / 24), "min": 1e8 + 0.25, "max": 1e8 + 0.75},
    "advantage": {"mean": 0.0, "std": math.sqrt(2 * _HALF**2 / 5), "abs_mean": 2 * _HALF / 5, "zero_std_frac": 2 / 3},
    # 2 of 5 samples correct, from 2 prompts (one row a rank): the interval counts the prompts
    "accuracy": dict(zip(("accuracy", "ci_low", "ci_high"), (0.4, *ref_wilson(2, 5, trials=2)), strict=True)),
    "pass@2": {"value": (0.5 + 5 / 6) / 2},
    "maj@3": {"value": 0.5},
    # per prompt C(3,2)/C(4,2) = 1/2 and C(2,2)/C(4,2) = 1/6: sample std of the two over sqrt(2)
    "pass^2": {"pass^2": 1 / 3, "stderr": (1 / 2 - 1 / 6) / 2},
    "length": {"mean": 19 / 5, "p50": 3.0, "p95": 9.0, "max": 9.0},
    "share": {"value": 3 / 5},
    "token_mean": {"value": -1.0},
}


def _random_batch(name: str, rng: np.random.Generator) -> Batch:
    p = int(rng.integers(0, 6))
    if name == "reward@1e8":
        return (1e8 + rng.random((p, int(rng.integers(1, 7)))),)
    if name in ("reward", "accuracy"):
        return (random_rewards(rng, p, int(rng.integers(1, 7))).astype(np.float32),)
    if name == "advantage":
        return (random_rewards(rng, p + 1, int(rng.integers(1, 7))),)
    if name in ("pass@2", "pass^2"):
        return (rng.random((p, int(rng.integers(2, 8)))) < 0.5,)
    if name == "length":
        return (rng.integers(0, LENGTH_MAX + 1, size=p * 3),)
    if name == "share":
        return (rng.random(p * 2) < 0.3,)
    if name == "token_mean":
        shape = (p, int(rng.integers(1, 6)))
        return rng.normal(-1.0, 1.0, size=shape), rng.random(shape) < 0.7
    ids = rng.integers(-1, 4, size=(p, int(rng.integers(3, 8))))
    return ids, ((ids == 2) ^ (rng.random(ids.shape) < 0.1)).astype(int)


def rank_batches(scenario: str, name: str) -> tuple[list[Batch], list[Batch]]:
    """The update arguments of each rank, the same in the test and in the spawned processes."""
    if scenario == "hand":
        return HAND[name]
    rng = np.random.default_rng(zlib.crc32(f"{scenario}/{name}".encode()))
    n0, n1 = SCENARIOS[scenario]
    batches = [_random_batch(name, rng) for _ in range(n0 + n1)]
    return batches[:n0], batches[n0:]


def phase_batches(batches: list[Batch], phase: str) -> list[Batch]:
    return batches[: len(batches) // 2] if phase == "mid" else batches


def as_floats(value: dict[str, torch.Tensor] | torch.Tensor) -> dict[str, float]:
    if isinstance(value, torch.Tensor):
        return {"value": value.item()}
    return {key: v.item() for key, v in value.items()}


def _metrics_worker(rank: int, world_size: int) -> dict[tuple[str, str, str], dict[str, Any]]:
    out = {}
    for scenario in SCENARIOS:
        for name, make in METRICS.items():
            syncs: list[tuple[int, ...]] = []

            def counting_sync(
                tensor: torch.Tensor, group: Any = None, syncs: list[tuple[int, ...]] = syncs
            ) -> list[torch.Tensor]:
                syncs.append(tuple(tensor.shape))
                return gather_all_tensors(tensor, group)

            metric = make(dist_sync_fn=counting_sync)
            mine = rank_batches(scenario, name)[rank]
            done = 0
            for phase in PHASES:
                for batch in phase_batches(mine, phase)[done:]:
                    metric.update(*(torch.as_tensor(a) for a in batch))
                    done += 1
                syncs.clear()
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    value = metric.compute()
                out[(scenario, name, phase)] = {
                    "value": as_floats(value),
                    "syncs": list(syncs),
                    "warned": any(BEFORE_UPDATE.replace("\\", "") in str(w.message) for w in caught),
                }
    return out


@pytest.fixture(scope="module")
def ddp_results() -> list[dict[tuple[str, str, str], dict[str, Any]]]:
    return run_ddp(_metrics_worker, WORLD_SIZE)


def single_process(name: str, batches: list[Batch]) -> dict[str, float]:
    metric = METRICS[name]()
    for batch in batches:
        metric.update(*(torch.as_tensor(a) for a in batch))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "compute before update" when there is no batch at all
        return as_floats(metric.compute())


def reference(name: str, batches: list[Batch]) -> dict[str, float]:
    """Independent plain NumPy / Python result over ``batches``."""
    if name in ("reward", "reward@1e8"):
        v = np.concatenate([b[0].astype(np.float64).ravel() for b in batches] + [np.zeros(0)])
        v = v[~np.isnan(v)]
        if not v.size:
            return dict.fromkeys(("mean", "std", "min", "max"), NAN)
        return {"mean": v.mean(), "std": v.std(), "min": v.min(), "max": v.max()}
    if name == "advantage":
        if not batches:
            return dict.fromkeys(("mean", "std", "abs_mean", "zero_std_frac"), NAN)
        return reference_advantage_stats([b[0] for b in batches], scale=True, std="sample")
    if name == "accuracy":
        v = np.concatenate([np.nan_to_num(b[0], nan=0.0).ravel() for b in batches] + [np.zeros(0, np.float32)])
        successes, prompts = int((v > np.float32(0.8)).sum()), sum(b[0].shape[0] for b in batches)
        low, high = ref_wilson(successes, v.size, trials=prompts)
        return {"accuracy": successes / v.size if v.size else NAN, "ci_low": low, "ci_high": high}
    if name in ("length", "share", "token_mean"):
        return _completion_reference(name, batches)
    if name == "pass^2":
        per_prompt = [math.comb(int(sum(row)), 2) / math.comb(len(row), 2) for b in batches for row in b[0].astype(int)]
        if not per_prompt:
            return {"pass^2": NAN, "stderr": NAN}
        stderr = float(np.std(per_prompt, ddof=1) / math.sqrt(len(per_prompt))) if len(per_prompt) > 1 else NAN
        return {"pass^2": float(np.mean(per_prompt)), "stderr": stderr}
    if name == "pass@2":
        per_prompt = [x for b in batches for x in ref_pass_at_k(b[0].astype(int).tolist(), 2)]
    else:
        per_prompt = [x for b in batches for x in ref_maj_at_k(b[0].tolist(), b[1].tolist(), 3)]
    return {"value": float(np.mean(per_prompt)) if per_prompt else NAN}


def _completion_reference(name: str, batches: list[Batch]) -> dict[str, float]:
    if name == "length":
        v = np.concatenate([b[0] for b in batches] + [np.zeros(0, dtype=np.int64)])
        if not v.size:
            return dict.fromkeys(("mean", "p50", "p95", "max"), NAN)
        quantile = lambda q: float(np.quantile(v, q, method="inverted_cdf"))  # noqa: E731
        return {"mean": float(v.mean()), "p50": quantile(0.5), "p95": quantile(0.95), "max": float(v.max())}
    if name == "share":
        v = np.concatenate([b[0] for b in batches] + [np.zeros(0, dtype=bool)])
        return {"value": float(v.mean()) if v.size else NAN}
    v = np.concatenate([b[0][b[1]] for b in batches] + [np.zeros(0)])
    return {"value": float(v.mean()) if v.size else NAN}


# The float64 mean of rewards near 1e8 is only good to ~1e-8, which bounds the std to ~1e-16 * mean / std.
TOLERANCE: dict[str, float] = {"reward@1e8": 1e-7}
CASES = [(s, m, p) for s in SCENARIOS for m in METRICS for p in PHASES]


@pytest.mark.parametrize(("scenario", "name", "phase"), CASES)
def test_ddp_result_equals_single_process_over_union(ddp_results, scenario: str, name: str, phase: str) -> None:
    union = [b for rank_part in rank_batches(scenario, name) for b in phase_batches(rank_part, phase)]
    expected, tol = reference(name, union), TOLERANCE.get(name, 1e-9)
    single = single_process(name, union)
    assert nan_equal(single, expected, tol=tol)
    for rank in range(WORLD_SIZE):
        got = ddp_results[rank][(scenario, name, phase)]["value"]
        assert nan_equal(got, single, tol=0.0), f"rank {rank}: {got} != {single} (one process)"  # bit for bit
    if scenario == "hand" and phase == "final":
        assert nan_equal(ddp_results[0][(scenario, name, phase)]["value"], HAND_EXPECTED[name], tol=1e-9)


@pytest.mark.parametrize(("scenario", "name", "phase"), CASES)
def test_every_rank_runs_the_same_collectives(ddp_results, scenario: str, name: str, phase: str) -> None:
    syncs = [ddp_results[rank][(scenario, name, phase)]["syncs"] for rank in range(WORLD_SIZE)]
    assert syncs[0] == syncs[1]
    assert len(syncs[0]) == len(METRICS[name]()._defaults)  # one gather per state


def test_compute_on_a_rank_without_update(ddp_results) -> None:
    # torchmetrics warns "compute ... before update" on local rank 0 only (its rank_zero_warn); the
    # synced value is still the union's (checked above), because the rank still joins the gathers.
    for name in METRICS:
        assert ddp_results[0][("rank0_idle", name, "final")]["warned"]
        assert not ddp_results[1][("rank0_idle", name, "final")]["warned"]
        assert not any(ddp_results[r][("rank1_idle", name, "final")]["warned"] for r in range(WORLD_SIZE))


# ----------------------------------------------------------------------------- run_ddp itself
def _fails_on_rank_1(rank: int, world_size: int, message: str) -> None:
    if rank == 1:
        raise ValueError(message)
    dist.barrier()  # rank 0 would wait here forever without run_ddp's error handling


def _crashes_on_rank_1(rank: int, world_size: int) -> None:
    if rank == 1:
        os._exit(3)  # like a segfault or an OOM kill: no Python traceback
    dist.barrier()


def _hangs(rank: int, world_size: int) -> None:
    time.sleep(3600)


def test_run_ddp_reports_the_failing_rank() -> None:
    with pytest.raises(AssertionError, match=r"(?s)run_ddp\(_fails_on_rank_1\): rank 1 raised:.*ValueError: boom 42"):
        run_ddp(_fails_on_rank_1, WORLD_SIZE, "boom 42")


def test_run_ddp_reports_a_crashed_rank() -> None:
    with pytest.raises(AssertionError, match=r"run_ddp\(_crashes_on_rank_1\): rank 1 exited with code 3"):
        run_ddp(_crashes_on_rank_1, WORLD_SIZE)


@pytest.mark.waits  # 3 s of the timeout
def test_run_ddp_turns_a_hang_into_a_failure() -> None:
    with pytest.raises(AssertionError, match=r"run_ddp\(_hangs\): timed out after 3 s; ranks still running: \[0, 1\]"):
        run_ddp(_hangs, WORLD_SIZE, timeout_s=3)


def test_run_ddp_rejects_unpicklable_fn() -> None:
    with pytest.raises(AssertionError, match=r"fn and args must be picklable \(module-level fn\)"):
        run_ddp(lambda rank, world_size: None, WORLD_SIZE)


def test_run_ddp_rejects_an_empty_world() -> None:
    with pytest.raises(ValueError, match=r"`run_ddp\(world_size=...\)` must be >= 1, got 0"):
        run_ddp(_hangs, 0)
