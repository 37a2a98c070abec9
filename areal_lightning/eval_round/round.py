"""The evaluation round: data, inference, compute, record, as one function.

`run_round(module, eval_sets, evaluate_fn, ...)` is what every caller shares: the callback's
rounds, the standalone `evaluate` command and anything else that evaluates. It depends only on
the module replica, the eval sets (cut into a global list of batches that does not depend on the
number of devices) and the run seed (from which each sample's own seed derives). Under
`torch.distributed` each rank evaluates its deal of the batches, and every rank runs the same
collectives in the same order: one object gather, then the metrics' own syncs.

With `lockstep=True` (sharded parameters: every forward all-gathers them) a rank dealt fewer
batches than the busiest rank also evaluates padding batches, in a second `evaluate_fn` call on a
throwaway context, so that every rank runs the same number of forwards before the gather.

A round has two halves: `evaluate_local` (this rank's deal, no collective) and `reduce_set` (the
collectives). `run_round` runs both, one eval set after the other; an asynchronous worker runs the
first half beside training and the training thread runs the second at a step every rank agrees on.
"""

from __future__ import annotations

import dataclasses
import pickle
import time
import traceback
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn
from torchmetrics import Metric

from areal_lightning.eval_round.context import BatchList, EvalBatch, EvalContext, EvalRoundError, EvaluateFn, SetResult
from areal_lightning.eval_round.eval_set import EvalSet
from areal_lightning.eval_round.isolation import evaluation_mode, module_device
from areal_lightning.eval_round.progress import GuardedProgress, RoundProgress
from areal_lightning.eval_round.ranks import all_gather_object, dist_info
from areal_lightning.eval_round.sharding import sample_seeds, shard_all_ranks, shard_for_rank
from areal_lightning.metrics.mean import ExactMean


class _RankReport(NamedTuple):
    """What each rank contributes to the round's one object gather."""

    error: str | None
    num_prompts: int
    index_sum: int  # with num_prompts, checks that every sample was evaluated exactly once
    num_samples: int
    metric_names: list[str]
    extra_names: list[str]
    table_rows: list[dict[str, Any]]
    outcome_names: list[str]


def local_batches(eval_set: EvalSet, seed: int, rank: int, world_size: int) -> list[EvalBatch]:
    """This rank's deal of the eval set's global batches, each sample with its own seed."""
    batches = []
    for indices in shard_for_rank(
        eval_set.costs, eval_set.batch_size, rank, world_size, max_batch_cost=eval_set.max_batch_cost
    ):
        samples = [eval_set.samples[i] for i in indices]
        batches.append(
            EvalBatch(indices=list(indices), samples=samples, seeds=sample_seeds(seed, eval_set.name, indices))
        )
    return batches


def resolved_seed(eval_set: EvalSet, seed: int) -> int:
    """The seed the eval set's samples derive theirs from: its own sampling seed, else the run's."""
    return eval_set.sampling.resolved_seed(seed) if eval_set.sampling is not None else seed


def padding_batches(eval_set: EvalSet, seed: int, rank: int, world_size: int) -> list[EvalBatch]:
    """What this rank evaluates, and drops, to run as many batches as the busiest rank.

    Each padding batch is the eval set's cheapest sample alone (lowest cost, then lowest index):
    under lockstep a batch costs its forwards' parameter all-gathers whatever its size, so the
    smallest batch keeps the wasted compute smallest.
    """
    dealt = shard_all_ranks(eval_set.costs, eval_set.batch_size, world_size, max_batch_cost=eval_set.max_batch_cost)
    missing = max(len(batches) for batches in dealt) - len(dealt[rank])
    cheapest = min(range(len(eval_set.costs)), key=lambda i: (eval_set.costs[i], i))
    batch = EvalBatch(
        indices=[cheapest], samples=[eval_set.samples[cheapest]], seeds=sample_seeds(seed, eval_set.name, [cheapest])
    )
    return [batch] * missing


