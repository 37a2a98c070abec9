"""The second half of a round: one eval set's per-rank results reduced over all ranks.

`reduce_set` runs the same collectives on every rank in the same order: one object gather of each
rank's report (errors, counts, names, table rows), then the metrics' own syncs. A rank that never
created a metric another rank has gets a reset copy first, so every rank joins every sync.
"""

from __future__ import annotations

import pickle
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch
from torch import Tensor
from torchmetrics import Metric

from areal_lightning.eval_round.context import EvalRoundError, SetResult, metric_to
from areal_lightning.eval_round.eval_set import EvalSet
from areal_lightning.eval_round.ranks import all_gather_object, dist_info
from areal_lightning.metrics.mean import ExactMean
from areal_lightning.metrics.outcomes import Outcomes


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


def _flatten(name: str, value: Any) -> dict[str, float]:
    if isinstance(value, Mapping):
        return {(name if key == name else f"{name}/{key}"): float(v) for key, v in value.items()}
    return {name: float(value)}


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
            offer[name] = pickle.dumps(metric_to(blank, torch.device("cpu")))
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
            filled[name] = metric_to(copy, device) if device is not None else copy
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
    outcomes: dict[str, Outcomes] = field(default_factory=dict)
    device: torch.device | None = None
    """Where this rank's metrics live (copies of metrics other ranks created are moved here)."""

    @classmethod
    def failed(cls, dataset: str, message: str) -> LocalSetResult:
        """A result that carries only an error, so the reduction still runs and raises on every rank."""
        return cls(dataset, _RankReport(message, 0, 0, 0, [], [], [], []))


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
        metrics_in = {k: metric_to(m, device) for k, m in metrics_in.items()}
    # Returned values reduce through torchmetrics too: one exact mean per name any rank returned,
    # so the value does not depend on the number of ranks (a float sum's last bits would).
    extras: dict[str, Metric] = {}
    for name in sorted(set().union(*(g.extra_names for g in gathered))):
        extras[name] = ExactMean()
        if device is not None:
            extras[name] = metric_to(extras[name], device)
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
