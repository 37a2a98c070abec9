"""The second half of a round: every eval set's per-rank results reduced over all ranks at once.

`reduce_round` runs the same collectives on every rank in the same order, however many eval sets
and metrics the round has: one object gather of each rank's reports (errors, counts, names, table
rows) and of the bytes of its metric states (`packing`), then, only when some rank lacks a metric
another rank created, one more object gather of reset copies of those metrics. Each metric then
computes from the gathered states through torchmetrics' own sync (`packing.compute_replayed`),
so values are bit for bit those of the per-state collectives. A set that failed on any rank is
left out on every rank alike; the others are reduced and returned with the failure.
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
from areal_lightning.eval_round.packing import Packed, compute_replayed, pack_states, record_states, unpack_states
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
    notes: dict[str, str] = {}  # noqa: RUF012 - a NamedTuple default, never mutated


class _SetPacket(NamedTuple):
    """One rank's part of one eval set in the round's gather: its report and, unless the set failed
    here, its metrics' and returned values' states (`packing`), in sorted name order."""

    report: _RankReport
    states: Packed | None
    counts: dict[str, int]  # tensors recorded per metric ("extra/<name>" for returned values)


_EXTRA = "extra/"  # returned values' means, beside the metrics in a packet


def _flatten(name: str, value: Any) -> dict[str, float]:
    if isinstance(value, Mapping):
        return {(name if key == name else f"{name}/{key}"): float(v) for key, v in value.items()}
    return {name: float(value)}


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


def _extras(local: LocalSetResult, names: Sequence[str], device: torch.device | None) -> dict[str, Metric]:
    """One exact mean per returned value's name (this rank's values in it; a name this rank did
    not return stays empty), so that returned values reduce like metrics, exactly."""
    extras: dict[str, Metric] = {}
    for name in names:
        extras[name] = ExactMean() if device is None else metric_to(ExactMean(), device)
        if name in local.updates:
            extras[name].update(local.updates[name])
    return extras


def _packet(local: LocalSetResult, device: torch.device | None, pack: bool) -> tuple[_SetPacket, dict[str, Metric]]:
    """This rank's packet of one set, and its metrics (returned values' means included); the
    states are packed only with `pack` (a world of one computes its metrics as they are)."""
    if local.report.error is not None:
        return _SetPacket(local.report, None, {}), {}
    metrics = {k: metric_to(m, device) if device is not None else m for k, m in local.metrics.items()}
    metrics |= {_EXTRA + k: m for k, m in _extras(local, sorted(local.updates), device).items()}
    if not pack:
        return _SetPacket(local.report, None, {}), metrics
    tensors: list[Tensor] = []
    counts: dict[str, int] = {}
    for name in sorted(metrics):
        recorded = record_states(metrics[name])
        counts[name] = len(recorded)
        tensors += recorded
    return _SetPacket(local.report, pack_states(tensors), counts), metrics


def _per_rank_states(packets: Sequence[_SetPacket], device: torch.device | None) -> list[dict[str, list[Tensor]]]:
    """Each rank's recorded tensors of one set, by metric name."""
    out = []
    for packet in packets:
        if packet.states is None:  # a world of one: nothing was packed
            return [{}]
        tensors = unpack_states(packet.states, device)
        per_metric, at = {}, 0
        for name in sorted(packet.counts):
            per_metric[name] = tensors[at : at + packet.counts[name]]
            at += packet.counts[name]
        out.append(per_metric)
    return out


