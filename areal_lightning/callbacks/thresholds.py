"""Metric thresholds as alerts: one alert per downward crossing, never a flood."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from areal_lightning.errors import ArgumentError


@dataclass(frozen=True)
class Alert:
    """A metric of an eval set that had reached its threshold and fell below it."""

    dataset: str
    metric: str
    value: float
    threshold: float
    step: int
    reached_before: bool = True

    @property
    def message(self) -> str:
        if not self.reached_before:
            return (
                f"eval/{self.dataset}/{self.metric} is {self.value:.4g} at step {self.step}, below its "
                f"threshold {self.threshold:g} (it has not reached it yet)"
            )
        return (
            f"eval/{self.dataset}/{self.metric} fell to {self.value:.4g} at step {self.step}, "
            f"below its threshold {self.threshold:g} (it had reached it before)"
        )


class ThresholdMonitor:
    """Watches `{metric: threshold}` per eval set; thresholds are minimums (higher is better).

    A metric arms once it reaches its threshold; falling below it while armed raises one alert
    and disarms it until it reaches the threshold again. So a metric that starts below its
    threshold raises nothing until it has reached it once, unless `armed_from_start`. A name
    matches a metric exactly or its `/mean` (``reward`` watches ``reward/mean``).

    Args:
        thresholds: metric name -> minimum acceptable value.
        armed_from_start: every metric starts armed: the first round below its threshold alerts too.

    Raises:
        ValueError: for thresholds that are not a mapping of names to finite numbers.

    Example:
        >>> m = ThresholdMonitor({"accuracy": 0.7})
        >>> m.resolve(["accuracy"])
        >>> [m.check("easy", {"accuracy": v}, step=s) for s, v in [(1, 0.8), (2, 0.6), (3, 0.5)]][1][0].step
        2
    """

    def __init__(self, thresholds: Mapping[str, float] | None = None, *, armed_from_start: bool = False) -> None:
        if thresholds is not None and not isinstance(thresholds, Mapping):
            raise ArgumentError(
                "ThresholdMonitor",
                "metric_thresholds",
                thresholds,
                "a mapping of metric names to minimums, e.g. {'accuracy': 0.7}",
            )
        self.thresholds = dict(thresholds or {})
        self.armed_from_start = armed_from_start
        for name, value in self.thresholds.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ArgumentError(
                    "ThresholdMonitor",
                    f"metric_thresholds.{name}",
                    value,
                    "a finite number",
                    f"`metric_thresholds[{name!r}]` must be a finite number, got {value!r}",
                )
        self._names: dict[str, str] = {}
        self._armed: dict[str, bool] = {}
        self._reached: set[str] = set()

    def resolve(self, available: Iterable[str]) -> None:
        """Maps each threshold to a logged metric name.

        Raises:
            ValueError: naming the unknown thresholds and listing the metrics that exist.
        """
        available = sorted(set(available))
        unknown = []
        for name in self.thresholds:
            match = next((m for m in (name, f"{name}/mean") if m in available), None)
            if match is None:
                unknown.append(name)
            else:
                self._names[name] = match
        if unknown:
            raise ValueError(
                f"metric_thresholds names metrics that the evaluation does not produce: {unknown}; "
                f"available metrics: {', '.join(available)}"
            )

    @property
    def resolved(self) -> bool:
        return len(self._names) == len(self.thresholds)

    def check(self, dataset: str, metrics: Mapping[str, float], step: int) -> list[Alert]:
        alerts = []
        for name, threshold in self.thresholds.items():
            metric = self._names.get(name, name)
            value = metrics.get(metric)
            if value is None or math.isnan(value):
                continue
            key = f"{dataset}/{metric}"
            if value >= threshold:
                self._armed[key] = True
                self._reached.add(key)
            elif self._armed.get(key, self.armed_from_start):
                self._armed[key] = False
                reached = key in self._reached
                alerts.append(Alert(dataset, metric, value, threshold, step, reached_before=reached))
        return alerts

    def state_dict(self) -> dict[str, Any]:
        return {"armed": dict(self._armed), "reached": sorted(self._reached)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self._armed = dict(state.get("armed", {}))
        # A checkpoint from before `reached` was kept: an armed metric had reached its threshold.
        self._reached = set(state.get("reached", [k for k, armed in self._armed.items() if armed]))