def _flatten(name: str, value: Any) -> dict[str, float]:
    if isinstance(value, Mapping):
        return {(name if key == name else f"{name}/{key}"): float(v) for key, v in value.items()}
    return {name: float(value)}


def _extra_updates(out: Mapping[str, Any], num_prompts: int) -> dict[str, Tensor]:
    """`evaluate_fn`'s returned values as the values of a mean: a per-sample tensor counts each
    sample once, a scalar is this rank's mean over its prompts, so it counts once per prompt
    (repeated: an idle or lightly dealt rank then weighs no more than its prompts).
    """
    updates: dict[str, Tensor] = {}
    for key, value in out.items():
        if isinstance(value, Metric):
            raise TypeError(
                f"evaluate_fn returned the metric object {key!r}; create it with ctx.metric(...) "
                "(the same on every rank) so the round can reduce it exactly"
            )
        if isinstance(value, Tensor) and value.numel() != 1:
            updates[key] = value.detach().double().flatten().cpu()
        elif num_prompts:
            updates[key] = torch.full((num_prompts,), float(value), dtype=torch.float64)
    return updates


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


def _fill_missing_metrics(
    gathered: Sequence[_RankReport], metrics: dict[str, Metric], dataset: str, device: torch.device | None
) -> dict[str, Metric]:
    """This rank's metrics plus a fresh (reset) copy of every metric another rank created and this
    one did not, so that every rank joins the same metric syncs.

    A rank dealt no batch (or whose batches never reached a metric's first use) has not created
    it. Every rank sees the same gathered names, so they all take part in the one extra object
    gather this costs, and only when some rank lacks a metric. A metric that cannot be pickled
    fails the round on every rank with a message saying how to avoid it.
    """
    union = sorted(set().union(*(g.metric_names for g in gathered)))
    if all(len(g.metric_names) == len(union) for g in gathered):
        return metrics
    rank, _ = dist_info()
    lacking = sorted({name for g in gathered for name in union if name not in g.metric_names})
    donors = {name: next(r for r, g in enumerate(gathered) if name in g.metric_names) for name in lacking}
    offer: dict[str, bytes | str] = {}
    for name in lacking:
        if donors[name] != rank:
            continue
        try:
            blank = metrics[name].clone()
            blank.reset()
            offer[name] = pickle.dumps(_moved(blank, torch.device("cpu")))
        except Exception as err:  # noqa: BLE001 - turned into an error every rank raises, so none waits
            offer[name] = f"{type(err).__name__}: {err}"
    offers: list[dict[str, bytes | str]] = all_gather_object(offer)
    copies = {name: offers[donors[name]][name] for name in lacking}
    for name, why in copies.items():
        if not isinstance(why, str):
            continue
        without = [r for r, g in enumerate(gathered) if name not in g.metric_names]
        raise EvalRoundError(
            f"evaluation of eval set {dataset!r} failed: metric {name!r} exists only on some ranks (ranks {without} "
            f"never created it: no batch of theirs reached it), and it cannot be copied to them ({why}); create it "
            "with ctx.metric(...) before the batch loop, so that every rank has it"
        )
    filled = dict(metrics)
    for name, blob in copies.items():
        if name not in metrics and isinstance(blob, bytes):
            copy = pickle.loads(blob)  # bytes another rank of this job has just pickled
            filled[name] = _moved(copy, device) if device is not None else copy
    return filled


@dataclass
class LocalSetResult:
    """One eval set's result on one rank, before the reduction over ranks.

    What `evaluate_local` returns and `reduce_set` takes: the rank's report (errors, counts, names,
    table rows), its metric objects with their unsynced states, `evaluate_fn`'s returned values and
    the rank's per-prompt outcomes. An async worker computes it beside training; the training
    thread reduces it.
    """

    dataset: str
    report: _RankReport
    metrics: dict[str, Metric] = field(default_factory=dict)
    updates: dict[str, Tensor] = field(default_factory=dict)
    eval_secs: float = 0.0
    sampling: dict[str, Any] | None = None
    outcomes: dict[str, dict[int, float]] = field(default_factory=dict)
    device: torch.device | None = None
    """Where this rank's metrics live (copies of metrics other ranks created are moved here)."""

    @classmethod
    def failed(cls, dataset: str, message: str) -> LocalSetResult:
        """A result that carries only an error, so the reduction still runs and raises on every rank."""
        return cls(dataset, _RankReport(message, 0, 0, 0, [], [], [], []))


