"""The evaluation round: data, inference, compute, record, as one function.

`run_round(module, eval_sets, evaluate_fn, ...)` is what every caller shares: the callback's
synchronous rounds, asynchronous rounds on a weight snapshot, and the standalone `evaluate`
command. It depends on nothing but the module replica, the eval sets (cut into a global list of
batches that does not depend on the number of devices) and the run seed (from which each sample's
own seed derives); under `torch.distributed` each rank evaluates its deal of the batches, and every
rank runs the same collectives in the same order.
"""

from __future__ import annotations

import contextlib
import json
import copy
import pickle
import random
import time
import traceback
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import Tensor, nn
from torchmetrics import Metric

from areal_lightning.data.eval_sets import EvalSet
from areal_lightning.data.fingerprint import check_fingerprints, fingerprint
from areal_lightning.data.sharding import sample_seeds, shard_for_rank

EvaluateFn = Callable[[nn.Module, Sequence["EvalBatch"], "EvalContext"], Mapping[str, Any] | None]


@dataclass(frozen=True)
class EvalBatch:
    """A batch of one eval set: the samples, their indices in the set and their own seeds."""

    indices: list[int]
    samples: list[Any]
    seeds: list[int]


@dataclass
class EvalContext:
    """What `evaluate_fn` knows about the round besides the module and its batches.

    Update the metric objects in `metrics` (created by `evaluate_fn` if absent, the same on every
    rank); they are reduced exactly across ranks at the end of the round. Call `record_sample`
    for generations worth showing; those with `index < max_table_rows` are kept.
    """

    dataset: str
    rank: int
    world_size: int
    global_step: int
    epoch: int
    device: torch.device
    seed: int
    options: Mapping[str, Any] = field(default_factory=dict)
    metrics: dict[str, Metric] = field(default_factory=dict)
    num_samples: int = 0
    max_table_rows: int = 0
    table_rows: list[dict[str, Any]] = field(default_factory=list)

    def metric(self, name: str, factory: Callable[[], Metric]) -> Metric:
        """The metric called `name`, created on this round's device on first use."""
        if name not in self.metrics:
            metric = factory()
            dtype = metric.dtype
            metric = metric.to(self.device)
            if metric.dtype != dtype:  # torchmetrics' .to() resets a float64 metric to float32
                metric.set_dtype(dtype)
            self.metrics[name] = metric
        return self.metrics[name]

    def record_sample(self, index: int, **row: Any) -> None:
        if index < self.max_table_rows:
            self.table_rows.append({"index": index, **row})


@dataclass
class SetResult:
    """One eval set's reduced result of a round."""

    dataset: str
    metrics: dict[str, float]
    num_samples: int
    num_prompts: int
    eval_secs: float
    table_rows: list[dict[str, Any]]


class _RankReport(NamedTuple):
    """What each rank contributes to the round's one object gather."""

    error: str | None
    num_prompts: int
    index_sum: int  # with num_prompts, checks that every sample was evaluated exactly once
    num_samples: int
    extras: dict[str, tuple[float, float]]
    table_rows: list[dict[str, Any]]
    metric_names: list[str]


class EvalRoundError(RuntimeError):
    """`evaluate_fn` failed on at least one rank; raised on every rank, so none is left waiting."""


