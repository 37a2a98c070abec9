"""Adaptive evaluation frequency: evaluate sooner while a metric moves, later while it is flat.

"Moves" means the paired interval of its change since the previous round excludes 0
(`metrics.paired`): the metric's own noise decides, not a constant. Pure Python.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, NamedTuple

from areal_lightning.errors import ArgumentError

DEFAULT_FACTOR = 2.0
_KEY_INTERVAL = "interval"
_KEY_LAST_STEP = "last_step"


def next_interval(
    interval: int, moved: bool | None, min_steps: int, max_steps: int, factor: float = DEFAULT_FACTOR
) -> int:
    """The next interval: divided by `factor` when the metric moved, multiplied when it did not,
    kept when nothing is known (None: no previous round to compare with); within the bounds.

    Example:
        >>> next_interval(40, True, 10, 160), next_interval(40, False, 10, 160), next_interval(40, None, 10, 160)
        (20, 80, 40)
        >>> next_interval(15, True, 10, 160), next_interval(120, False, 10, 160)
        (10, 160)
    """
    if moved is None:
        new = interval
    elif moved:
        new = math.floor(interval / factor)
    else:
        new = math.ceil(interval * factor)
    return int(min(max_steps, max(min_steps, new)))


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ArgumentError("AdaptiveSchedule", name, value, "a positive integer")
    return value


class IntervalChange(NamedTuple):
    """The interval changed after the round at `step`."""

    step: int
    old: int
    new: int
    moved: bool


class AdaptiveSchedule:
    """Says when the next adaptive round is due; after each round, `observe` adapts the interval.

    Args:
        metric: the watched metric, e.g. ``accuracy``.
        min_steps: the shortest interval between rounds.
        max_steps: the longest interval.
        eval_set: the watched eval set; None: the metric moved if it moved on any eval set.
        factor: how much the interval shrinks or grows per round, > 1.
        start_steps: the first interval; None: `min_steps` (early training moves fastest).

    Raises:
        ArgumentError: for a bound that is not a positive integer, ``min_steps > max_steps``, a
            factor not above 1 or a start outside the bounds.

    Example:
        >>> s = AdaptiveSchedule("accuracy", min_steps=10, max_steps=80)
        >>> s.due(10), s.observe(10, {"easy": {"accuracy": (0.02, 0.09)}})
        (True, IntervalChange(step=10, old=10, new=10, moved=True))
        >>> s.observe(20, {"easy": {"accuracy": (-0.01, 0.03)}}), s.due(39), s.due(40)
        (IntervalChange(step=20, old=10, new=20, moved=False), False, True)
    """

    def __init__(
        self,
        metric: str,
        min_steps: int,
        max_steps: int,
        *,
        eval_set: str | None = None,
        factor: float = DEFAULT_FACTOR,
        start_steps: int | None = None,
    ) -> None:
        if not isinstance(metric, str) or not metric:
            raise ArgumentError("AdaptiveSchedule", "metric", metric, "a metric name such as accuracy")
        self.metric, self.eval_set = metric, eval_set
        self.min_steps = _positive_int("min_steps", min_steps)
        self.max_steps = _positive_int("max_steps", max_steps)
        if min_steps > max_steps:
            raise ArgumentError(
                "AdaptiveSchedule",
                "",
                (min_steps, max_steps),
                f"min_steps must be at most max_steps, got min_steps={min_steps}, max_steps={max_steps}",
                f"`AdaptiveSchedule(...)`: min_steps must be at most max_steps, got min_steps={min_steps},"
                f" max_steps={max_steps}",
            )
        if (
            isinstance(factor, bool)
            or not isinstance(factor, (int, float))
            or not factor > 1
            or not math.isfinite(factor)
        ):
            raise ArgumentError("AdaptiveSchedule", "factor", factor, "a finite number above 1")
        self.factor = float(factor)
        start = min_steps if start_steps is None else _positive_int("start_steps", start_steps)
        if not min_steps <= start <= max_steps:
            raise ArgumentError(
                "AdaptiveSchedule", "start_steps", start_steps, f"a number of steps in [{min_steps}, {max_steps}]"
            )
        self.interval = start
        self.last_step = 0  # rounds count from the start of training

    def describe(self) -> str:
        where = f" on {self.eval_set}" if self.eval_set else ""
        return f"adaptively every {self.min_steps}-{self.max_steps} steps by {self.metric}{where}"

    def due(self, step: int) -> bool:
        """An adaptive round is due at `step`."""
        return step >= self.last_step + self.interval

    def moved(self, intervals: Mapping[str, Mapping[str, tuple[float, float]]]) -> bool | None:
        """Whether the watched metric's change interval excludes 0 on a watched eval set; None when
        no watched set has one (the first round, or a round answered from the cache)."""
        found = [
            bounds
            for name, per_metric in intervals.items()
            if self.eval_set in (None, name)
            for metric, bounds in per_metric.items()
            if metric == self.metric and not (math.isnan(bounds[0]) or math.isnan(bounds[1]))
        ]
        if not found:
            return None
        return any(low > 0 or high < 0 for low, high in found)

    def observe(self, step: int, intervals: Mapping[str, Mapping[str, tuple[float, float]]]) -> IntervalChange:
        """After a round (any cause) at `step`: the next one is due `interval` steps later.

        Args:
            intervals: ``{eval set: {metric: (ci_low, ci_high)}}`` of the change since the previous round.
        """
        moved = self.moved(intervals)
        old = self.interval
        self.interval = next_interval(old, moved, self.min_steps, self.max_steps, self.factor)
        self.last_step = step
        return IntervalChange(step, old, self.interval, bool(moved))

    def state_dict(self) -> dict[str, Any]:
        return {_KEY_INTERVAL: self.interval, _KEY_LAST_STEP: self.last_step}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restores a `state_dict`; missing keys keep their current values, and an interval from a run
        with other bounds is clamped into these."""
        interval = int(state.get(_KEY_INTERVAL, self.interval))
        self.interval = min(self.max_steps, max(self.min_steps, interval))
        self.last_step = int(state.get(_KEY_LAST_STEP, self.last_step))
