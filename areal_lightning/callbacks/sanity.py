"""The sanity pass, and the check of every metric name the settings and the Trainer's monitors use.

As Lightning's sanity check runs validation batches before training, the sanity pass runs
`evaluate_fn` on the first batches of each eval set when `fit` starts and records nothing: a bug
in `evaluate_fn` stops `fit` in seconds, before any training. The metric names the pass produced
then meet every name the configuration refers to (thresholds, best metrics, the adaptive schedule's
and the reward watch's metrics, the monitor of every `ModelCheckpoint` and `EarlyStopping` on an
``eval/`` key): a name that no round will log is refused before step 1, with the closest name.
"""

from __future__ import annotations

import difflib
import logging
import time
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

import lightning as L
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint

from areal_lightning.callbacks.choices import EvalMode
from areal_lightning.callbacks.conclusion import Conclusion
from areal_lightning.callbacks.follow_ups import FollowUp
from areal_lightning.callbacks.lightning_monitors import EVAL_STEP_KEY
from areal_lightning.callbacks.runners import RoundSpec, Runner, run_unrecorded
from areal_lightning.callbacks.selection import CI_HIGH, CI_LOW, NoiseUnknownError, SelectionRule
from areal_lightning.callbacks.settings import Decisions, Schedule
from areal_lightning.callbacks.training_position import fast_dev_run
from areal_lightning.errors import ArgumentError
from areal_lightning.eval_round import EvalRoundError, EvalSet, SetResult
from areal_lightning.tracking.loggers import EVAL_PREFIX, EVAL_SECS_KEY, eval_metric_key
from areal_lightning.tracking.recorder import EvalRecorder

log = logging.getLogger(__name__)

SANITY_PASS_NOTE = (
    "(the sanity pass runs evaluate_fn on the first batch of each eval set when fit starts, as Lightning's "
    "sanity check does for validation; its failure stops training before any step; RoundSettings("
    "sanity_batches=0), evaluator.rounds.sanity_batches: 0 in YAML, switches it off)"
)


class MetricNameError(ValueError):
    """A setting or a monitor names a metric that the evaluation does not produce."""


@dataclass(frozen=True)
class NamedMetric:
    """A metric name that a setting or a Lightning callback refers to.

    `where` is how the user wrote it (``Decisions(metric_thresholds=...)``); a `key` is a full
    logged name (``eval/easy/accuracy``, as monitors give it), otherwise `name` is a metric of any
    eval set (or of `dataset` only). With `mean_too`, ``reward`` also matches ``reward/mean``.
    """

    where: str
    name: str
    dataset: str | None = None
    key: bool = False
    mean_too: bool = False


def sanity_sets(eval_sets: Sequence[EvalSet], num_batches: int, world_size: int) -> list[EvalSet]:
    """Each eval set cut to its first `num_batches` batches per rank, so that every rank evaluates
    real samples when the set has enough.

    Example:
        >>> [len(s.samples) for s in sanity_sets([EvalSet("a", list(range(100)), batch_size=8)], 1, 2)]
        [16]
    """
    return [s.first_batches(num_batches * world_size) for s in eval_sets]


def named_in_settings(schedule: Schedule, decisions: Decisions) -> list[NamedMetric]:
    """Every metric name the callback's settings refer to (the default best metrics are not the
    user's: an evaluation without them simply keeps no best values)."""
    named = [NamedMetric("`Decisions(metric_thresholds=...)`", n, mean_too=True) for n in decisions.metric_thresholds]
    named += [NamedMetric("`Decisions(best_metrics=...)`", n) for n in decisions.best_metrics or {}]
    if schedule.adaptive is not None:
        named.append(NamedMetric("`Schedule(adaptive=...)`", schedule.adaptive.metric, schedule.adaptive.eval_set))
    if decisions.reward_watch is not None:
        watch = decisions.reward_watch
        named.append(NamedMetric("`Decisions(reward_watch=...)`", watch.metric, watch.eval_set))
    return named


def monitored_eval_metrics(trainer: L.Trainer) -> list[NamedMetric]:
    """The ``eval/`` monitors of the Trainer's `ModelCheckpoint` and `EarlyStopping` callbacks."""
    named = []
    for callback in trainer.callbacks:  # type: ignore[attr-defined]
        if isinstance(callback, (ModelCheckpoint, EarlyStopping)):
            monitor = callback.monitor
            if isinstance(monitor, str) and monitor.startswith(f"{EVAL_PREFIX}/"):
                named.append(NamedMetric(f"`{type(callback).__name__}(monitor={monitor!r})`", monitor, key=True))
    return named


