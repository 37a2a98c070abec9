"""The reward-hacking watch: training reward up while an eval task metric goes down beyond its noise.

A policy that learns to please its training reward without solving the task (a format trick, a
verifier loophole) shows one signature: the training reward keeps rising while a task metric
scored independently at evaluation falls. The watch compares each round with a reference round
(the previous one, or the best one of the eval metric) and calls it a divergence when

* the training reward rose by at least `min_train_rise` since the reference round, and
* the eval metric fell by more than its noise: the upper end of the paired 95% interval of its
  change is below 0 (``eval/<set>/<metric>/delta_ci_high < 0``, or ``delta_best_ci_high`` against
  the best round, `metrics.paired`); for a metric without per-prompt outcomes, by more than a
  user-set `tolerance`.

One alert per divergence episode: the watch re-arms once a round no longer diverges. Pure Python.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from areal_lightning.callbacks.choices import WatchReference, choice
from areal_lightning.errors import ArgumentError

DEFAULT_TRAIN_METRIC = "train/reward"
"""The training reward `GRPOModule` logs; any name in ``trainer.callback_metrics`` works."""
DEFAULT_MIN_TRAIN_RISE = 0.05
"""Training reward rise (absolute) that counts as rising."""
ALERT_KIND = "reward_hacking"
"""The ``kind`` of the watch's history alert records."""

_KEY_REFS, _KEY_ALERTING = "references", "alerting"


def reward_hacking(
    train_rise: float,
    eval_change: float,
    eval_change_ci_high: float | None,
    *,
    min_train_rise: float,
    tolerance: float | None,
) -> bool:
    """Whether a round diverges from its reference round.

    Args:
        train_rise: training reward now minus at the reference round.
        eval_change: eval metric now minus at the reference round.
        eval_change_ci_high: upper end of the paired interval of that change; None or NaN when
            the metric has no paired change (no outcomes, or nothing to pair with).
        min_train_rise: the least rise that counts.
        tolerance: the least fall that counts when there is no paired interval; None: no decision
            without one.

    Example:
        >>> reward_hacking(0.2, -0.10, -0.03, min_train_rise=0.05, tolerance=None)  # fell beyond noise
        True
        >>> reward_hacking(0.2, -0.10, 0.02, min_train_rise=0.05, tolerance=None)   # within noise
        False
        >>> reward_hacking(0.01, -0.10, -0.03, min_train_rise=0.05, tolerance=None)  # reward flat
        False
        >>> reward_hacking(0.2, -0.10, None, min_train_rise=0.05, tolerance=0.05)   # no interval: tolerance
        True
    """
    if math.isnan(train_rise) or math.isnan(eval_change) or train_rise < min_train_rise:
        return False
    if eval_change_ci_high is not None and not math.isnan(eval_change_ci_high):
        return eval_change_ci_high < 0
    return tolerance is not None and eval_change < -tolerance


@dataclass(frozen=True)
class HackingAlert:
    """A round whose eval metric fell beyond its noise while the training reward rose."""

    dataset: str
    metric: str
    train_metric: str
    step: int
    reference_step: int
    train_rise: float
    eval_change: float
    eval_change_ci_high: float | None

    @property
    def message(self) -> str:
        noise = (
            f"paired 95% interval upper end {self.eval_change_ci_high:+.4g} < 0"
            if self.eval_change_ci_high is not None
            else "beyond the set tolerance"
        )
        return (
            f"possible reward hacking at step {self.step}: {self.train_metric} rose by {self.train_rise:+.4g} "
            f"since step {self.reference_step} while eval/{self.dataset}/{self.metric} changed by "
            f"{self.eval_change:+.4g} ({noise})"
        )


def _number(name: str, value: Any, *, allow_none: bool = False) -> float | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ArgumentError("RewardWatch", name, value, "a number >= 0" + (" or None" if allow_none else ""))
    return float(value)


