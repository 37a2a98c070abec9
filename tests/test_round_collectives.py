"""A round reduces every metric state of every eval set in one gather: counted on 2 gloo ranks by
wrapping torch.distributed's collectives in the ranks, with the default evaluation's metrics and
with states of every kind of reduction (sum, min, max, mean, cat, a user's function), whose values
are bit for bit those of one process."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch
from ddp_utils import run_ddp
from torchmetrics import MaxMetric, Metric, MinMetric

from areal_lightning.eval_round import EvalBatch, EvalContext, EvalSet, local_batches, run_round

TIMEOUT_S = 240.0
COLLECTIVES = (
    "all_gather",
    "all_gather_object",
    "all_gather_into_tensor",
    "all_reduce",
    "broadcast",
    "broadcast_object_list",
    "gather",
    "gather_object",
    "reduce",
    "scatter",
    "barrier",
)


@contextmanager
def counted() -> Iterator[tuple[Counter[str], Counter[str]]]:
    """Counts torch.distributed's collectives: as called (``torch.distributed.<name>``), and as run
    by the process group (``distributed_c10d``'s, which an object gather calls inside)."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    called: Counter[str] = Counter()
    ran: Counter[str] = Counter()
    originals = {(mod, name): getattr(mod, name) for mod in (dist, c10d) for name in COLLECTIVES}

    def wrap(counter: Counter[str], name: str, fn: Any) -> Any:
        def counting(*args: Any, **kwargs: Any) -> Any:
            counter[name] += 1
            return fn(*args, **kwargs)

        return counting

    for (mod, name), fn in originals.items():
        setattr(mod, name, wrap(called if mod is dist else ran, name, fn))
    try:
        yield called, ran
    finally:
        for (mod, name), fn in originals.items():
            setattr(mod, name, fn)


def _default_rounds(rank: int, world_size: int) -> list[dict[str, Any]]:
    """Two rounds of the default evaluation over two eval sets: every rank dealt batches of both,
    then the hard set in one batch (rank 1 idle there; it has the metrics all the same: the default
    evaluation creates them before its batch loop)."""
    from areal_lightning.app.builders import build_eval_sets, build_module
    from areal_lightning.app.config import load_config
    from areal_lightning.rl.rollout_eval import rollout_evaluate

    out = []
    for hard_size, hard_batch in ((48, 24), (16, 64)):
        cfg = load_config(
            None,
            [
                "eval_sets.easy.size=48",
                "eval_sets.easy.batch_size=24",
                f"eval_sets.hard.size={hard_size}",
                f"eval_sets.hard.batch_size={hard_batch}",
                "eval_sets.hard.digits=2",
                "eval_sets.hard.n_samples=2",
                "grpo.warmup_steps=0",
            ],
        )
        module = build_module(cfg)
        sets = build_eval_sets(cfg, module.task)
        with counted() as (called, ran):
            results = run_round(module, sets, rollout_evaluate, seed=1, global_step=0, epoch=0)
        out.append({"called": dict(called), "ran": dict(ran), "metrics": {r.dataset: r.metrics for r in results}})
    return out


@pytest.mark.ddp
def test_a_default_round_of_two_eval_sets_reduces_in_one_object_gather() -> None:
    ranks = run_ddp(_default_rounds, 2, timeout_s=TIMEOUT_S)
    (busy, idle) = ranks[0]
    assert [r["called"] for r in ranks[1]] == [busy["called"], idle["called"]]
    assert busy["called"] == idle["called"] == {"all_gather_object": 1}
    assert busy["ran"] == {"all_gather": 2}  # an object gather runs two: the sizes, then the bytes
    assert [r["metrics"] for r in ranks[0]] == [r["metrics"] for r in ranks[1]]
    assert {"accuracy", "reward/mean", "pass@4", "maj@4", "reward/min"} <= set(busy["metrics"]["easy"])


# ---- every kind of state --------------------------------------------------------------------------


def _first_and_sum(states: torch.Tensor) -> torch.Tensor:
    """A user's own reduction: the first rank's value plus the others' times ten."""
    return states[0] + 10 * states[1:].sum(0)


class _Kinds(Metric):
    """One state of each reduction kind, and an int64 histogram."""

    full_state_update = False

    def __init__(self) -> None:
        super().__init__()
        self.add_state("hist", torch.zeros(4, dtype=torch.int64), dist_reduce_fx="sum")
        self.add_state("low", torch.tensor(torch.inf, dtype=torch.float64), dist_reduce_fx="min")
        self.add_state("high", torch.tensor(-torch.inf, dtype=torch.float64), dist_reduce_fx="max")
        self.add_state("avg", torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="mean")
        self.add_state("seen", [], dist_reduce_fx="cat")
        self.add_state("mine", torch.zeros(2, dtype=torch.float32), dist_reduce_fx=_first_and_sum)

    def update(self, values: torch.Tensor) -> None:
        self.hist += torch.bincount((values * 4).long().clamp(0, 3), minlength=4)
        self.low = torch.minimum(self.low, values.min())
        self.high = torch.maximum(self.high, values.max())
        self.avg = self.avg + values.sum()
        self.seen.append(values.float())
        self.mine = self.mine + torch.stack([values.sum(), values.square().sum()]).float()

    def compute(self) -> dict[str, float]:
        seen = torch.cat(self.seen) if isinstance(self.seen, list) else self.seen
        return {
            **{f"hist{i}": float(v) for i, v in enumerate(self.hist.tolist())},
            "low": float(self.low),
            "high": float(self.high),
            "avg": float(self.avg),
            "seen_sum": math.fsum(seen.tolist()),  # exact whatever the order the ranks' parts came in
            "seen_n": float(seen.numel()),
            "mine0": float(self.mine[0]),
            "mine1": float(self.mine[1]),
        }


def _value(seed: int) -> float:
    return float(torch.rand((), generator=torch.Generator().manual_seed(seed), dtype=torch.float64))


def _kinds_fn(module: torch.nn.Module, batches: list[EvalBatch], ctx: EvalContext) -> dict[str, Any]:
    for batch in batches:
        values = torch.tensor([_value(s) for s in batch.seeds], dtype=torch.float64)
        ctx.metric("kinds", _Kinds).update(values)
        ctx.metric("min", MinMetric).update(values)
        ctx.metric("max", MaxMetric).update(values)
    return {"per_sample": torch.tensor([_value(s) for b in batches for s in b.seeds], dtype=torch.float64)}


def _kinds_sets() -> list[EvalSet]:
    # "busy": both ranks dealt batches; "idle": one batch, so one rank lacks every metric.
    return [EvalSet("busy", list(range(23)), batch_size=4), EvalSet("idle", list(range(3)), batch_size=8)]


def _kinds_round(rank: int, world_size: int) -> dict[str, Any]:
    with counted() as (called, _):
        results = run_round(torch.nn.Identity(), _kinds_sets(), _kinds_fn, seed=5, global_step=0, epoch=0)
    return {"called": dict(called), "metrics": {r.dataset: r.metrics for r in results}}


def _rank_state(eval_set: EvalSet, rank: int) -> _Kinds:
    """The state `_Kinds` holds on `rank` of 2 (its reset state where the rank is dealt nothing)."""
    metric = _Kinds()
    for batch in local_batches(eval_set, 5, rank, 2):
        metric.update(torch.tensor([_value(s) for s in batch.seeds], dtype=torch.float64))
    return metric


@pytest.mark.ddp
def test_states_of_every_reduction_kind_reduce_in_the_same_gather_as_on_one_process() -> None:
    two = run_ddp(_kinds_round, 2, timeout_s=TIMEOUT_S)
    sets = _kinds_sets()
    one = {
        r.dataset: r.metrics for r in run_round(torch.nn.Identity(), sets, _kinds_fn, seed=5, global_step=0, epoch=0)
    }
    assert two[0]["called"] == two[1]["called"] == {"all_gather_object": 2}  # the idle set's copies: one more
    assert two[0]["metrics"] == two[1]["metrics"]
    for eval_set in sets:
        got, alone = dict(two[0]["metrics"][eval_set.name]), dict(one[eval_set.name])
        # A user's function and a mean over ranks see each rank's state (a rank dealt nothing: its
        # reset state); every other value is the one process's, bit for bit.
        ranks = [_rank_state(eval_set, r) for r in range(2)]
        mine = _first_and_sum(torch.stack([m.mine for m in ranks]))
        assert [got.pop("kinds/mine0"), got.pop("kinds/mine1")] == [float(mine[0]), float(mine[1])]
        assert got.pop("kinds/avg") == float(torch.stack([m.avg for m in ranks]).mean(0))
        alone.pop("kinds/mine0"), alone.pop("kinds/mine1"), alone.pop("kinds/avg")
        assert got == alone, eval_set.name
    assert two[0]["metrics"]["busy"]["kinds/seen_n"] == 23.0
    assert two[0]["metrics"]["idle"]["kinds/seen_n"] == 3.0