def evaluate_local(
    module: nn.Module,
    eval_set: EvalSet,
    evaluate_fn: EvaluateFn,
    *,
    seed: int,
    global_step: int,
    epoch: int,
    rank: int,
    world_size: int,
    batches: list[EvalBatch] | None = None,
    max_table_rows: int = 0,
    progress: RoundProgress | None = None,
    lockstep: bool = False,
) -> LocalSetResult:
    """Runs `evaluate_fn` on rank `rank`'s deal of one eval set; no collective of its own (under
    `lockstep` the module's forwards run theirs, and padding batches keep them paired).

    Args:
        batches: this rank's deal when computed already (`local_batches` with `resolved_seed`);
            None deals it here.
        progress: shows the batches as `evaluate_fn` iterates them; None shows nothing.

    An exception of `evaluate_fn` is caught into the report (with its traceback), so that
    `reduce_set` raises it on every rank instead of leaving the others waiting.
    """
    start = time.perf_counter()
    sampling = eval_set.sampling
    seed = resolved_seed(eval_set, seed)
    if batches is None:
        batches = local_batches(eval_set, seed, rank, world_size)
    padding = padding_batches(eval_set, seed, rank, world_size) if lockstep and world_size > 1 else []
    num_prompts = sum(len(b.indices) for b in batches)
    ctx = EvalContext(
        dataset=eval_set.name,
        rank=rank,
        world_size=world_size,
        global_step=global_step,
        epoch=epoch,
        device=module_device(module),
        seed=seed,
        options=eval_set.options,
        sampling=sampling,
        max_table_rows=max_table_rows,
        lockstep=lockstep and world_size > 1,
    )
    error, updates = None, {}
    shown = GuardedProgress(progress)
    shown.start(eval_set.name, len(batches))
    with evaluation_mode(module):
        try:  # inside the block: `evaluation_mode` restores the RNG states only on a normal exit
            updates = _extra_updates(evaluate_fn(module, BatchList(batches, shown), ctx) or {}, num_prompts)
            if padding:
                # Forwards that pair with the busier ranks' last forwards (their parameter
                # all-gathers); a fresh context takes the results, and nothing reads it.
                scratch = dataclasses.replace(
                    ctx, metrics={}, num_samples=0, max_table_rows=0, table_rows=[], padding=True
                )
                evaluate_fn(module, BatchList(padding), scratch)
        except Exception as err:  # noqa: BLE001 - reported on every rank by reduce_set, so no rank waits forever
            error = f"rank {rank}: {type(err).__name__}: {err}\n{traceback.format_exc()}"
        finally:
            shown.close()
    report = _RankReport(
        error,
        num_prompts,
        sum(i for b in batches for i in b.indices),
        ctx.num_samples or num_prompts,
        sorted(ctx.metrics),
        sorted(updates),
        ctx.table_rows,
        sorted(ctx.outcomes),
    )
    return LocalSetResult(
        eval_set.name,
        report,
        ctx.metrics,
        updates,
        time.perf_counter() - start,
        sampling=sampling.as_record(seed) if sampling is not None else None,
        outcomes=ctx.outcomes,
        device=ctx.device,
    )


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
    metrics_in = _fill_missing_metrics(gathered, local.metrics, eval_set.name, device or local.device)
    if device is not None:
        metrics_in = {k: _moved(m, device) for k, m in metrics_in.items()}
    # Returned values reduce through torchmetrics too: one exact mean per name any rank returned,
    # so the value does not depend on the number of ranks (a float sum's last bits would).
    extras: dict[str, Metric] = {}
    for name in sorted(set().union(*(g.extra_names for g in gathered))):
        extras[name] = ExactMean()
        if device is not None:
            extras[name] = _moved(extras[name], device)
        if name in local.updates:
            extras[name].update(local.updates[name])
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
        dataset=eval_set.name,
        metrics=metrics,
        num_samples=sum(g.num_samples for g in gathered),
        num_prompts=total_prompts,
        eval_secs=local.eval_secs + time.perf_counter() - start,
        table_rows=rows,
        sampling=local.sampling,
        outcomes=local.outcomes,
        outcome_names=sorted(set().union(*(g.outcome_names for g in gathered))),
    )


