"""When a round counts as the new best: by its value, by its lower confidence bound, or only when its
paired change over the current best is significant. Pure decisions (the t quantile and the paired
interval of `metrics.paired` load on first use, so that a config loads without torch).

``lcb`` ranks rounds by a bound that is lower where the per-prompt outcomes spread more;
``paired`` keeps the current best until a round beats it by more than the noise of the paired
difference. Why (the winner's curse on small eval sets) and how often each rule picks a worse
checkpoint: docs/decisions.md and benchmarks/RESULTS.md.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum

from areal_lightning.callbacks.choices import Direction

DEFAULT_SELECTION_CONFIDENCE = 0.95
CI_LOW, CI_HIGH = "ci_low", "ci_high"


class SelectionRule(str, Enum):
    """How a round becomes the best: ``point`` (a better value), ``lcb`` (a better confidence bound:
    the lower one for ``max``, the upper one for ``min``) or ``paired`` (a paired change over the
    current best whose interval excludes 0 in the better direction)."""

    POINT = "point"
    LCB = "lcb"
    PAIRED = "paired"


@dataclass(frozen=True)
class Candidate:
    """A round's value of one metric, its per-prompt outcomes (None: not recorded) and its
    published interval bounds (``<metric>/ci_low``, ``<metric>/ci_high``; NaN: none)."""

    value: float
    outcomes: Mapping[int, float] | None = None
    ci_low: float = math.nan
    ci_high: float = math.nan


class NoiseUnknownError(ValueError):
    """A noise-aware rule met a metric whose round has neither per-prompt outcomes nor an interval."""


def prompt_interval(outcomes: Mapping[int, float], confidence: float) -> tuple[float, float]:
    """The Student-t interval of the mean outcome across prompts (NaN outcomes left out; NaN bounds
    with fewer than two prompts). Sums are `math.fsum`: the same whatever the order of the prompts.

    Example:
        >>> [round(b, 4) for b in prompt_interval({0: 1.0, 1: 0.0, 2: 1.0, 3: 1.0}, 0.95)]
        [-0.0456, 1.5456]
    """
    from areal_lightning.metrics.paired import t_quantile

    values = [v for _, v in sorted(outcomes.items()) if not math.isnan(v)]
    n = len(values)
    if n < 2:
        return math.nan, math.nan
    mean = math.fsum(values) / n
    var = math.fsum((v - mean) ** 2 for v in values) / (n - 1)
    half = t_quantile(0.5 + confidence / 2.0, n - 1) * math.sqrt(var / n)
    return mean - half, mean + half


def bound(candidate: Candidate, direction: Direction, confidence: float, metric: str) -> float:
    """The bound ``lcb`` ranks by: across prompts where outcomes were recorded, else the published one.

    Raises:
        NoiseUnknownError: the round has neither.
    """
    if candidate.outcomes:
        low, high = prompt_interval(candidate.outcomes, confidence)
    elif not (math.isnan(candidate.ci_low) and math.isnan(candidate.ci_high)):
        low, high = candidate.ci_low, candidate.ci_high
    else:
        raise NoiseUnknownError(
            f"best_rule=lcb needs the interval of {metric!r}: per-prompt outcomes (evaluate_fn records them with "
            f"ctx.record_outcomes({metric!r}, ...)) or {metric}/{CI_LOW} and {metric}/{CI_HIGH} among its metrics; "
            "record one, or use best_rule=point"
        )
    return low if direction is Direction.MAX else high


def _no_outcomes(metric: str) -> NoiseUnknownError:
    return NoiseUnknownError(
        f"best_rule=paired needs the per-prompt outcomes of {metric!r} (evaluate_fn records them with "
        f"ctx.record_outcomes({metric!r}, ...)); record them, or use best_rule=point or lcb"
    )


def paired_beats(current: Candidate, best: Candidate, direction: Direction, confidence: float, metric: str) -> bool:
    """The paired change ``current - best`` over their common prompts excludes 0 in the better direction.

    Raises:
        NoiseUnknownError: either round has no per-prompt outcomes.
    """
    from areal_lightning.metrics.paired import paired_change, paired_sums

    if current.outcomes is None or best.outcomes is None:
        raise _no_outcomes(metric)
    finite = {i: v for i, v in current.outcomes.items() if not math.isnan(v)}
    change = paired_change(*paired_sums(finite, best.outcomes), confidence)
    return change.low > 0 if direction is Direction.MAX else change.high < 0


def is_new_best(
    current: Candidate,
    best: Candidate | None,
    direction: Direction,
    rule: SelectionRule,
    confidence: float = DEFAULT_SELECTION_CONFIDENCE,
    metric: str = "metric",
) -> bool:
    """Whether `current` replaces `best` under `rule`; a first finite value always does, NaN never.
    Ties keep the earlier round (as `ModelCheckpoint` keeps its earlier checkpoint).

    Raises:
        NoiseUnknownError: a noise-aware rule and a round without what it needs (the message says what).

    Example:
        >>> first = Candidate(0.5, {0: 1.0, 1: 0.0, 2: 1.0, 3: 0.0})
        >>> later = Candidate(0.75, {0: 1.0, 1: 1.0, 2: 1.0, 3: 0.0})
        >>> [is_new_best(later, first, Direction.MAX, rule) for rule in SelectionRule]
        [True, True, False]
    """
    if math.isnan(current.value):
        return False
    if best is None or math.isnan(best.value):
        # What the rule needs must be there from the first round on, not first missed at the second.
        if rule is SelectionRule.LCB:
            bound(current, direction, confidence, metric)
        elif rule is SelectionRule.PAIRED and current.outcomes is None:
            raise _no_outcomes(metric)
        return True
    if rule is SelectionRule.POINT:
        return current.value > best.value if direction is Direction.MAX else current.value < best.value
    if rule is SelectionRule.LCB:
        now, then = bound(current, direction, confidence, metric), bound(best, direction, confidence, metric)
        if math.isnan(then):  # the best had no spread to bound (a single prompt): any bound beats it
            return not math.isnan(now)
        return now > then if direction is Direction.MAX else now < then
    return paired_beats(current, best, direction, confidence, metric)
