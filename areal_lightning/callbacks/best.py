"""The best value of each watched eval metric and the step it was reached at, kept across a resume.

Under the default rule (``point``) a value is the best when it beats the best so far strictly (a
tie keeps the earlier round, as `ModelCheckpoint` keeps its earlier checkpoint and `PairedRounds`
its earlier best round); NaN is never the best. The noise-aware rules of `callbacks.selection`
(``lcb``, ``paired``) decide from the round's per-prompt outcomes instead. Pure Python.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from areal_lightning.callbacks.choices import Direction, choice
from areal_lightning.callbacks.selection import (
    CI_HIGH,
    CI_LOW,
    DEFAULT_SELECTION_CONFIDENCE,
    Candidate,
    SelectionRule,
    bound,
    is_new_best,
)
from areal_lightning.errors import ArgumentError

BEST = "best"
BEST_STEP = "best_step"
"""Suffixes of the logged metrics: ``<metric>/best`` and ``<metric>/best_step``."""

DEFAULT_BEST_METRICS: dict[str, Direction] = {"accuracy": Direction.MAX, "reward/mean": Direction.MAX}
"""What `EvaluationCallback` watches when it is told nothing: the default evaluation's headline metrics."""

_KEY_BEST = "best"
_KEY_KEPT = "kept"


def improves(value: float, best: float | None, direction: Direction) -> bool:
    """`value` beats `best` strictly in `direction`; a first finite value always does, NaN never.

    Example:
        >>> improves(0.7, 0.6, Direction.MAX), improves(0.6, 0.6, Direction.MAX), improves(0.5, None, Direction.MIN)
        (True, False, True)
        >>> improves(float("nan"), None, Direction.MAX)
        False
    """
    if math.isnan(value):
        return False
    if best is None or math.isnan(best):
        return True
    return value > best if direction is Direction.MAX else value < best


