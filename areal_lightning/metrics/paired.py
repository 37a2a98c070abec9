"""The paired change of a metric between two rounds, with its Student-t interval, exact under DDP.

Every round evaluates the same prompts with the same per-prompt seeds, so a prompt's outcome in
two rounds is a paired measurement: the noise they share cancels in the difference ``d_i``. The
interval of ``mean(d)`` is ``mean(d) +- t_{(1+c)/2, n-1} * sd(d) / sqrt(n)``; it depends on the
data through three sums only (``n``, ``sum d``, ``sum d^2``), so ranks keep their own prompts'
outcomes and reduce the sums (`PairedChange`, one state of two exact sums: the change is bit for
bit the same whatever the number of ranks).

The t quantile is computed here (regularised incomplete beta by its continued fraction, then
bisection), because torch has none and scipy is not a dependency; tests compare it with scipy.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, NamedTuple, TypeAlias

import numpy as np
import torch
from torch import Tensor

from areal_lightning.metrics.checks import _check_confidence
from areal_lightning.metrics.exact import add_squares, add_values, merge_sums, new_sum, sum_count, sum_float
from areal_lightning.metrics.float64_states import Float64StateMetric
from areal_lightning.metrics.outcomes import Outcomes as OutcomeArrays, as_outcomes

DEFAULT_CONFIDENCE = 0.95
_PAIR_CHUNK = 4096  # pairs added to a change's exact sums at a time
_KEY_PREVIOUS = "previous"
_KEY_BEST = "best"
_CF_MAX_ITER = 300
_CF_EPS = 1e-15
_CF_TINY = 1e-300
_BISECT_ITER = 200
# From this many degrees of freedom on, `t_cdf` uses Hill's asymptotic expansion: the continued
# fraction needs about sqrt(df) steps there (it was 2.5e-10 off at 10^6 after 300), while the
# expansion's error falls below the fraction's near 5000 (both about 3e-12 relative there).
_LARGE_DF = 5000.0


class Change(NamedTuple):
    """``delta`` (the mean paired difference), its interval and the number of pairs."""

    delta: float
    low: float
    high: float
    n: int

    @property
    def excludes_zero(self) -> bool:
        """The interval lies entirely above or below 0: the metric moved by more than its noise."""
        return self.low > 0 or self.high < 0


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz)."""
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > _CF_TINY else _CF_TINY)
    h = d
    for m in range(1, _CF_MAX_ITER + 1):
        m2 = 2 * m
        for aa in (m * (b - m) * x / ((qam + m2) * (a + m2)), -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 + aa * d
            d = 1.0 / (d if abs(d) > _CF_TINY else _CF_TINY)
            c = 1.0 + aa / c
            c = c if abs(c) > _CF_TINY else _CF_TINY
            h *= d * c
        if abs(d * c - 1.0) < _CF_EPS:
            break
    return h


def _betainc(a: float, b: float, x: float, y: float) -> float:
    """Regularised incomplete beta ``I_x(a, b)``, given ``y = 1 - x`` as well: computed by the
    caller, it keeps the digits that ``1.0 - x`` would round away when x is close to 1."""
    if x <= 0.0:
        return 0.0
    if y <= 0.0:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log(y)
    if x <= (a + 1.0) / (a + b + 2.0):  # on the switch point the direct form is the more accurate
        return math.exp(log_front) * _betacf(a, b, x) / a
    return 1.0 - math.exp(log_front) * _betacf(b, a, y) / b


def t_cdf(t: float, df: float) -> float:
    """Student's t distribution function with `df` degrees of freedom.

    Example:
        >>> t_cdf(0.0, 5)
        0.5
    """
    tail = _t_tail(t, df)
    return 1.0 - tail if t >= 0 else tail


def _t_tail(t: float, df: float) -> float:
    """``P(T > |t|)``, computed directly (not as ``1 - cdf``, which loses a far tail)."""
    if df >= _LARGE_DF:
        return _t_tail_large_df(t, df)
    # x = df / (df + t^2) and 1 - x, each from t directly: near t = 0, ``1.0 - x`` would be 0.
    return 0.5 * _betainc(df / 2.0, 0.5, df / (df + t * t), t * t / (df + t * t))


def _t_tail_large_df(t: float, df: float) -> float:
    """``P(T > |t|)`` for large `df`: Hill's normal expansion (CACM Algorithm 395, 1970).

    ``z = sqrt((df - 1/2) log(1 + t^2/df))`` is close to normal, and a correction in powers of
    ``1 / (48 (df - 1/2)^2)`` makes it so to double precision for df in the thousands and above.
    """
    a = df - 0.5
    b = 48.0 * a * a
    y = a * math.log1p(t * t / df)
    z = ((((-0.4 * y - 3.3) * y - 24.0) * y - 85.5) / (0.8 * y * y + 100.0 + b) + y + 3.0) / b + 1.0
    return 0.5 * math.erfc(z * math.sqrt(y) / math.sqrt(2.0))


def t_quantile(p: float, df: float) -> float:
    """The `p` quantile of Student's t with `df` degrees of freedom (by bisection on `t_cdf`).

    Raises:
        ValueError: unless ``0 < p < 1`` and ``df > 0``.

    Example:
        >>> round(t_quantile(0.975, 10), 4)
        2.2281
    """
    if not 0.0 < p < 1.0 or not df > 0:
        raise ValueError(f"`t_quantile(p=..., df=...)` needs 0 < p < 1 and df > 0, got p={p!r}, df={df!r}")
    if p == 0.5:
        return 0.0  # the median; the bisection below would only close in on it (to 2**-200)
    # Bisection on the tail beyond the quantile: ``1 - p`` is exact for p >= 1/2, and a tail far
    # below 1 keeps its relative precision, where ``t_cdf`` near 1 would round it away.
    tail = 1.0 - p if p >= 0.5 else p
    low, high = 0.0, 1.0
    while _t_tail(high, df) > tail:
        low, high = high, 2.0 * high
    for _ in range(_BISECT_ITER):
        mid = 0.5 * (low + high)
        if _t_tail(mid, df) > tail:
            low = mid
        else:
            high = mid
        if high - low <= 1e-13 * high:
            break
    t = 0.5 * (low + high)
    return t if p >= 0.5 else -t


def paired_sums(current: Mapping[int, float], reference: Mapping[int, float]) -> tuple[int, float, float]:
    """``(n, sum d, sum d^2)`` of ``d_i = current[i] - reference[i]`` over the indices both hold.

    Example:
        >>> paired_sums({0: 1.0, 1: 0.5, 2: 0.0}, {0: 0.5, 1: 0.5})
        (2, 0.5, 0.25)
    """
    n, s, s2 = 0, 0.0, 0.0
    for i in sorted(current.keys() & reference.keys()):
        d = float(current[i]) - float(reference[i])
        n, s, s2 = n + 1, s + d, s2 + d * d
    return n, s, s2


def paired_change(n: float, sum_d: float, sum_d2: float, confidence: float = DEFAULT_CONFIDENCE) -> Change:
    """Mean paired difference and its two-sided Student-t interval from the three sums.

    With one pair the interval is NaN (no spread to estimate); with none everything is NaN.

    Raises:
        ValueError: for a confidence outside (0, 1) or a negative count.

    Example:
        >>> c = paired_change(4, 0.4, 0.06)  # d = 0.1, 0.2, 0.0, 0.1
        >>> round(c.delta, 3), round(c.low, 4), round(c.high, 4), c.excludes_zero
        (0.1, -0.0299, 0.2299, False)
    """
    confidence = _check_confidence(confidence, "paired_change")
    if n < 0:
        raise ValueError(f"`paired_change(n=...)` must be a count >= 0, got {n!r}")
    count = round(n)
    if count == 0:
        return Change(math.nan, math.nan, math.nan, 0)
    mean = sum_d / count
    if count == 1:
        return Change(mean, math.nan, math.nan, 1)
    var = max(0.0, (sum_d2 - count * mean * mean) / (count - 1))  # d lies in a bounded range: no cancellation worry
    half = t_quantile(0.5 + confidence / 2.0, count - 1) * math.sqrt(var / count)
    return Change(mean, mean - half, mean + half, count)


class PairedChange(Float64StateMetric):
    """Accumulates ``n``, ``sum d`` and ``sum d^2`` of paired differences and computes `paired_change`.

    The sums are exact (:mod:`~areal_lightning.metrics.exact`), stacked in one state (so one
    gather under DDP), and each rounded once to float64 for `paired_change`: the change does not
    depend on how the pairs were split between ranks and updates.

    Example:
        >>> m = PairedChange()
        >>> m.update(torch.tensor([1.0, 1.0, 0.0]), torch.tensor([0.0, 1.0, 0.0]))
        >>> round(m.compute().delta, 4)
        0.3333
    """

    full_state_update = False
    higher_is_better = None
    sums: Tensor

    def __init__(self, confidence: float = DEFAULT_CONFIDENCE, **kwargs: Any) -> None:
        # No cached result: every compute() syncs on every rank (a rank that read a cached value
        # would skip the gather the others run), and a compute() after `merge_state` or
        # `load_state_dict`, which torchmetrics' cache does not notice, sees the new sums.
        kwargs.setdefault("compute_with_cache", False)
        super().__init__(**kwargs)
        self.confidence = _check_confidence(confidence, "PairedChange")
        # Row 0: the exact sum of the differences (and their number), row 1: of their squares.
        self.add_state("sums", torch.stack([new_sum(), new_sum()]), dist_reduce_fx=merge_sums)

    def update(self, current: Tensor, reference: Tensor) -> None:
        """Adds the pairs ``current[i] - reference[i]``."""
        d = current.detach().double().flatten() - reference.detach().double().flatten().to(current.device)
        self.sums = torch.stack([add_values(self.sums[0], d), add_squares(self.sums[1], d)])

    def compute(self) -> Change:
        return paired_change(sum_count(self.sums[0]), sum_float(self.sums[0]), sum_float(self.sums[1]), self.confidence)


DELTA = "delta"
DELTA_BEST = "delta_best"
"""Suffixes of the logged changes: ``<metric>/delta`` (since the previous round) and
``<metric>/delta_best`` (since the best round), each with ``_ci_low`` / ``_ci_high``."""


def change_metrics(metric: str, reference: str, change: Change) -> dict[str, float]:
    """``{<metric>/<reference>: delta, <metric>/<reference>_ci_low: ..., ..._ci_high: ...}``.

    Example:
        >>> change_metrics("accuracy", DELTA, Change(0.1, 0.05, 0.15, 40))
        {'accuracy/delta': 0.1, 'accuracy/delta_ci_low': 0.05, 'accuracy/delta_ci_high': 0.15}
    """
    key = f"{metric}/{reference}"
    return {key: change.delta, f"{key}_ci_low": change.low, f"{key}_ci_high": change.high}


Outcomes: TypeAlias = Mapping[int, float]
"""Per-prompt outcomes of one metric in one round: ``{sample index: value}`` (kept as `OutcomeArrays`)."""


def _every_rank(obj: Any) -> list[Any]:
    """Every rank's `obj`, indexed by rank; ``[obj]`` without a process group."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return [obj]
    out: list[Any] = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(out, obj)
    return out


def _union(parts: list[dict[str, dict[str, OutcomeArrays]]]) -> dict[str, dict[str, OutcomeArrays]]:
    """The outcomes of every part, per eval set and metric (the parts hold disjoint prompts)."""
    merged: dict[str, dict[str, OutcomeArrays]] = {}
    for part in parts:
        for dataset, per_metric in part.items():
            for metric, outcomes in per_metric.items():
                merged.setdefault(dataset, {}).setdefault(metric, OutcomeArrays()).add(*outcomes.arrays())
    return merged


def _saved(outcomes: OutcomeArrays) -> dict[int, float]:
    """Outcomes as a checkpoint keeps them: ``{index: value}`` (JSON-able; the arrays only while training)."""
    indices, values = outcomes.arrays()
    return dict(zip(indices.tolist(), values.tolist(), strict=True))


def _loaded(saved: Mapping[Any, Any]) -> OutcomeArrays:
    """`_saved`'s outcomes (keys may be strings: a state that went through JSON)."""
    return OutcomeArrays({int(i): float(v) for i, v in saved.items()})


class PairedRounds:
    """Per-prompt outcomes of the previous and of the best round, per eval set and metric, kept on
    the rank that evaluated them; `update` returns the reduced changes of a new round.

    The deal of prompts to ranks is deterministic, so at a fixed world size each rank gets the
    same prompts every round and pairs its own. The checkpointed state (`state_dict`) holds every
    rank's outcomes, keyed by sample index, so that the first round after a resume pairs with the
    round before it, on any number of ranks. "Best" is the round with the highest reduced value
    of the metric.

    Every rank must call `update` for the same eval sets with the same `names` (the union over
    ranks, as `SetResult.outcome_names` is): it runs one gather per name and reference.

    Example:
        >>> pairs = PairedRounds()
        >>> pairs.update("easy", {"accuracy": {0: 0.0, 1: 0.5}}, ["accuracy"], {"accuracy": 0.25})
        {}
        >>> out = pairs.update("easy", {"accuracy": {0: 0.5, 1: 1.0}}, ["accuracy"], {"accuracy": 0.75})
        >>> out["accuracy/delta"], out["accuracy/delta_best"]
        (0.5, 0.5)
    """

    def __init__(self, confidence: float = DEFAULT_CONFIDENCE) -> None:
        self.confidence = _check_confidence(confidence, "PairedRounds")
        self._previous: dict[str, dict[str, OutcomeArrays]] = {}
        self._best: dict[str, dict[str, tuple[float, OutcomeArrays]]] = {}
        self.last_changes: dict[str, dict[str, Change]] = {}
        """The changes since the previous round of the latest `update`, per eval set and metric."""

    def state_dict(self) -> dict[str, Any]:
        """The previous and the best round's outcomes of every rank, and the best values.

        Under torch.distributed this gathers from every rank, so every rank must call it at the
        same point (Lightning builds a checkpoint's state on every rank).
        """
        best_values = {d: {m: value for m, (value, _) in per.items()} for d, per in self._best.items()}
        best_outcomes = {d: {m: outcomes for m, (_, outcomes) in per.items()} for d, per in self._best.items()}
        parts = _every_rank((self._previous, best_outcomes))
        best = _union([b for _, b in parts])
        previous = _union([p for p, _ in parts])
        return {
            _KEY_PREVIOUS: {d: {m: _saved(o) for m, o in per.items()} for d, per in previous.items()},
            _KEY_BEST: {d: {m: [best_values[d][m], _saved(o)] for m, o in per.items()} for d, per in best.items()},
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restores a `state_dict`; a missing key leaves nothing to pair with (a checkpoint from before
        paired rounds were saved). Each rank keeps every rank's outcomes: pairing takes the indices
        that the new round and the saved one share, so each rank pairs its own prompts."""
        self._previous = {d: {m: _loaded(o) for m, o in per.items()} for d, per in state.get(_KEY_PREVIOUS, {}).items()}
        self._best = {
            d: {m: (float(value), _loaded(o)) for m, (value, o) in per.items()}
            for d, per in state.get(_KEY_BEST, {}).items()
        }
        self.last_changes = {}

    def reset(self, dataset: str) -> None:
        """Forget an eval set's rounds (its content changed: the next round has nothing to pair with)."""
        self._previous.pop(dataset, None)
        self._best.pop(dataset, None)
        self.last_changes.pop(dataset, None)

    def _paired(
        self, current: Mapping[int, float], reference: Mapping[int, float], device: torch.device | None
    ) -> PairedChange:
        """The differences of the prompts both rounds hold, in a metric on `device` (where its
        reduction runs: the process group's device, which NCCL needs to be the GPU); not reduced yet."""
        (now_idx, now_val), (ref_idx, ref_val) = as_outcomes(current).arrays(), as_outcomes(reference).arrays()
        _, in_now, in_ref = np.intersect1d(now_idx, ref_idx, assume_unique=True, return_indices=True)
        metric = PairedChange(self.confidence).to(device)
        # Made on the CPU: the metric's update moves them to its device. In chunks: an exact sum's
        # update takes about 100 bytes a value for a moment (40 MB for 100,000 prompts at once),
        # and exact sums do not depend on how the values are split.
        for start in range(0, in_now.size, _PAIR_CHUNK):
            part = slice(start, start + _PAIR_CHUNK)
            metric.update(torch.from_numpy(now_val[in_now[part]]), torch.from_numpy(ref_val[in_ref[part]]))
        return metric

    def update(
        self,
        dataset: str,
        outcomes: Mapping[str, Mapping[int, float]],
        names: list[str],
        values: Mapping[str, float],
        device: torch.device | None = None,
    ) -> dict[str, float]:
        """Pairs this round's outcomes with the previous and the best round; returns the changes.

        Args:
            dataset: the eval set.
            outcomes: this rank's per-prompt outcomes, ``{metric: {sample index: value}}``.
            names: every metric with outcomes on any rank, sorted the same on every rank.
            values: the round's reduced metric values (the same on every rank), to find the best round.
            device: where the reductions run (the process group's device); torch's default (the CPU) when None.
        """
        previous, best = self._previous.setdefault(dataset, {}), self._best.setdefault(dataset, {})
        out: dict[str, float] = {}
        changes: dict[str, Change] = {}
        for name in names:
            current = as_outcomes(outcomes.get(name))
            if name in previous:  # the same on every rank: every rank saw the same rounds
                changes[name] = self._paired(current, previous[name], device).compute()
                out.update(change_metrics(name, DELTA, changes[name]))
            if name in best:
                out.update(change_metrics(name, DELTA_BEST, self._paired(current, best[name][1], device).compute()))
            previous[name] = current
            value = float(values.get(name, math.nan))
            if name not in best or value > best[name][0] or math.isnan(best[name][0]):
                best[name] = (value, current)
        self.last_changes[dataset] = changes
        return out