def _moved(metric: Metric, device: torch.device) -> Metric:
    dtype = metric.dtype
    metric = metric.to(device)
    if metric.dtype != dtype:  # torchmetrics' .to() resets a float64 metric to float32
        metric.set_dtype(dtype)
    return metric


def evaluate_set(
    module: nn.Module,
    eval_set: EvalSet,
    evaluate_fn: EvaluateFn,
    *,
    seed: int,
    global_step: int,
    epoch: int,
    max_table_rows: int = 0,
    progress: RoundProgress | None = None,
    lockstep: bool = False,
) -> SetResult:
    """Runs one eval set on this rank's deal and reduces it over all ranks.

    `progress` shows this rank's batches (pass one on rank 0 only). `lockstep`: see `run_round`.
    """
    rank, world = dist_info()
    local = evaluate_local(
        module,
        eval_set,
        evaluate_fn,
        seed=seed,
        global_step=global_step,
        epoch=epoch,
        rank=rank,
        world_size=world,
        max_table_rows=max_table_rows,
        progress=progress,
        lockstep=lockstep,
    )
    return reduce_set(local, eval_set)


def run_round(
    module: nn.Module,
    eval_sets: Sequence[EvalSet],
    evaluate_fn: EvaluateFn,
    *,
    seed: int,
    global_step: int,
    epoch: int,
    max_table_rows: int = 0,
    progress: RoundProgress | None = None,
    lockstep: bool = False,
) -> list[SetResult]:
    """Evaluates every eval set, in order, on the module replica; returns the reduced results.

    Args:
        module: the module `evaluate_fn` runs (the LightningModule, never a DDP wrapper).
        eval_sets: the eval sets, the same on every rank.
        evaluate_fn: ``evaluate_fn(module, batches, ctx) -> {name: value}``.
        seed: the run seed each sample's own seed derives from.
        global_step, epoch: what the results are recorded under (also in ``ctx``).
        max_table_rows: samples per eval set whose `ctx.record_sample` rows are kept.
        progress: shows the batches as they finish (a Trainer's progress bar, a terminal bar);
            pass it on rank 0 only. A display that raises is switched off, never the round.
        lockstep: the module's forward runs collectives (sharded parameters, see
            `callbacks.parallelism.forwards_in_lockstep`): every rank runs as many batches as the
            busiest rank (the others add padding batches whose results are dropped, in a second
            `evaluate_fn` call with ``ctx.padding`` True), and ``ctx.lockstep`` tells
            `evaluate_fn` to run the same number of forwards for every batch (no early stop).

    Raises:
        EvalRoundError: on every rank, when `evaluate_fn` raised on any rank. Under `lockstep`
            a rank that raised mid-batch leaves the others waiting in a forward's collective
            until the process group's timeout, which then raises there.

    Example:
        >>> def count(module, batches, ctx):
        ...     return {"size": float(sum(len(b.indices) for b in batches) / max(len(batches), 1))}
        >>> [r.num_prompts for r in run_round(nn.Identity(), [EvalSet("s", [1, 2, 3])], count, seed=0,
        ...                                   global_step=0, epoch=0)]
        [3]
    """
    return [
        evaluate_set(
            module,
            s,
            evaluate_fn,
            seed=seed,
            global_step=global_step,
            epoch=epoch,
            max_table_rows=max_table_rows,
            progress=progress,
            lockstep=lockstep,
        )
        for s in eval_sets
    ]