def _compute_all(
    metrics: Mapping[str, Metric], per_rank: Sequence[Mapping[str, list[Tensor]]], dataset: str
) -> dict[str, float]:
    """Every metric's value, its sync answered by the ranks' gathered states; a rank without the
    metric contributes its reset state (as a reset copy joining a real sync would)."""
    out: dict[str, float] = {}
    name = ""
    try:
        with warnings.catch_warnings():
            # A rank dealt no batch never updates its metrics; its compute() still joins the sync.
            warnings.filterwarnings("ignore", message=".*compute.*before.*update.*")
            for name in sorted(metrics):
                if len(per_rank) == 1:
                    out.update(_flatten(name.removeprefix(_EXTRA), metrics[name].compute()))
                    continue
                blank: list[Tensor] = []
                if any(name not in states for states in per_rank):
                    reset = metrics[name].clone()
                    reset.reset()
                    blank = record_states(reset)
                value = compute_replayed(metrics[name], [r.get(name, blank) for r in per_rank])
                out.update(_flatten(name.removeprefix(_EXTRA), value))
    except Exception as err:
        # compute() runs on values already gathered, so every rank fails here alike and none waits.
        raise EvalRoundError(
            f"evaluation of eval set {dataset!r} failed: computing metric {name.removeprefix(_EXTRA)!r} raised "
            f"{type(err).__name__}: {err} (a metric must compute a scalar or a mapping of scalars)"
        ) from err
    return out


def _lacking(reports: Sequence[_RankReport]) -> dict[str, int]:
    """Each metric some rank lacks, with the first rank that has it (its donor)."""
    union = sorted(set().union(*(r.metric_names for r in reports)))
    return {
        name: next(i for i, r in enumerate(reports) if name in r.metric_names)
        for name in union
        if any(name not in r.metric_names for r in reports)
    }


def _fill_missing_metrics(
    reports: Mapping[str, Sequence[_RankReport]], metrics: dict[str, dict[str, Metric]], device: torch.device | None
) -> dict[str, str]:
    """Adds to each set's metrics a reset copy of every metric another rank created and this one did
    not, so that every rank computes every metric; returns the sets whose copy failed, with why.

    A rank dealt no batch (or whose batches never reached a metric's first use) has not created
    it. Every rank sees the same gathered names, so they all take part in the one object gather
    this costs, for every set of the round at once, and only when some rank lacks a metric. A
    metric that cannot be pickled fails its set on every rank, with a message saying how to avoid it.
    """
    lacking = {dataset: found for dataset, gathered in reports.items() if (found := _lacking(gathered))}
    if not lacking:
        return {}
    rank, _ = dist_info()
    offer: dict[tuple[str, str], bytes | str] = {}
    for dataset, donors in lacking.items():
        for name, donor in donors.items():
            if donor != rank:
                continue
            try:
                blank = metrics[dataset][name].clone()
                blank.reset()
                offer[(dataset, name)] = pickle.dumps(metric_to(blank, torch.device("cpu")))
            except Exception as err:  # noqa: BLE001 - turned into an error every rank raises, so none waits
                offer[(dataset, name)] = f"{type(err).__name__}: {err}"
    offers: list[dict[tuple[str, str], bytes | str]] = all_gather_object(offer)
    failures: dict[str, str] = {}
    for dataset, donors in lacking.items():
        copies = {name: offers[donor][(dataset, name)] for name, donor in donors.items()}
        for name, why in copies.items():
            if isinstance(why, str):
                without = [r for r, g in enumerate(reports[dataset]) if name not in g.metric_names]
                failures[dataset] = (
                    f"evaluation of eval set {dataset!r} failed: metric {name!r} exists only on some ranks (ranks "
                    f"{without} never created it: no batch of theirs reached it), and it cannot be copied to them "
                    f"({why}); create it with ctx.metric(...) before the batch loop, so that every rank has it"
                )
                break
            if name not in metrics[dataset]:
                copy = pickle.loads(why)  # bytes another rank of this job has just pickled
                metrics[dataset][name] = metric_to(copy, device) if device is not None else copy
    return failures


