"""The best value of each watched eval metric and the step it was reached at, kept across a resume.

A value is the best when it beats the best so far strictly (a tie keeps the earlier round, as
`ModelCheckpoint` keeps its earlier checkpoint and `PairedRounds` its earlier best round); NaN is
never the best. Pure Python.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from areal_lightning.callbacks.choices import Direction, choice
from areal_lightning.errors import ArgumentError

BEST = "best"
BEST_STEP = "best_step"
"""Suffixes of the logged metrics: ``<metric>/best`` and ``<metric>/best_step``."""

DEFAULT_BEST_METRICS: dict[str, Direction] = {"accuracy": Direction.MAX, "reward/mean": Direction.MAX}
"""What `EvaluationCallback` watches when it is told nothing: the default evaluation's headline metrics."""

_KEY_BEST = "best"


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

    Raises:
        ArgumentError: for a metric name that is not a non-empty string, or a direction other
            than ``max`` / ``min``.

    Example:
        >>> best = BestValues({"accuracy": "max"})
        >>> best.update("easy", {"accuracy": 0.5}, step=10)
        {'accuracy/best': 0.5, 'accuracy/best_step': 10.0}
        >>> best.update("easy", {"accuracy": 0.4}, step=20)
        {'accuracy/best': 0.5, 'accuracy/best_step': 10.0}
        >>> best.state_dict()
        {'best': {'easy': {'accuracy': [0.5, 10]}}}
    """

    def __init__(self, directions: Mapping[str, Direction | str] | None = None) -> None:
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
        self._best: dict[str, dict[str, tuple[float, int]]] = {}

    def best(self, dataset: str, metric: str) -> tuple[float, int] | None:
        """``(value, step)`` of the best round so far, or None before the first finite value."""
        return self._best.get(dataset, {}).get(metric)

    def update(self, dataset: str, metrics: Mapping[str, float], step: int) -> dict[str, float]:
        """Takes a round's reduced metrics; returns ``{<metric>/best: value, <metric>/best_step: step}``
        for each watched metric that has a finite best so far."""
        kept = self._best.setdefault(dataset, {})
        out: dict[str, float] = {}
        for name, direction in self.directions.items():
            if name in metrics:
                value = float(metrics[name])
                current = kept.get(name)
                if improves(value, current[0] if current else None, direction):
                    kept[name] = (value, int(step))
            if name in kept:
                out[f"{name}/{BEST}"], out[f"{name}/{BEST_STEP}"] = kept[name][0], float(kept[name][1])
        return out

    def state_dict(self) -> dict[str, Any]:
        return {_KEY_BEST: {d: {m: [v, s] for m, (v, s) in per.items()} for d, per in self._best.items()}}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restores a `state_dict`; a missing key leaves nothing recorded (a checkpoint from before best values)."""
        self._best = {
            d: {m: (float(v), int(s)) for m, (v, s) in per.items()} for d, per in state.get(_KEY_BEST, {}).items()
        }
