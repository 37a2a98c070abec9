"""The evaluation round: data, inference, compute, record, as one function.

`run_round(module, eval_sets, evaluate_fn, ...)` is what every caller shares: the callback's
rounds, the `evaluate` command and anything else that evaluates. Under `torch.distributed` each
rank evaluates its deal of the batches and every rank runs the same collectives in the same order.
A round has two halves: `evaluate_local` (this rank's deal, no collective) and `reduce_round` (the
collectives, in `reduction`); an asynchronous worker runs the first beside training. With
`lockstep=True` (sharded parameters) a rank dealt fewer batches also evaluates padding batches, so
that every rank runs the same number of forwards. docs/architecture.md walks through a round.
"""

from __future__ import annotations

import dataclasses
import time
import traceback
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn
from torchmetrics import Metric

from areal_lightning.eval_round.context import (
    BatchList,
    DealtBatches,
    EvalBatch,
    EvalContext,
    EvaluateFn,
    SetResult,
)
from areal_lightning.eval_round.eval_set import EvalSet
from areal_lightning.eval_round.isolation import evaluation_mode, module_device
from areal_lightning.eval_round.progress import GuardedProgress, RoundProgress
from areal_lightning.eval_round.ranks import dist_info
from areal_lightning.eval_round.reduction import LocalSetResult, _RankReport, reduce_round
from areal_lightning.eval_round.sharding import sample_seeds, shard_all_ranks, shard_for_rank


def local_batches(eval_set: EvalSet, seed: int, rank: int, world_size: int) -> DealtBatches:
    """This rank's deal of the eval set's global batches, each sample with its own seed (a batch's
    samples and seeds are made when it is read)."""
    dealt = shard_for_rank(
        eval_set.costs, eval_set.batch_size, rank, world_size, max_batch_cost=eval_set.max_batch_cost
    )
    return DealtBatches(eval_set.name, eval_set.samples, seed, dealt)


def resolved_seed(eval_set: EvalSet, seed: int) -> int:
    """The seed the eval set's samples derive theirs from: its own sampling seed, else the run's."""
    return eval_set.sampling.resolved_seed(seed) if eval_set.sampling is not None else seed


def padding_batches(eval_set: EvalSet, seed: int, rank: int, world_size: int) -> list[EvalBatch]:
    """What this rank evaluates, and drops, to run as many batches as the busiest rank.

    Each padding batch is the eval set's cheapest sample alone (lowest cost, then lowest index):
    under lockstep a batch costs its forwards' parameter all-gathers whatever its size, so the
    smallest batch keeps the wasted compute smallest.
    """
    costs = eval_set.costs
    dealt = shard_all_ranks(costs, eval_set.batch_size, world_size, max_batch_cost=eval_set.max_batch_cost)
    missing = max(len(batches) for batches in dealt) - len(dealt[rank])
    cheapest = min(range(len(costs)), key=lambda i: (costs[i], i))
    batch = EvalBatch(
        indices=[cheapest], samples=[eval_set.samples[cheapest]], seeds=sample_seeds(seed, eval_set.name, [cheapest])
    )
    return [batch] * missing


def _dealt_counts(batches: Sequence[EvalBatch]) -> tuple[int, int]:
    """The number of prompts dealt and the sum of their indices."""
    if isinstance(batches, DealtBatches):
        return batches.num_prompts, batches.index_sum
    return sum(len(b.indices) for b in batches), sum(i for b in batches for i in b.indices)


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
    batches: Sequence[EvalBatch] | None = None,
    max_table_rows: int = 0,
    progress: RoundProgress | None = None,
    lockstep: bool = False,
    sanity: bool = False,
) -> LocalSetResult:
    """Runs `evaluate_fn` on rank `rank`'s deal of one eval set; no collective of its own (under
    `lockstep` the module's forwards run theirs, and padding batches keep them paired).

    Args:
        batches: this rank's deal when computed already (`local_batches` with `resolved_seed`);
            None deals it here.
        progress: shows the batches as `evaluate_fn` iterates them; None shows nothing.

    An exception of `evaluate_fn` is caught into the report (with its traceback), so that
    `reduce_round` raises it on every rank instead of leaving the others waiting.
    """
    start = time.perf_counter()
    sampling = eval_set.sampling
    seed = resolved_seed(eval_set, seed)
    if batches is None:
        batches = local_batches(eval_set, seed, rank, world_size)
    padding = padding_batches(eval_set, seed, rank, world_size) if lockstep and world_size > 1 else []
    num_prompts, index_sum = _dealt_counts(batches)
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
        sanity=sanity,
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
        except Exception as err:  # noqa: BLE001 - reported on every rank by reduce_round, so no rank waits forever
            error = f"rank {rank}: {type(err).__name__}: {err}\n{traceback.format_exc()}"
        finally:
            shown.close()
    report = _RankReport(
        error,
        num_prompts,
        index_sum,
        ctx.num_samples or num_prompts,
        sorted(ctx.metrics),
        sorted(updates),
        ctx.table_rows,
        sorted(ctx.outcomes),
        dict(ctx.notes),
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
    sanity: bool = False,
) -> SetResult:
    """Runs one eval set on this rank's deal and reduces it over all ranks.

    `progress` shows this rank's batches (pass one on rank 0 only). `lockstep`: see `run_round`.
    """
    (result,) = run_round(
        module,
        [eval_set],
        evaluate_fn,
        seed=seed,
        global_step=global_step,
        epoch=epoch,
        max_table_rows=max_table_rows,
        progress=progress,
        lockstep=lockstep,
        sanity=sanity,
    )
    return result


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
    sanity: bool = False,
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
        sanity: ``ctx.sanity`` for `evaluate_fn`: the round is the sanity pass, recorded nowhere.

    Raises:
        EvalRoundError: on every rank, when `evaluate_fn` raised on any rank for some eval set;
            the other sets are still evaluated, and their results are the error's `results`
            (its `failures` names the sets that failed). Under `lockstep`
            a rank that raised mid-batch leaves the others waiting in a forward's collective
            until the process group's timeout, which then raises there.

    Example:
        >>> def count(module, batches, ctx):
        ...     return {"size": float(sum(len(b.indices) for b in batches) / max(len(batches), 1))}
        >>> [r.num_prompts for r in run_round(nn.Identity(), [EvalSet("s", [1, 2, 3])], count, seed=0,
        ...                                   global_step=0, epoch=0)]
        [3]
    """
    rank, world = dist_info()
    local = [
        evaluate_local(
            module,
            s,
            evaluate_fn,
            seed=seed,
            global_step=global_step,
            epoch=epoch,
            rank=rank,
            world_size=world,
            max_table_rows=max_table_rows,
            progress=progress,
            lockstep=lockstep,
            sanity=sanity,
        )
        for s in eval_sets
    ]
    return reduce_round(local, eval_sets)  # every set's states in one gather