def _reduced(
    local: LocalSetResult,
    eval_set: EvalSet,
    gathered: Sequence[_SetPacket],
    metrics: dict[str, Metric],
    device: torch.device | None,
    started: float,
) -> SetResult:
    """One set's result from every rank's packet (its metrics filled with every rank's names).

    Raises:
        EvalRoundError: the ranks did not evaluate each sample once, or a metric's compute raised.
    """
    reports = [g.report for g in gathered]
    size = len(eval_set.samples)
    total_prompts = sum(r.num_prompts for r in reports)
    if (total_prompts, sum(r.index_sum for r in reports)) != (size, size * (size - 1) // 2):
        raise EvalRoundError(
            f"eval set {eval_set.name!r}: the ranks evaluated {total_prompts} prompts, not each of the {size} exactly "
            "once; they must build the same eval sets and deal them with the same world size"
        )
    extra_names = sorted(set().union(*(r.extra_names for r in reports)))
    missing_extras = [n for n in extra_names if _EXTRA + n not in metrics]
    metrics |= {_EXTRA + k: m for k, m in _extras(local, missing_extras, device).items()}
    values = _compute_all(metrics, _per_rank_states(gathered, device), eval_set.name)
    rows = sorted((row for r in reports for row in r.table_rows), key=lambda r: r["index"])
    return SetResult(
        dataset=eval_set.name,
        metrics=values,
        num_samples=sum(r.num_samples for r in reports),
        num_prompts=total_prompts,
        eval_secs=local.eval_secs + time.perf_counter() - started,
        table_rows=rows,
        sampling=local.sampling,
        outcomes=local.outcomes,
        outcome_names=sorted(set().union(*(r.outcome_names for r in reports))),
        notes={k: v for r in reversed(reports) for k, v in r.notes.items()},  # rank 0's last: it wins
    )


def reduce_round(
    locals_: Sequence[LocalSetResult], eval_sets: Sequence[EvalSet], device: torch.device | None = None
) -> list[SetResult]:
    """Reduces every eval set's per-rank results over all ranks, in one object gather (plus one
    when some rank lacks a metric another rank created), the same on every rank.

    Args:
        locals_: this rank's result of each eval set, in the eval sets' order.
        eval_sets: the round's eval sets.
        device: move the metric states here first (the training device); None keeps them where they are.

    Raises:
        EvalRoundError: on every rank, when some set failed (`evaluate_fn` raised on some rank, the
            ranks disagree, a metric's compute raised); its `results` hold the other sets' results,
            in order, and its `failures` each failed set's message.
    """
    started = time.perf_counter()
    pack = dist_info()[1] > 1
    packed = [_packet(local, device, pack) for local in locals_]
    gathered: list[list[_SetPacket]] = all_gather_object([packet for packet, _ in packed])  # [rank][set]
    failures: dict[str, str] = {}
    reports: dict[str, list[_RankReport]] = {}
    for i, eval_set in enumerate(eval_sets):
        errors = [e for rank in gathered if (e := rank[i].report.error)]
        if errors:
            failures[eval_set.name] = f"evaluation of eval set {eval_set.name!r} failed: " + "\n".join(errors)
        else:
            reports[eval_set.name] = [rank[i].report for rank in gathered]
    own = {
        s.name: {k: m for k, m in metrics.items() if not k.startswith(_EXTRA)}
        for s, (_, metrics) in zip(eval_sets, packed, strict=True)
    }
    failures |= _fill_missing_metrics(reports, own, device or next((lo.device for lo in locals_), None))
    results = []
    for i, (local, eval_set) in enumerate(zip(locals_, eval_sets, strict=True)):
        if eval_set.name in failures:
            continue
        metrics = own[eval_set.name] | packed[i][1]  # the filled-in copies, and returned values' means
        try:
            results.append(_reduced(local, eval_set, [rank[i] for rank in gathered], metrics, device, started))
        except EvalRoundError as err:  # every rank alike
            failures[eval_set.name] = str(err)
    if failures:
        ordered = {s.name: failures[s.name] for s in eval_sets if s.name in failures}
        raise EvalRoundError("\n".join(ordered.values()), results=results, failures=ordered)
    return results


def reduce_set(local: LocalSetResult, eval_set: EvalSet, device: torch.device | None = None) -> SetResult:
    """`reduce_round` of one eval set.

    Raises:
        EvalRoundError: on every rank, when `evaluate_fn` raised on any rank or the ranks disagree.
    """
    return reduce_round([local], [eval_set], device)[0]