def _closest(name: str, candidates: Iterable[str]) -> str:
    # A metric a level deeper (`acc` -> `acc/accuracy`, a metric returning a mapping) is the commonest slip.
    close = sorted(c for c in candidates if c.startswith(f"{name}/"))[:1]
    close = close or difflib.get_close_matches(name, sorted(candidates), n=1, cutoff=0.5)
    return f" (did you mean {close[0]}?)" if close else ""


def check_metric_names(
    named: Sequence[NamedMetric], produced: Mapping[str, Collection[str]], run_level: Collection[str] = ()
) -> None:
    """Refuses the first name in `named` that the evaluation does not produce.

    Args:
        named: the names the settings and the Trainer's callbacks refer to.
        produced: every metric name each eval set's rounds log (``accuracy``, ``accuracy/delta``, ...).
        run_level: names logged once per round as ``eval/<name>`` (``eval/budget_share``).

    Raises:
        MetricNameError: naming the setting, the name, the closest produced name and what is produced.

    Example:
        >>> check_metric_names([NamedMetric("`ModelCheckpoint(monitor=...)`", "eval/probe/acc", key=True)],
        ...                    {"probe": ["acc/accuracy", "eval_secs"]})
        Traceback (most recent call last):
        ...
        areal_lightning.callbacks.sanity.MetricNameError: `ModelCheckpoint(monitor=...)` names eval/probe/acc, ...
    """
    keys = {eval_metric_key(d, m) for d, names in produced.items() for m in names}
    keys |= {EVAL_STEP_KEY, *(f"{EVAL_PREFIX}/{name}" for name in run_level)}
    for ref in named:
        if ref.key:
            if ref.name not in keys:
                metrics = ", ".join(sorted(set().union(*produced.values())))
                others = ", ".join(sorted(keys - _set_keys(produced)))
                raise MetricNameError(
                    f"{ref.where} names {ref.name}, which the evaluation does not log{_closest(ref.name, keys)}. "
                    f"It logs eval/<set>/<metric> for the eval sets {', '.join(produced)} and the metrics "
                    f"{metrics}; and {others}"
                )
            continue
        sets = [ref.dataset] if ref.dataset is not None else list(produced)
        candidates = set().union(*(produced.get(d, ()) for d in sets))
        if ref.name in candidates or (ref.mean_too and f"{ref.name}/mean" in candidates):
            continue
        scope = f"eval set {ref.dataset!r} does not produce" if ref.dataset is not None else "no eval set produces"
        raise MetricNameError(
            f"{ref.where} names the metric {ref.name!r}, which {scope}"
            f"{_closest(ref.name, candidates)}. Produced: {', '.join(sorted(candidates))}"
        )


def _set_keys(produced: Mapping[str, Collection[str]]) -> set[str]:
    return {eval_metric_key(d, m) for d, names in produced.items() for m in names}


def base_names(results: Sequence[SetResult]) -> dict[str, set[str]]:
    """What each eval set's round logs before any follow-up adds to it."""
    return {r.dataset: {*r.metrics, EVAL_SECS_KEY} for r in results}


def check_set_names(schedule: Schedule, decisions: Decisions, eval_sets: Sequence[str]) -> None:
    """The eval sets the settings name exist (known at construction, unlike metric names).

    Raises:
        ArgumentError: naming the setting, the name and the eval sets.
    """
    named = [
        ("Schedule", "adaptive.eval_set", schedule.adaptive.eval_set if schedule.adaptive else None),
        ("Decisions", "reward_watch.eval_set", decisions.reward_watch.eval_set if decisions.reward_watch else None),
    ]
    for owner, arg, name in named:
        if name is not None and name not in eval_sets:
            raise ArgumentError(owner, arg, name, f"the name of an eval set ({', '.join(eval_sets)}) or None")