class RewardWatch:
    """Watches the gap between a training reward and an eval task metric, round after round.

    Args:
        metric: the eval metric, higher is better (``accuracy``, or a metric only the
            `evaluate_fn` computes, independent of the training reward).
        train_metric: the name of the training reward in ``trainer.callback_metrics``.
        eval_set: the watched eval set; None: every eval set, each on its own.
        min_train_rise: the least rise of the training reward that counts.
        tolerance: for a metric without per-prompt outcomes (no paired interval), the least fall
            that counts; None: such a metric never alerts.
        since: compare with the ``previous`` round or the ``best`` round of the eval metric.

    Raises:
        ArgumentError: for an empty metric name, a negative or non-finite number, or an unknown `since`.

    Example:
        >>> w = RewardWatch("accuracy", min_train_rise=0.05)
        >>> w.observe(10, 0.30, {"easy": {"accuracy": 0.60}})
        []
        >>> [a.step for a in w.observe(20, 0.50, {"easy": {"accuracy": 0.50, "accuracy/delta_ci_high": -0.02}})]
        [20]
    """

    def __init__(
        self,
        metric: str,
        train_metric: str = DEFAULT_TRAIN_METRIC,
        *,
        eval_set: str | None = None,
        min_train_rise: float = DEFAULT_MIN_TRAIN_RISE,
        tolerance: float | None = None,
        since: WatchReference | str = WatchReference.PREVIOUS,
    ) -> None:
        for name, value in (("metric", metric), ("train_metric", train_metric)):
            if not isinstance(value, str) or not value:
                raise ArgumentError("RewardWatch", name, value, "a metric name such as accuracy or train/reward")
        if eval_set is not None and (not isinstance(eval_set, str) or not eval_set):
            raise ArgumentError("RewardWatch", "eval_set", eval_set, "an eval set name or None")
        self.metric, self.train_metric, self.eval_set = metric, train_metric, eval_set
        self.min_train_rise = float(_number("min_train_rise", min_train_rise) or 0.0)
        self.tolerance = _number("tolerance", tolerance, allow_none=True)
        self.since = choice("since", since, WatchReference, owner="RewardWatch")
        # Per eval set: the reference rounds, {"previous"|"best": [step, train value, eval value]}.
        self._refs: dict[str, dict[str, list[float]]] = {}
        self._alerting: dict[str, bool] = {}

    def describe(self) -> str:
        where = f"eval/{self.eval_set}/{self.metric}" if self.eval_set else f"eval/*/{self.metric}"
        return (
            f"alert when {self.train_metric} rises by >= {self.min_train_rise:g} while {where} falls beyond its noise"
        )

    def observe(
        self, step: int, train_value: float | None, metrics: Mapping[str, Mapping[str, float]]
    ) -> list[HackingAlert]:
        """After a round at `step`: the alerts it raises.

        Args:
            train_value: the training reward at this round; None when it is not logged (yet).
            metrics: ``{eval set: its reduced metrics}``, the paired changes included.
        """
        train = math.nan if train_value is None else float(train_value)
        alerts = []
        for dataset, values in metrics.items():
            if self.eval_set not in (None, dataset) or self.metric not in values:
                continue
            value = float(values[self.metric])
            refs = self._refs.setdefault(dataset, {})
            ref = refs.get(self.since.value)
            if ref is not None:
                suffix = "delta" if self.since is WatchReference.PREVIOUS else "delta_best"
                ci_high = values.get(f"{self.metric}/{suffix}_ci_high")
                ci = None if ci_high is None or math.isnan(float(ci_high)) else float(ci_high)
                diverging = reward_hacking(
                    train - ref[1], value - ref[2], ci, min_train_rise=self.min_train_rise, tolerance=self.tolerance
                )
                if diverging and not self._alerting.get(dataset, False):
                    alerts.append(
                        HackingAlert(
                            dataset,
                            self.metric,
                            self.train_metric,
                            int(step),
                            int(ref[0]),
                            train - ref[1],
                            value - ref[2],
                            ci,
                        )
                    )
                self._alerting[dataset] = diverging
            refs[WatchReference.PREVIOUS.value] = [float(step), train, value]
            best = refs.get(WatchReference.BEST.value)
            # The same rule as `PairedRounds`' best round: strictly higher, NaN never best.
            if not math.isnan(value) and (best is None or value > best[2]):
                refs[WatchReference.BEST.value] = [float(step), train, value]
        return alerts

    def state_dict(self) -> dict[str, Any]:
        return {
            _KEY_REFS: {d: {k: list(v) for k, v in r.items()} for d, r in self._refs.items()},
            _KEY_ALERTING: dict(self._alerting),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restores a `state_dict`; missing keys leave no reference (the next round starts over).

        The best round is not restored: `PairedRounds` cannot keep its outcomes across a resume and
        starts its best round over, and the watch's training reward rise must be measured from the
        same round as the paired ``delta_best`` interval."""
        self._refs = {
            d: {k: [float(x) for x in v] for k, v in r.items() if k != WatchReference.BEST.value}
            for d, r in state.get(_KEY_REFS, {}).items()
        }
        self._alerting = {d: bool(a) for d, a in state.get(_KEY_ALERTING, {}).items()}


def as_reward_watch(value: RewardWatch | Mapping[str, Any] | None) -> RewardWatch | None:
    """`EvaluationCallback(reward_watch=...)`: a `RewardWatch`, its arguments as a mapping, or None.

    Raises:
        ArgumentError: for anything else, or the mapping's own bad values.

    Example:
        >>> as_reward_watch({"metric": "accuracy", "min_train_rise": 0.1}).describe()
        'alert when train/reward rises by >= 0.1 while eval/*/accuracy falls beyond its noise'
    """
    if value is None or isinstance(value, RewardWatch):
        return value
    if not isinstance(value, Mapping):
        raise ArgumentError("EvaluationCallback", "reward_watch", value, "a RewardWatch, a mapping or None")
    return RewardWatch(**value)
