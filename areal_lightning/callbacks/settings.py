"""The options of `EvaluationCallback`, in four groups, each a dataclass with one name, one default
and one check per option.

`EvaluationCallback(schedule=..., execution=..., rounds=..., decisions=...)` takes these groups (or
mappings of their fields); the app's YAML ``evaluator`` block holds the same four groups under the
same names (``evaluator.schedule.freq_steps``), and so does a LightningCLI file's ``init_args``.

* `Schedule`: when rounds run (the triggers, the adaptive schedule, the eval-time budget);
* `Execution`: where they run (``sync`` on the training thread, ``async`` in a worker process);
* `RoundSettings`: what each round does (autocast precision, result cache, table rows, errors);
* `Decisions`: what follows a round (threshold alerts, best values, the reward-hacking watch).

The dataclasses are plain Python (OmegaConf reads them as a schema; their annotations use
``Optional`` for it); `validate` runs the checks of the classes that own the values.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Optional, TypeVar

from areal_lightning.callbacks.adaptive import DEFAULT_FACTOR, AdaptiveSchedule
from areal_lightning.callbacks.best import DEFAULT_BEST_METRICS, BestValues
from areal_lightning.callbacks.budget import EvalBudget
from areal_lightning.callbacks.choices import (
    DEFAULT_ASYNC_THREADS,
    DEFAULT_MAX_SNAPSHOT_MIB,
    DEFAULT_TABLE_ROWS,
    Direction,
    ErrorPolicy,
    EvalMode,
    IntegrityAction,
    OnBusy,
    ThresholdAction,
    WatchReference,
    check_async_options,
    check_cache_mode,
    choice,
)
from areal_lightning.callbacks.prompt_story import PromptStorySettings
from areal_lightning.callbacks.reward_hacking import DEFAULT_MIN_TRAIN_RISE, DEFAULT_TRAIN_METRIC, RewardWatch
from areal_lightning.callbacks.selection import DEFAULT_SELECTION_CONFIDENCE, SelectionRule
from areal_lightning.callbacks.thresholds import ThresholdMonitor
from areal_lightning.callbacks.trigger import HybridTrigger
from areal_lightning.errors import ArgumentError, owned_by
from areal_lightning.eval_round.precision import EvalPrecision

OWNER = "EvaluationCallback"
S = TypeVar("S")


def as_settings(cls: type[S], value: S | Mapping[str, Any] | None, arg: str) -> S:
    """`value` as a `cls`: itself, built from a mapping of its fields, or the defaults for None.

    Raises:
        ArgumentError: for another type, or a mapping with a key `cls` does not have.

    Example:
        >>> as_settings(Schedule, {"freq_steps": 5}, "schedule").freq_steps
        5
    """
    if value is None:
        return cls()
    if isinstance(value, cls):
        return value
    if not isinstance(value, Mapping):
        raise ArgumentError(OWNER, arg, value, f"a {cls.__name__}, a mapping of its fields or None")
    known = [f.name for f in fields(cls)]  # type: ignore[arg-type]
    unknown = sorted(set(value) - set(known))
    if unknown:
        raise ArgumentError(
            OWNER, arg, value, f"a mapping of the keys {', '.join(known)}; unknown: {', '.join(unknown)}"
        )
    return cls(**value)


@dataclass
class AdaptiveSettings:
    """Adaptive frequency: the next round comes sooner while `metric` moves by more than its paired
    95% interval, later while it stays within it."""

    metric: str = "accuracy"
    """The watched metric."""
    min_steps: int = 10
    """Shortest interval between adaptive rounds."""
    max_steps: int = 200
    """Longest interval between adaptive rounds."""
    eval_set: Optional[str] = None
    """The watched eval set; null: any eval set."""
    factor: float = DEFAULT_FACTOR
    """How much the interval shrinks or grows after a round, > 1."""
    start_steps: Optional[int] = None
    """The first interval; null: min_steps (early training moves fastest)."""

    def __post_init__(self) -> None:
        with owned_by("AdaptiveSettings"):
            self.build()

    def build(self) -> AdaptiveSchedule:
        """The schedule (its constructor checks these values)."""
        return AdaptiveSchedule(
            self.metric,
            self.min_steps,
            self.max_steps,
            eval_set=self.eval_set,
            factor=self.factor,
            start_steps=self.start_steps,
        )


@dataclass
class RewardWatchSettings:
    """The reward-hacking watch: alert when the training reward rises while an eval metric falls
    beyond its noise (docs/decisions.md)."""

    metric: str = "accuracy"
    """The watched eval metric (higher is better), as the evaluation logs it."""
    train_metric: str = DEFAULT_TRAIN_METRIC
    """The training reward's name in Lightning's callback_metrics (GRPOModule logs train/reward)."""
    eval_set: Optional[str] = None
    """The watched eval set; null: every eval set, each on its own."""
    min_train_rise: float = DEFAULT_MIN_TRAIN_RISE
    """The least rise of the training reward since the reference round that counts."""
    tolerance: Optional[float] = None
    """For a metric without per-prompt outcomes (no paired interval): the least fall that counts; null: never."""
    since: WatchReference = WatchReference.PREVIOUS
    """previous: compare with the previous round; best: with the best round of the eval metric."""

    def __post_init__(self) -> None:
        with owned_by("RewardWatchSettings"):
            self.since = choice("since", self.since, WatchReference)
            self.build()

    def build(self) -> RewardWatch:
        """The watch (its constructor checks these values)."""
        return RewardWatch(
            self.metric,
            self.train_metric,
            eval_set=self.eval_set,
            min_train_rise=self.min_train_rise,
            tolerance=self.tolerance,
            since=self.since,
        )


@dataclass
class Schedule:
    """When rounds run: any trigger that fires starts one (`HybridTrigger`)."""

    freq_epochs: Optional[int] = None
    """Evaluate at the end of every N-th epoch; null: off."""
    freq_steps: Optional[int] = None
    """Evaluate after every N-th optimizer step (global step multiples); null: off."""
    freq_secs: Optional[float] = None
    """Evaluate after N seconds of training since the last evaluation; null: off."""
    eval_before_train: bool = False
    """Evaluate the initial weights (step 0) before the first optimizer step."""
    eval_at_end: bool = True
    """Evaluate the final weights, unless the last step was just evaluated."""
    adaptive: Optional[AdaptiveSettings] = None
    """Adaptive frequency, e.g. {metric: accuracy, min_steps: 10, max_steps: 200}; null: off."""
    budget: Optional[float] = None
    """Largest share of training wall time spent evaluating (e.g. 0.1); rounds are deferred to keep it."""

    def __post_init__(self) -> None:
        if self.adaptive is not None:  # AdaptiveSettings checks its own fields
            self.adaptive = as_settings(AdaptiveSettings, self.adaptive, "adaptive")
        with owned_by("Schedule"):
            self.trigger()  # the trigger's and the budget's own checks, worded for this class
            self.eval_budget()

    def trigger(self, clock: Callable[[], float] = time.monotonic) -> HybridTrigger:
        """The trigger of these settings (its constructor checks them)."""
        return HybridTrigger(
            freq_epochs=self.freq_epochs,
            freq_steps=self.freq_steps,
            freq_secs=self.freq_secs,
            eval_before_train=self.eval_before_train,
            eval_at_end=self.eval_at_end,
            clock=clock,
        )

    def eval_budget(self, clock: Callable[[], float] = time.monotonic) -> EvalBudget | None:
        return EvalBudget(self.budget, clock) if self.budget is not None else None


@dataclass
class Execution:
    """Where rounds run: on the training thread, or in a worker process beside training."""

    mode: EvalMode = EvalMode.SYNC
    """sync: training waits for the evaluation; async: a worker process evaluates a snapshot of the weights
    while training goes on (results are recorded at the snapshot's step)."""
    on_busy: OnBusy = OnBusy.SKIP
    """async: a round that falls due while the previous one runs is skipped (a `skipped` event) or waits for it."""
    async_device: Optional[str] = None
    """async: where the worker evaluates (cpu, cuda:1); null: the training device."""
    async_threads: int = DEFAULT_ASYNC_THREADS
    """async: torch threads of the worker process."""
    max_snapshot_mib: Optional[float] = DEFAULT_MAX_SNAPSHOT_MIB
    """async: the most MiB the weight snapshot may take (the run stops before training if it would
    not fit); null: no bound."""

    def __post_init__(self) -> None:
        with owned_by("Execution"):
            self.mode = choice("mode", self.mode, EvalMode)
            self.on_busy = choice("on_busy", self.on_busy, OnBusy)
            check_async_options(self.async_device, self.async_threads, self.max_snapshot_mib)


@dataclass
class RoundSettings:
    """What each round does besides calling `evaluate_fn`."""

    precision: EvalPrecision = EvalPrecision.FP32
    """32, bf16 or 16: autocast during evaluation only (training precision unchanged)."""
    cache: bool = False
    """Answer a round from the result cache when the same weights, eval set and settings were evaluated."""
    cache_dir: Optional[str] = None
    """Where the result cache lives; null: <output_dir>/eval_cache."""
    max_table_rows: int = DEFAULT_TABLE_ROWS
    """Sample generations per eval set kept for the W&B table."""
    on_error: ErrorPolicy = ErrorPolicy.LOG
    """log: an exception in an evaluation is recorded and training goes on (the other eval sets of the
    round are kept); raise: fail fast. A failure of the sanity pass (or, without it, of the first round
    of a fit) stops training either way."""
    sanity_batches: int = 1
    """Batches of each eval set that `evaluate_fn` runs on every rank when fit starts, before step 1
    (as Lightning's num_sanity_val_steps): nothing is recorded; a failure stops fit, and every metric
    name the settings and the Trainer's ModelCheckpoint/EarlyStopping monitors refer to is checked
    against what it produced. 0: no sanity pass (the first round is checked instead)."""
    verbose: bool = True
    """Log one line per round (logger ``areal_lightning``, INFO); false: at DEBUG level."""

    def __post_init__(self) -> None:
        with owned_by("RoundSettings"):
            self.precision = EvalPrecision.parse(self.precision)
            self.on_error = choice("on_error", self.on_error, ErrorPolicy)
        if isinstance(self.cache_dir, Path):
            self.cache_dir = str(self.cache_dir)
        for name in ("cache", "verbose"):
            if not isinstance(getattr(self, name), bool):
                raise ArgumentError("RoundSettings", name, getattr(self, name), "True or False")
        for name in ("max_table_rows", "sanity_batches"):
            # Checked here, not at the first round: a negative count would silently do nothing.
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ArgumentError("RoundSettings", name, value, "a non-negative integer")

    def cache_path(self, output_dir: Path) -> Path | None:
        """Where the result cache lives under a run's `output_dir`; None with the cache off."""
        from areal_lightning.eval_round.cache import CACHE_DIRNAME  # torch: not when a config only loads

        if not self.cache:
            return None
        return Path(self.cache_dir) if self.cache_dir is not None else output_dir / CACHE_DIRNAME


@dataclass
class Decisions:
    """What follows a round: alerts, best values, the reward-hacking watch."""

    metric_thresholds: dict[str, float] = field(default_factory=dict)
    """Alert when a metric falls below its threshold after having reached it, e.g. {accuracy: 0.7}
    (a name matches a metric or its /mean: reward watches reward/mean)."""
    alert_from_start: bool = False
    """Also alert when a metric is below its threshold before it ever reached it (at the first round
    below it, then once per crossing); default: a metric arms once it reaches its threshold."""
    threshold_action: ThresholdAction = ThresholdAction.ALERT
    """alert: log, record and alert; stop: also stop training cleanly."""
    best_metrics: Optional[dict[str, Direction]] = None
    """Metrics whose best value and step are kept (across a resume) and logged as eval/<set>/<metric>/best,
    e.g. {accuracy: max}; null: accuracy and reward/mean (max); {}: none."""
    reward_watch: Optional[RewardWatchSettings] = None
    """The reward-hacking watch, e.g. {metric: accuracy, min_train_rise: 0.1}; null: off."""
    best_rule: SelectionRule = SelectionRule.POINT
    """When a round becomes the best of a best_metrics metric: point (a better value), lcb (a better lower
    confidence bound across prompts) or paired (a paired change over the current best that excludes 0)."""
    best_confidence: float = DEFAULT_SELECTION_CONFIDENCE
    """The confidence of the intervals best_rule lcb and paired use."""
    prompt_story: Optional[PromptStorySettings] = field(default_factory=PromptStorySettings)
    """Each prompt's outcome across rounds: <metric>/gained, /lost, /bucket/<b>, pass@<k>/gap, and
    prompt_outcomes.jsonl, e.g. {buckets: stratum}; null: off."""
    integrity: IntegrityAction = IntegrityAction.WARN
    """At the start of fit, look for training prompts in the eval sets and reference answers the grader fails:
    warn (an integrity event and a warning), fail (training does not start), off."""

    def __post_init__(self) -> None:
        if self.reward_watch is not None:  # RewardWatchSettings checks its own fields
            self.reward_watch = as_settings(RewardWatchSettings, self.reward_watch, "reward_watch")
        if self.prompt_story is not None:  # PromptStorySettings checks its own fields
            self.prompt_story = as_settings(PromptStorySettings, self.prompt_story, "prompt_story")
        with owned_by("Decisions"):
            self.threshold_action = choice("threshold_action", self.threshold_action, ThresholdAction)
            self.best_rule = choice("best_rule", self.best_rule, SelectionRule)
            self.integrity = choice("integrity", self.integrity, IntegrityAction)
            if not isinstance(self.alert_from_start, bool):
                raise ArgumentError("Decisions", "alert_from_start", self.alert_from_start, "True or False")
            if self.threshold_action is ThresholdAction.STOP and not self.metric_thresholds:
                raise ArgumentError(
                    "Decisions",
                    "threshold_action",
                    ThresholdAction.STOP.value,
                    "alert while metric_thresholds is empty (stop acts on a threshold: add one, e.g. {accuracy: 0.7})",
                )
            self.thresholds()
            self.best()

    def thresholds(self) -> ThresholdMonitor:
        return ThresholdMonitor(self.metric_thresholds, armed_from_start=self.alert_from_start)

    def best(self) -> BestValues:
        directions = DEFAULT_BEST_METRICS if self.best_metrics is None else self.best_metrics
        return BestValues(directions, self.best_rule, self.best_confidence)


def validate_together(execution: Execution, rounds: RoundSettings) -> None:
    """The checks that span two groups."""
    check_cache_mode(execution.mode, rounds.cache)


def check_cacheable(rounds: RoundSettings, evaluate_fn: Callable[..., Any] | None) -> None:
    """With the cache on, `evaluate_fn` must have an identity the cache can key (else a cached
    result could be stale).

    Raises:
        ValueError: naming what the cache cannot key and the way out.
    """
    if rounds.cache and evaluate_fn is not None:
        from areal_lightning.eval_round.cache import UncacheableError, function_identity  # torch: only here

        try:
            function_identity(evaluate_fn)
        except UncacheableError as err:
            raise ValueError(
                f"`EvaluationCallback(rounds={{'cache': True}})` cannot key evaluate_fn: {err}; pass cache=False"
            ) from None


def resolve_settings(
    schedule: Schedule | Mapping[str, Any] | None,
    execution: Execution | Mapping[str, Any] | None,
    rounds: RoundSettings | Mapping[str, Any] | None,
    decisions: Decisions | Mapping[str, Any] | None,
    evaluate_fn: Callable[..., Any] | None = None,
) -> tuple[Schedule, Execution, RoundSettings, Decisions]:
    """`EvaluationCallback`'s four groups as dataclasses (each checks its own fields when built),
    checked together."""
    out = (
        as_settings(Schedule, schedule, "schedule"),
        as_settings(Execution, execution, "execution"),
        as_settings(RoundSettings, rounds, "rounds"),
        as_settings(Decisions, decisions, "decisions"),
    )
    validate_together(out[1], out[2])
    check_cacheable(out[2], evaluate_fn)
    return out