class BestValues:
    """Keeps, per eval set, the best value of each watched metric and its step.

    Args:
        directions: ``{metric: "max" | "min"}``, metric names as `evaluate_fn` returns them
            (``accuracy``, ``reward/mean``); each is watched on every eval set that has it.
        rule: when a round becomes the best (`SelectionRule`): ``point``, ``lcb`` or ``paired``.
        confidence: the level of the intervals ``lcb`` and ``paired`` use.

    Raises:
        ArgumentError: for a metric name that is not a non-empty string, a direction other
            than ``max`` / ``min``, a rule that is not one of the rules, or a confidence outside (0, 1).

    Example:
        >>> best = BestValues({"accuracy": "max"})
        >>> best.update("easy", {"accuracy": 0.5}, step=10)
        {'accuracy/best': 0.5, 'accuracy/best_step': 10.0}
        >>> best.update("easy", {"accuracy": 0.4}, step=20)
        {'accuracy/best': 0.5, 'accuracy/best_step': 10.0}
        >>> best.state_dict()
        {'best': {'easy': {'accuracy': [0.5, 10]}}}
    """

    def __init__(
        self,
        directions: Mapping[str, Direction | str] | None = None,
        rule: SelectionRule | str = SelectionRule.POINT,
        confidence: float = DEFAULT_SELECTION_CONFIDENCE,
    ) -> None:
        if directions is not None and not isinstance(directions, Mapping):
            raise ArgumentError(
                "EvaluationCallback",
                "best_metrics",
                directions,
                'a mapping of metric names to "max" or "min", e.g. {"accuracy": "max"}',
            )
        self.directions: dict[str, Direction] = {}
        for name, direction in (directions or {}).items():
            if not isinstance(name, str) or not name:
                raise ArgumentError("EvaluationCallback", "best_metrics", name, "metric names as keys, e.g. accuracy")
            self.directions[name] = choice(f"best_metrics.{name}", direction, Direction)
        self.rule = choice("best_rule", rule, SelectionRule)
        if isinstance(confidence, bool) or not isinstance(confidence, (int, float)) or not 0 < confidence < 1:
            raise ArgumentError("EvaluationCallback", "best_confidence", confidence, "a number in (0, 1)")
        self.confidence = float(confidence)
        self._best: dict[str, dict[str, tuple[float, int]]] = {}
        self._kept: dict[str, dict[str, Candidate]] = {}  # what a noise-aware rule compares a new round with

    @property
    def needs_outcomes(self) -> bool:
        """The rule decides from per-prompt outcomes (``lcb``, ``paired``)."""
        return self.rule is not SelectionRule.POINT

    def best(self, dataset: str, metric: str) -> tuple[float, int] | None:
        """``(value, step)`` of the best round so far, or None before the first finite value."""
        return self._best.get(dataset, {}).get(metric)

    def update(
        self,
        dataset: str,
        metrics: Mapping[str, float],
        step: int,
        outcomes: Mapping[str, Mapping[int, float]] | None = None,
    ) -> dict[str, float]:
        """Takes a round's reduced metrics (and, for ``lcb`` and ``paired``, every prompt's outcomes per
        metric); returns ``{<metric>/best: value, <metric>/best_step: step}`` for each watched metric
        that has a finite best so far.

        Raises:
            NoiseUnknownError: a noise-aware rule and a watched metric without per-prompt outcomes
                (``paired``) or without an interval (``lcb``).
        """
        kept = self._best.setdefault(dataset, {})
        for name, direction in self.directions.items():
            if name in metrics:
                candidate = Candidate(
                    float(metrics[name]),
                    (outcomes or {}).get(name),
                    float(metrics.get(f"{name}/{CI_LOW}", math.nan)),
                    float(metrics.get(f"{name}/{CI_HIGH}", math.nan)),
                )
                if self._beats(dataset, name, candidate, direction):
                    kept[name] = (candidate.value, int(step))
        return self.current(dataset)

    def current(self, dataset: str) -> dict[str, float]:
        """``{<metric>/best: value, <metric>/best_step: step}`` of the best rounds so far (no new round)."""
        out: dict[str, float] = {}
        for name, (value, step) in self._best.get(dataset, {}).items():
            if name in self.directions:
                out[f"{name}/{BEST}"], out[f"{name}/{BEST_STEP}"] = value, float(step)
        return out

    def _beats(self, dataset: str, name: str, candidate: Candidate, direction: Direction) -> bool:
        """Whether `candidate` becomes the best of `name`; if so, what the rule compares with next is kept."""
        best = self._best.get(dataset, {}).get(name)
        if self.rule is SelectionRule.POINT:
            return improves(candidate.value, best[0] if best else None, direction)
        kept = self._kept.setdefault(dataset, {})
        reference = kept.get(name)
        if best is not None and reference is None:  # a checkpoint of the point rule: one comparison by value
            if not improves(candidate.value, best[0], direction):
                return False
        elif not is_new_best(candidate, reference, direction, self.rule, self.confidence, name):
            return False
        b = bound(candidate, direction, self.confidence, name) if self.rule is SelectionRule.LCB else math.nan
        if not math.isnan(b):  # the bound is all the next comparison needs
            kept[name] = Candidate(candidate.value, None, b, b)
        else:
            kept[name] = Candidate(candidate.value, dict(candidate.outcomes or {}), candidate.ci_low, candidate.ci_high)
        return True

    def reset(self, dataset: str) -> None:
        """Forgets the best round's outcomes and bound of an eval set whose content changed: its next
        round is compared with the best by value once, then by the rule (the best value stays)."""
        self._kept.pop(dataset, None)

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {
            _KEY_BEST: {d: {m: [v, s] for m, (v, s) in per.items()} for d, per in self._best.items()}
        }
        if self._kept:
            state[_KEY_KEPT] = {
                d: {m: {"ci": [c.ci_low, c.ci_high], "outcomes": c.outcomes} for m, c in per.items()}
                for d, per in self._kept.items()
            }
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restores a `state_dict`; a missing key leaves nothing recorded (a checkpoint from before best values)."""
        self._best = {
            d: {m: (float(v), int(s)) for m, (v, s) in per.items()} for d, per in state.get(_KEY_BEST, {}).items()
        }
        self._kept = {}
        for d, per in state.get(_KEY_KEPT, {}).items():
            for m, kept in per.items():
                outcomes = kept.get("outcomes")
                low, high = (math.nan if v is None else float(v) for v in kept["ci"])
                self._kept.setdefault(d, {})[m] = Candidate(
                    self._best[d][m][0],
                    None if outcomes is None else {int(i): float(v) for i, v in outcomes.items()},
                    low,
                    high,
                )