class SanityPass:
    """Runs the sanity pass when `fit` starts and checks the metric names of a round.

    Args:
        num_batches: batches of each eval set per rank; 0: no pass (the callback then checks the
            names of the first recorded round instead).
        schedule, decisions: the callback's settings, whose metric names are checked.
        follow_ups: the callback's follow-ups (the names they add to a round count as produced).
        runner: the callback's runner; an async one runs rounds in a worker the pass does not exercise.
    """

    def __init__(
        self,
        num_batches: int,
        schedule: Schedule,
        decisions: Decisions,
        follow_ups: Sequence[FollowUp],
        runner: Runner | None = None,
    ) -> None:
        self.num_batches = num_batches
        self.worker_rounds = runner is not None and runner.mode is EvalMode.ASYNC
        self.schedule, self.decisions, self.follow_ups = schedule, decisions, list(follow_ups)

    def start(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        spec: RoundSpec,
        recorder: EvalRecorder,
        conclusion: Conclusion,
    ) -> None:
        """`fit` starts: the pass runs; without it (0 batches, ``fast_dev_run``) the first round
        stands in for it (its failure stops fit, its names are checked). The pass runs in this
        process: with rounds in a worker (async) the first round's failure stops
        fit too (a worker that cannot start or cannot run `evaluate_fn` would fail every round)."""
        if self.num_batches and not fast_dev_run(trainer):
            conclusion.stand_in_sanity = None
            conclusion.first_round_stops = self.worker_rounds
            self.run(trainer, pl_module, spec, recorder)
        else:
            conclusion.stand_in_sanity = self.check_names
            conclusion.first_round_stops = True

    def run(self, trainer: L.Trainer, pl_module: L.LightningModule, spec: RoundSpec, recorder: EvalRecorder) -> None:
        """The pass on every rank, unrecorded; its failure is recorded (an ``error`` per failed set)
        and raised on every rank alike, before any training step; then the names are checked."""
        sets = sanity_sets(spec.eval_sets, self.num_batches, trainer.world_size)
        started = time.perf_counter()
        try:
            results = run_unrecorded(trainer, pl_module, spec, sets)
        except EvalRoundError as err:
            for dataset, message in err.messages.items():
                step = trainer.global_step
                recorder.error(trainer, step, message, dataset=dataset, stops=True, why=SANITY_PASS_NOTE)
            raise EvalRoundError(f"{err}\n{SANITY_PASS_NOTE}", failures=err.failures) from err
        self.check_names(trainer, results)
        if trainer.is_global_zero:
            log.info(
                "sanity pass: evaluate_fn ran on %d sample(s) of %d eval set(s) in %.2f s; every metric name checked",
                sum(len(s.samples) for s in sets),
                len(sets),
                time.perf_counter() - started,
            )

    def check_names(self, trainer: L.Trainer, results: Sequence[SetResult]) -> None:
        """Refuses (`MetricNameError`, on every rank alike) a metric name of the settings or of an
        ``eval/`` monitor of the Trainer's callbacks that rounds like `results` never log."""
        produced = base_names(results)
        for r in results:
            for follow_up in self.follow_ups:
                produced[r.dataset] |= follow_up.names(r.dataset, set(produced[r.dataset]), r.outcome_names)
        run_level = set().union(*(f.run_level_names() for f in self.follow_ups))
        named = named_in_settings(self.schedule, self.decisions) + monitored_eval_metrics(trainer)
        check_metric_names(named, produced, run_level)
        check_noise_known(self.decisions, results)


def check_noise_known(decisions: Decisions, results: Sequence[SetResult]) -> None:
    """A noise-aware `best_rule` needs, for each best metric a round logs, its per-prompt outcomes
    (``lcb``: or its published ``ci_low``/``ci_high``); checked before step 1, not at the first round.

    Raises:
        NoiseUnknownError: naming the rule, the metric and the eval set, and the ways out.
    """
    rule = decisions.best_rule
    if rule is SelectionRule.POINT:
        return
    for r in results:
        for metric in decisions.best().directions:
            interval = {f"{metric}/{CI_LOW}", f"{metric}/{CI_HIGH}"} <= set(r.metrics)
            if metric not in r.metrics or metric in r.outcome_names or (rule is SelectionRule.LCB and interval):
                continue
            also = (
                f" or {metric}/{CI_LOW} and {metric}/{CI_HIGH} among its metrics" if rule is SelectionRule.LCB else ""
            )
            raise NoiseUnknownError(
                f"`Decisions(best_rule={rule.value!r})` needs the per-prompt outcomes of {metric!r} on eval set "
                f"{r.dataset!r} (evaluate_fn records them with ctx.record_outcomes({metric!r}, ...)){also}; "
                "record them, or use best_rule='point'"
            )