def dist_info() -> tuple[int, int]:
    """(rank, world size) of the default process group, (0, 1) without one."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def _all_gather_object(obj: Any) -> list[Any]:
    rank, world = dist_info()
    if world == 1:
        return [obj]
    out: list[Any] = [None] * world
    torch.distributed.all_gather_object(out, obj)
    return out


def check_eval_sets_consistent(eval_sets: Sequence[EvalSet]) -> None:
    """Raises `EvalSetMismatchError` on every rank when ranks hold different eval sets.

    The fingerprint covers what the deal and the outcomes depend on besides the samples: batch
    size, costs and options. Ranks that cut different batches would evaluate some samples twice
    and others never, with the right total count.
    """
    local = {s.name: fingerprint(s.name, [_layout_key(s), *s.keys]) for s in eval_sets}
    check_fingerprints(_all_gather_object(local))


def _layout_key(eval_set: EvalSet) -> str:
    layout = {"batch_size": eval_set.batch_size, "max_batch_cost": eval_set.max_batch_cost,
              "costs": eval_set.costs, "options": dict(eval_set.options)}
    return json.dumps(layout, sort_keys=True, default=repr)


@contextlib.contextmanager
def evaluation_mode(module: nn.Module) -> Iterator[None]:
    """`eval()` and `no_grad()` for the round; afterwards each submodule's train flag and the
    global RNG states are as they were, so evaluating does not change what training does next."""
    modes = {m: m.training for m in module.modules()}
    cpu_rng, py_rng, np_rng = torch.get_rng_state(), random.getstate(), np.random.get_state()
    cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    module.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        for m, was_training in modes.items():
            m.train(was_training)
        torch.set_rng_state(cpu_rng)
        random.setstate(py_rng)
        np.random.set_state(np_rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state_all(cuda_rng)


def module_device(module: nn.Module) -> torch.device:
    param = next(module.parameters(), None)
    return param.device if param is not None else torch.device("cpu")


def local_batches(eval_set: EvalSet, seed: int, rank: int, world_size: int) -> list[EvalBatch]:
    """This rank's deal of the eval set's global batches, each sample with its own seed."""
    batches = []
    for indices in shard_for_rank(eval_set.costs, eval_set.batch_size, rank, world_size,
                                  max_batch_cost=eval_set.max_batch_cost):
        samples = [eval_set.samples[i] for i in indices]
        batches.append(EvalBatch(indices=list(indices), samples=samples, seeds=sample_seeds(seed, eval_set.name, indices)))
    return batches


def _flatten(name: str, value: Any) -> dict[str, float]:
    if isinstance(value, Mapping):
        return {(name if key == name else f"{name}/{key}"): float(v) for key, v in value.items()}
    return {name: float(value)}


def _local_extras(out: Mapping[str, Any], num_prompts: int) -> dict[str, tuple[float, float]]:
    """Non-metric outputs as (weighted sum, weight): per-sample tensors exactly, scalars as
    this rank's mean over its prompts."""
    extras = {}
    for key, value in out.items():
        if isinstance(value, Metric):
            raise TypeError(
                f"evaluate_fn returned the metric object {key!r}; put metric objects in ctx.metrics "
                "(the same on every rank) so the round can reduce them exactly"
            )
        if isinstance(value, Tensor) and value.numel() != 1:
            values = value.detach().double().flatten()
            extras[key] = (float(values.sum()), float(values.numel()))
        elif num_prompts:
            extras[key] = (float(value) * num_prompts, float(num_prompts))
    return extras


def _merge_extras(per_rank: Sequence[Mapping[str, tuple[float, float]]]) -> dict[str, float]:
    totals: dict[str, list[float]] = {}
    for extras in per_rank:
        for key, (weighted, weight) in extras.items():
            acc = totals.setdefault(key, [0.0, 0.0])
            acc[0] += weighted
            acc[1] += weight
    return {key: (s / w if w else float("nan")) for key, (s, w) in totals.items()}


def _with_progress(batches: list[EvalBatch], name: str, show: bool) -> Sequence[EvalBatch]:
    if not show or len(batches) < 2:
        return batches
    from tqdm.auto import tqdm  # Lightning's own progress-bar dependency

    return tqdm(batches, desc=f"eval {name}", unit="batch", leave=False, dynamic_ncols=True)


def _metric_template(metric: Metric) -> Metric | None:
    """A fresh CPU copy of `metric` (states reset) for a rank that lacks it; None if it cannot travel."""
    try:
        template = copy.deepcopy(metric).to("cpu")
        template.reset()
        pickle.dumps(template)  # fail here, on this rank alone, rather than inside the collective
    except Exception:  # noqa: BLE001 - every rank sees the None and raises the same error below
        return None
    return template


def _share_missing_metrics(ctx: EvalContext, names_per_rank: Sequence[Sequence[str]], dataset: str) -> None:
    """Gives this rank a fresh copy of every metric that another rank created and it did not.

    A rank dealt no batch never reaches a ``ctx.metric(...)`` written inside the batch loop; its
    metrics would differ from the other ranks', and their ``compute()`` syncs would not pair up
    (the ranks hang). All ranks see the same gathered names, so they all agree whether the extra
    gather of templates runs, and whether a metric that cannot be copied is an error.
    """
    union = sorted(set().union(*names_per_rank))
    if all(len(names) == len(union) for names in names_per_rank):
        return
    offered = _all_gather_object({name: _metric_template(m) for name, m in ctx.metrics.items()})
    missing_somewhere = [name for name in union if any(name not in names for names in names_per_rank)]
    stuck = [name for name in missing_somewhere if all(o.get(name) is None for o in offered)]
    if stuck:
        raise EvalRoundError(
            f"evaluation of eval set {dataset!r} failed: metrics {stuck} were created on some ranks only (a rank "
            "dealt no batch never calls ctx.metric inside the batch loop) and cannot be copied to the others; "
            "create every metric with ctx.metric(...) before the batch loop"
        )
    for name in missing_somewhere:
        if name not in ctx.metrics:
            template = next(o[name] for o in offered if o.get(name) is not None)
            ctx.metrics[name] = template.to(ctx.device)


