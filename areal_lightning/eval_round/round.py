"""The evaluation round: data, inference, compute, record, as one function.

`run_round(module, eval_sets, evaluate_fn, ...)` is what every caller shares: the callback's
rounds, the standalone `evaluate` command and anything else that evaluates. It depends only on
the module replica, the eval sets (cut into a global list of batches that does not depend on the
number of devices) and the run seed (from which each sample's own seed derives). Under
`torch.distributed` each rank evaluates its deal of the batches, and every rank runs the same
collectives in the same order: one object gather, then the metrics' own syncs.

A round has two halves: `evaluate_local` (this rank's deal, no collective) and `reduce_set` (the
collectives). `run_round` runs both, one eval set after the other; an asynchronous worker runs the
first half beside training and the training thread runs the second at a step every rank agrees on.
"""

from __future__ import annotations

import time
import traceback
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn
from torchmetrics import MeanMetric, Metric

from areal_lightning.eval_round.context import BatchList, EvalBatch, EvalContext, EvalRoundError, EvaluateFn, SetResult
from areal_lightning.eval_round.eval_set import EvalSet
from areal_lightning.eval_round.isolation import evaluation_mode, module_device
from areal_lightning.eval_round.ranks import all_gather_object, dist_info
from areal_lightning.eval_round.sharding import sample_seeds, shard_for_rank


class _RankReport(NamedTuple):
    """What each rank contributes to the round's one object gather."""

    error: str | None
    num_prompts: int
    index_sum: int  # with num_prompts, checks that every sample was evaluated exactly once
    num_samples: int
    metric_names: list[str]
    extra_names: list[str]
    table_rows: list[dict[str, Any]]


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


def _extra_updates(out: Mapping[str, Any], num_prompts: int) -> dict[str, tuple[Tensor, float | Tensor]]:
    """`evaluate_fn`'s returned values as (values, weight) for a mean: a per-sample tensor counts
    each sample once, a scalar is this rank's mean over its prompts."""
    updates: dict[str, tuple[Tensor, float | Tensor]] = {}
    for key, value in out.items():
        if isinstance(value, Metric):
            raise TypeError(
                f"evaluate_fn returned the metric object {key!r}; create it with ctx.metric(...) "
                "(the same on every rank) so the round can reduce it exactly"
            )
        if isinstance(value, Tensor) and value.numel() != 1:
            updates[key] = (value.detach().double().flatten().cpu(), 1.0)
        elif num_prompts:
            updates[key] = (torch.tensor(float(value), dtype=torch.float64), float(num_prompts))
    return updates


def _with_progress(batches: Sequence[EvalBatch], name: str, show: bool) -> Sequence[EvalBatch]:
    if not show or len(batches) < 2:
        return batches
    from tqdm.auto import tqdm  # Lightning's own progress-bar dependency

    return tqdm(batches, desc=f"eval {name}", unit="batch", leave=False, dynamic_ncols=True)  # type: ignore[return-value]


def _compute_all(metrics: Mapping[str, Metric], dataset: str) -> dict[str, float]:
    out: dict[str, float] = {}
    name = ""
    try:
        with warnings.catch_warnings():
            # A rank dealt no batch never updates its metrics; its compute() still joins the sync.
            warnings.filterwarnings("ignore", message=".*compute.*before.*update.*")
            for name in sorted(metrics):
                out.update(_flatten(name, metrics[name].compute()))
    except Exception as err:
        # compute() runs on values already synced, so every rank fails here alike and none waits.
        raise EvalRoundError(
            f"evaluation of eval set {dataset!r} failed: computing metric {name!r} raised "
            f"{type(err).__name__}: {err} (a metric must compute a scalar or a mapping of scalars)"
        ) from err
    return out


def _check_same_metrics(gathered: Sequence[_RankReport], dataset: str) -> None:
    union = sorted(set().union(*(g.metric_names for g in gathered)))
    lacking = {rank: sorted(set(union) - set(g.metric_names)) for rank, g in enumerate(gathered)}
    lacking = {rank: names for rank, names in lacking.items() if names}
    if lacking:
        raise EvalRoundError(
            f"evaluation of eval set {dataset!r} failed: ranks created different metrics ({lacking} missing); "
            "create every metric with ctx.metric(...) before the batch loop"
        )


@dataclass
class LocalSetResult:
    """One eval set's result on one rank, before the reduction over ranks.

    What `evaluate_local` returns and `reduce_set` takes: the rank's report (errors, counts, names,
    table rows), its metric objects with their unsynced states, and `evaluate_fn`'s returned values.
    An async worker computes it beside training; the training thread reduces it.
    """

    dataset: str
    report: _RankReport
    metrics: dict[str, Metric] = field(default_factory=dict)
    updates: dict[str, tuple[Tensor, float | Tensor]] = field(default_factory=dict)
    eval_secs: float = 0.0

    @classmethod
    def failed(cls, dataset: str, message: str) -> LocalSetResult:
        """A result that carries only an error, so the reduction still runs and raises on every rank."""
        return cls(dataset, _RankReport(message, 0, 0, 0, [], [], []))