def evaluate_set(
    module: nn.Module, eval_set: EvalSet, evaluate_fn: EvaluateFn, *, seed: int, global_step: int, epoch: int,
    max_table_rows: int = 0, show_progress: bool = False,
) -> SetResult:
    """Runs one eval set on this rank's deal and reduces it over all ranks.

    `show_progress` draws a progress bar over this rank's batches on rank 0.
    """
    rank, world = dist_info()
    start = time.perf_counter()
    batches = local_batches(eval_set, seed, rank, world)
    num_prompts = sum(len(b.indices) for b in batches)
    ctx = EvalContext(
        dataset=eval_set.name, rank=rank, world_size=world, global_step=global_step, epoch=epoch,
        device=module_device(module), seed=seed, options=eval_set.options, max_table_rows=max_table_rows,
    )
    error = None
    out: Mapping[str, Any] = {}
    try:
        with evaluation_mode(module):
            out = evaluate_fn(module, _with_progress(batches, eval_set.name, show_progress and rank == 0), ctx) or {}
        extras = _local_extras(out, num_prompts)
    except Exception as err:  # noqa: BLE001 - reported on every rank below, so no rank waits forever
        error, extras = f"rank {rank}: {type(err).__name__}: {err}\n{traceback.format_exc()}", {}
    # One object gather carries errors, counts, extras, table rows and metric names: the same
    # collective on every rank.
    report = _RankReport(error, num_prompts, sum(i for b in batches for i in b.indices), ctx.num_samples or num_prompts,
                         extras, ctx.table_rows, sorted(ctx.metrics))
    gathered: list[_RankReport] = _all_gather_object(report)
    errors = [g.error for g in gathered if g.error]
    if errors:
        raise EvalRoundError(f"evaluation of eval set {eval_set.name!r} failed: " + "\n".join(errors))
    _share_missing_metrics(ctx, [g.metric_names for g in gathered], eval_set.name)
    metrics: dict[str, float] = {}
    try:
        with warnings.catch_warnings():
            # A rank dealt no batch never updates its metrics; its compute() still joins the sync.
            warnings.filterwarnings("ignore", message=".*compute.*before.*update.*")
            for name in sorted(ctx.metrics):
                metrics.update(_flatten(name, ctx.metrics[name].compute()))
    except Exception as err:
        # A metric whose compute() fails or is not a scalar (or a mapping of scalars) is a failed
        # round that `on_error` decides about, not a crash of training. compute() runs on values
        # already synced, so every rank fails here alike and none is left waiting.
        raise EvalRoundError(
            f"evaluation of eval set {eval_set.name!r} failed: computing metric {name!r} raised "
            f"{type(err).__name__}: {err} (a metric must compute a scalar or a mapping of scalars)"
        ) from err
    metrics.update(_merge_extras([g.extras for g in gathered]))
    size = len(eval_set.samples)
    total_prompts = sum(g.num_prompts for g in gathered)
    if (total_prompts, sum(g.index_sum for g in gathered)) != (size, size * (size - 1) // 2):
        raise EvalRoundError(
            f"eval set {eval_set.name!r}: the ranks evaluated {total_prompts} prompts, not each of the {size} exactly "
            "once; they must build the same eval sets and deal them with the same world size"
        )
    rows = sorted((row for g in gathered for row in g.table_rows), key=lambda r: r["index"])
    return SetResult(
        dataset=eval_set.name, metrics=metrics, num_samples=sum(g.num_samples for g in gathered), num_prompts=total_prompts,
        eval_secs=time.perf_counter() - start, table_rows=rows,
    )


def run_round(
    module: nn.Module, eval_sets: Sequence[EvalSet], evaluate_fn: EvaluateFn, *, seed: int, global_step: int,
    epoch: int, max_table_rows: int = 0, show_progress: bool = False,
) -> list[SetResult]:
    """Evaluates every eval set, in order, on the module replica; returns the reduced results.

    Raises:
        EvalRoundError: on every rank, when `evaluate_fn` raised on any rank.
    """
    return [
        evaluate_set(module, s, evaluate_fn, seed=seed, global_step=global_step, epoch=epoch,
                     max_table_rows=max_table_rows, show_progress=show_progress)
        for s in eval_sets
    ]