def evaluate_local(
    module: nn.Module, eval_set: EvalSet, evaluate_fn: EvaluateFn, *, seed: int, global_step: int, epoch: int,
    rank: int, world_size: int, batches: list[EvalBatch] | None = None, max_table_rows: int = 0,
    show_progress: bool = False,
) -> LocalSetResult:
    """Runs `evaluate_fn` on rank `rank`'s deal of one eval set; no collective.

    Args:
        batches: this rank's deal, when computed already (`local_batches`); None deals it here.

    An exception of `evaluate_fn` is caught into the report (with its traceback), so that
    `reduce_set` raises it on every rank instead of leaving the others waiting.
    """
    start = time.perf_counter()
    if batches is None:
        batches = local_batches(eval_set, seed, rank, world_size)
    num_prompts = sum(len(b.indices) for b in batches)
    ctx = EvalContext(
        dataset=eval_set.name, rank=rank, world_size=world_size, global_step=global_step, epoch=epoch,
        device=module_device(module), seed=seed, options=eval_set.options, max_table_rows=max_table_rows,
    )
    error, updates = None, {}
    with evaluation_mode(module):
        try:  # inside the block: `evaluation_mode` restores the RNG states only on a normal exit
            shown = _with_progress(BatchList(batches, ctx), eval_set.name, show_progress and rank == 0)
            updates = _extra_updates(evaluate_fn(module, shown, ctx) or {}, num_prompts)
        except Exception as err:  # noqa: BLE001 - reported on every rank by reduce_set, so no rank waits forever
            error = f"rank {rank}: {type(err).__name__}: {err}\n{traceback.format_exc()}"
    report = _RankReport(error, num_prompts, sum(i for b in batches for i in b.indices), ctx.num_samples or num_prompts,
                         sorted(ctx.metrics), sorted(updates), ctx.table_rows)
    return LocalSetResult(eval_set.name, report, ctx.metrics, updates, time.perf_counter() - start)


def reduce_set(local: LocalSetResult, eval_set: EvalSet, device: torch.device | None = None) -> SetResult:
    """Reduces one eval set's per-rank results over all ranks: the same collectives on every rank
    (one object gather, then the metrics' own syncs).

    Args:
        device: move the metric states here first (the training device, whose backend syncs them);
            None keeps them where they are.

    Raises:
        EvalRoundError: on every rank, when `evaluate_fn` raised on any rank or the ranks disagree.
    """
    start = time.perf_counter()
    gathered: list[_RankReport] = all_gather_object(local.report)
    errors = [g.error for g in gathered if g.error]
    if errors:
        raise EvalRoundError(f"evaluation of eval set {eval_set.name!r} failed: " + "\n".join(errors))
    _check_same_metrics(gathered, eval_set.name)
    metrics_in = local.metrics if device is None else {k: _moved(m, device) for k, m in local.metrics.items()}
    # Returned values reduce through torchmetrics too: one float64 mean per name any rank returned.
    extras: dict[str, Metric] = {}
    for name in sorted(set().union(*(g.extra_names for g in gathered))):
        extras[name] = MeanMetric(nan_strategy="disable").set_dtype(torch.float64)
        if device is not None:
            extras[name] = _moved(extras[name], device)
        if name in local.updates:
            extras[name].update(*local.updates[name])
    metrics = _compute_all(metrics_in, eval_set.name)
    metrics.update(_compute_all(extras, eval_set.name))
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
        eval_secs=local.eval_secs + time.perf_counter() - start, table_rows=rows,
    )


def _moved(metric: Metric, device: torch.device) -> Metric:
    dtype = metric.dtype
    metric = metric.to(device)
    if metric.dtype != dtype:  # torchmetrics' .to() resets a float64 metric to float32
        metric.set_dtype(dtype)
    return metric


def evaluate_set(
    module: nn.Module, eval_set: EvalSet, evaluate_fn: EvaluateFn, *, seed: int, global_step: int, epoch: int,
    max_table_rows: int = 0, show_progress: bool = False,
) -> SetResult:
    """Runs one eval set on this rank's deal and reduces it over all ranks.

    `show_progress` draws a progress bar over this rank's batches on rank 0.
    """
    rank, world = dist_info()
    local = evaluate_local(module, eval_set, evaluate_fn, seed=seed, global_step=global_step, epoch=epoch, rank=rank,
                           world_size=world, max_table_rows=max_table_rows, show_progress=show_progress)
    return reduce_set(local, eval_set)


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
