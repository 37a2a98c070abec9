"""What follows a round: each `FollowUp` observes every finished round at the step of its weights.

`EvaluationCallback` concludes a round in one fixed order: the follow-ups with
``after_record = False`` in list order (they add metrics, ``extras`` and record ``fields`` to the
round), then the round is published to ``trainer.callback_metrics`` and recorded, then the
follow-ups with ``after_record = True`` in list order (they read the recorded round and raise
alerts or stop training). `build_follow_ups` makes the list; its order is:

1. `IntegrityChecks` (``callbacks/integrity.py``): at training start only, training prompts in the
   eval sets and reference answers the grader fails; ``integrity: fail`` stops the fit there.
2. `DriftCheck`: at training start only, reports eval sets whose content changed.
3. `PairedDeltas`: ``<metric>/delta`` and ``delta_best`` with their paired 95% intervals.
4. `BudgetShare`: charges the round to the eval-time budget (``budget_share``, ``deferred``).
5. `AdaptiveInterval`: the adaptive schedule's next interval, from the paired intervals.
6. `PromptStory`: ``pass@<k>/gap``, ``<metric>/gained``, ``/lost``,
   ``/bucket/<b>``, and each round's per-prompt outcomes in ``prompt_outcomes.jsonl`` (``callbacks/story_keeper.py``).
7. `BestMetrics`: ``<metric>/best`` and ``best_step`` (under ``best_rule``).
8. `ThresholdAlerts` (after the record): threshold alerts, and the stop they may ask for.
9. `RewardHackingWatch` (after the record): the reward-hacking watch's alerts.

Every follow-up runs on every rank with the same reduced results; `state_dict` goes into the
callback's checkpoint state under `state_key` (None: nothing to keep). To add one, write its class
(in its own module) and add it to `build_follow_ups`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, ClassVar

import lightning as L

from areal_lightning.callbacks.adaptive import AdaptiveSchedule
from areal_lightning.callbacks.best import BEST, BEST_STEP, BestValues
from areal_lightning.callbacks.budget import EvalBudget
from areal_lightning.callbacks.choices import IntegrityAction, ThresholdAction
from areal_lightning.callbacks.integrity import check_integrity
from areal_lightning.callbacks.lightning_monitors import read_train_metric
from areal_lightning.callbacks.reward_hacking import ALERT_KIND, RewardWatch
from areal_lightning.callbacks.round_outcomes import RoundOutcomes
from areal_lightning.callbacks.runners import Finished
from areal_lightning.callbacks.settings import Decisions, Schedule
from areal_lightning.callbacks.story_keeper import StoryKeeper
from areal_lightning.callbacks.thresholds import ThresholdMonitor
from areal_lightning.eval_round import EvalSet
from areal_lightning.eval_round.eval_set_drift import DriftMonitor
from areal_lightning.metrics.paired import DELTA, DELTA_BEST, Change, PairedRounds, change_metrics
from areal_lightning.tracking.recorder import EvalRecorder

BUDGET_SHARE = "budget_share"
ADAPTIVE_INTERVAL = "adaptive_interval"
"""Run-level numbers of a round (``eval/budget_share``, ``eval/adaptive_interval``)."""


class FollowUp:
    """Observes finished rounds; every method is a no-op unless overridden."""

    state_key: ClassVar[str | None] = None
    """The key of `state_dict` in the callback's state; None: the follow-up keeps nothing."""
    after_record: ClassVar[bool] = False
    """Runs after the round is recorded (reads it) rather than before (adds to it)."""
    keeps: ClassVar[str | None] = None
    """The attribute holding the object whose `state_dict` this follow-up checkpoints."""

    def start(self, trainer: L.Trainer, eval_sets: Sequence[EvalSet], recorder: EvalRecorder) -> None:
        """Training (re)starts."""

    def observe(self, trainer: L.Trainer, done: Finished, recorder: EvalRecorder) -> None:
        """A round finished; `done.results` are the same on every rank."""

    def stop(self) -> None:
        """Training ended."""

    def names(self, dataset: str, metrics: Collection[str], outcome_names: Collection[str]) -> set[str]:
        """The metric names this follow-up adds to an eval set's rounds (some from a later round
        on), given the names a round of the set produced and those with per-prompt outcomes; the
        sanity pass checks monitors against them before any round is recorded."""
        return set()

    def run_level_names(self) -> set[str]:
        """The names this follow-up logs once per round as ``eval/<name>`` (`Finished.extras`)."""
        return set()

    def state_dict(self) -> dict[str, Any]:
        return dict(getattr(self, self.keeps).state_dict()) if self.keeps else {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restores a `state_dict`; missing keys keep their current values."""
        if self.keeps:
            getattr(self, self.keeps).load_state_dict(state)


class IntegrityChecks(FollowUp):
    """At the start of fit: training prompts in the eval sets, reference answers the grader fails
    (`callbacks.integrity`); with ``fail``, a problem stops the fit before its first step."""

    def __init__(self, action: IntegrityAction) -> None:
        self.action = action

    def start(self, trainer: L.Trainer, eval_sets: Sequence[EvalSet], recorder: EvalRecorder) -> None:
        check_integrity(trainer, eval_sets, recorder, self.action)


class DriftCheck(FollowUp):
    """Compares each eval set with the one the checkpoint saw; a changed set starts its pairing (and
    whatever else keeps its prompts' outcomes: `others`, each with a ``reset(eval_set)``) anew."""

    state_key = "drift"
    keeps = "monitor"

    def __init__(self, pairs: PairedRounds, *others: Any) -> None:
        self.monitor = DriftMonitor()
        self.pairs = pairs
        self.others = others

    def start(self, trainer: L.Trainer, eval_sets: Sequence[EvalSet], recorder: EvalRecorder) -> None:
        for name, message in self.monitor.check(eval_sets).items():
            for keeper in (self.pairs, *self.others):
                keeper.reset(name)  # the new content has nothing to pair with
            recorder.drift(trainer, trainer.global_step, name, message)


class PairedDeltas(FollowUp):
    """Adds the paired change since the previous and the best round to the sets evaluated now; its
    state (every rank's outcomes: a collective under DDP) lets the first round after a resume pair."""

    state_key = "pairs"
    keeps = "pairs"

    def __init__(self, pairs: PairedRounds) -> None:
        self.pairs = pairs

    def names(self, dataset: str, metrics: Collection[str], outcome_names: Collection[str]) -> set[str]:
        blank = Change(0.0, 0.0, 0.0, 0)
        return {k for name in outcome_names for ref in (DELTA, DELTA_BEST) for k in change_metrics(name, ref, blank)}

    def observe(self, trainer: L.Trainer, done: Finished, recorder: EvalRecorder) -> None:
        device = trainer.strategy.root_device
        for r in done.results:  # every rank, the same sets: one reduction per metric and reference
            r.metrics.update(self.pairs.update(r.dataset, r.outcomes, r.outcome_names, r.metrics, device))


class BudgetShare(FollowUp):
    """Keeps evaluation within a share of the wall time: `allows` defers rounds, `observe` charges them."""

    state_key = "budget"
    keeps = "budget"

    def __init__(self, budget: EvalBudget) -> None:
        self.budget = budget
        self.deferred_steps: list[int] = []

    def allows(self, step: int) -> bool:
        """A round at `step` keeps the budget; a deferred step is remembered."""
        if self.budget.allows():
            return True
        self.deferred_steps.append(step)
        self.budget.defer()
        return False

    def start(self, trainer: L.Trainer, eval_sets: Sequence[EvalSet], recorder: EvalRecorder) -> None:
        self.budget.start()

    def run_level_names(self) -> set[str]:
        return {BUDGET_SHARE}

    def observe(self, trainer: L.Trainer, done: Finished, recorder: EvalRecorder) -> None:
        deferred = self.budget.add_round(done.blocked_secs)  # rounds deferred since the previous one
        share = self.budget.spent_share()
        done.extras[BUDGET_SHARE] = share
        done.fields.update(budget_share=share, deferred=deferred)

    def stop(self) -> None:
        self.budget.stop()


class AdaptiveInterval(FollowUp):
    """Moves the adaptive schedule's interval after each round; each change is logged and recorded."""

    state_key = "adaptive"
    keeps = "schedule"

    def __init__(self, schedule: AdaptiveSchedule, pairs: PairedRounds) -> None:
        self.schedule = schedule
        self.pairs = pairs

    def run_level_names(self) -> set[str]:
        return {ADAPTIVE_INTERVAL}

    def observe(self, trainer: L.Trainer, done: Finished, recorder: EvalRecorder) -> None:
        changes = self.pairs.last_changes
        intervals = {
            r.dataset: {m: (c.low, c.high) for m, c in changes.get(r.dataset, {}).items()} for r in done.results
        }
        change = self.schedule.observe(done.step, intervals)
        done.extras[ADAPTIVE_INTERVAL] = float(self.schedule.interval)
        if change.old == change.new:
            return
        how = "moved beyond" if change.moved else "stayed within"
        message = (
            f"{self.schedule.metric} {how} its paired 95% interval: the next adaptive round comes "
            f"{change.new} steps after step {done.step} (was {change.old})"
        )
        fields = dict(metric=self.schedule.metric, old_interval=change.old, new_interval=change.new)
        recorder.event(trainer, "adaptive", done.step, message, level=logging.INFO, **fields, moved=change.moved)


class PromptStory(FollowUp):
    """Each prompt's outcome across rounds: gained, lost, difficulty buckets, ``pass@<k>/gap``, and
    the per-prompt outcomes file (`callbacks.story_keeper`)."""

    state_key = "prompt_story"
    keeps = "keeper"

    def __init__(self, keeper: StoryKeeper) -> None:
        self.keeper = keeper

    def names(self, dataset: str, metrics: Collection[str], outcome_names: Collection[str]) -> set[str]:
        return self.keeper.names(dataset, metrics, outcome_names)

    def start(self, trainer: L.Trainer, eval_sets: Sequence[EvalSet], recorder: EvalRecorder) -> None:
        self.keeper.start(trainer, eval_sets, recorder)

    def observe(self, trainer: L.Trainer, done: Finished, recorder: EvalRecorder) -> None:
        self.keeper.observe(trainer, done, recorder)


class BestMetrics(FollowUp):
    """Adds each watched metric's best value and step so far to every set's metrics; a noise-aware
    rule (``best_rule``) reads every prompt's outcomes, and a set answered by the result cache (no
    outcomes) does not compete."""

    state_key = "best"
    keeps = "best"

    def __init__(self, best: BestValues, outcomes: RoundOutcomes | None = None) -> None:
        self.best = best
        self.outcomes = outcomes or RoundOutcomes()

    def names(self, dataset: str, metrics: Collection[str], outcome_names: Collection[str]) -> set[str]:
        return {f"{name}/{suffix}" for name in self.best.directions if name in metrics for suffix in (BEST, BEST_STEP)}

    def observe(self, trainer: L.Trainer, done: Finished, recorder: EvalRecorder) -> None:
        every = self.outcomes.of(done) if self.best.needs_outcomes and done.results else {}
        for r in done.all_results:
            if self.best.needs_outcomes and r.dataset in done.cached:
                r.metrics.update(self.best.current(r.dataset))
            else:
                r.metrics.update(self.best.update(r.dataset, r.metrics, done.step, every.get(r.dataset, {})))


class ThresholdAlerts(FollowUp):
    """One alert per crossing below a threshold; with ``stop``, training stops after it."""

    state_key = "thresholds"
    keeps = "monitor"
    after_record = True

    def __init__(self, monitor: ThresholdMonitor, action: ThresholdAction) -> None:
        self.monitor = monitor
        self.action = action

    def observe(self, trainer: L.Trainer, done: Finished, recorder: EvalRecorder) -> None:
        if not self.monitor.thresholds:
            return
        results = done.all_results
        if not self.monitor.resolved:
            self.monitor.resolve({name for r in results for name in r.metrics})
        alerts = [a for r in results for a in self.monitor.check(r.dataset, r.metrics, done.step)]
        for alert in alerts:
            recorder.alert(
                trainer,
                done.step,
                dataset=alert.dataset,
                message=alert.message,
                title=f"areal-lightning: {alert.dataset}/{alert.metric} below threshold",
                source="threshold alert",
                metric=alert.metric,
                value=alert.value,
                threshold=alert.threshold,
            )
        # Reduced metrics are identical on every rank, but a stop decided alone would leave the
        # other ranks in the next step's collectives: agree explicitly.
        if self.action is ThresholdAction.STOP and trainer.strategy.reduce_boolean_decision(bool(alerts), all=False):
            trainer.should_stop = True


class RewardHackingWatch(FollowUp):
    """Alerts when the training reward rises while an eval metric falls beyond its noise."""

    state_key = "reward_watch"
    keeps = "watch"
    after_record = True

    def __init__(self, watch: RewardWatch) -> None:
        self.watch = watch

    def observe(self, trainer: L.Trainer, done: Finished, recorder: EvalRecorder) -> None:
        train_value = read_train_metric(trainer, self.watch.train_metric)
        results = done.all_results
        for alert in self.watch.observe(done.step, train_value, {r.dataset: r.metrics for r in results}):
            recorder.alert(
                trainer,
                alert.step,
                dataset=alert.dataset,
                message=alert.message,
                title=f"areal-lightning: possible reward hacking on {alert.dataset}",
                source="reward watch",
                kind=ALERT_KIND,
                metric=alert.metric,
                train_metric=alert.train_metric,
                train_rise=alert.train_rise,
                change=alert.eval_change,
                change_ci_high=alert.eval_change_ci_high,
                reference_step=alert.reference_step,
            )


def build_follow_ups(
    schedule: Schedule,
    decisions: Decisions,
    clock: Callable[[], float] = time.monotonic,
    eval_sets: Sequence[EvalSet] = (),
) -> list[FollowUp]:
    """The follow-ups the settings ask for, in the order they observe each round (the module docstring);
    `eval_sets` lets those that name metrics after the samples (the story's stratum buckets) know them
    before any round."""
    pairs = PairedRounds()
    outcomes = RoundOutcomes()
    budget = schedule.eval_budget(clock)
    best = decisions.best()
    story = StoryKeeper(decisions.prompt_story, outcomes, eval_sets) if decisions.prompt_story is not None else None
    follow_ups: list[FollowUp | None] = [
        IntegrityChecks(decisions.integrity),
        DriftCheck(pairs, best, *([story] if story is not None else [])),
        PairedDeltas(pairs),
        BudgetShare(budget) if budget is not None else None,
        AdaptiveInterval(schedule.adaptive.build(), pairs) if schedule.adaptive is not None else None,
        PromptStory(story) if story is not None else None,
        BestMetrics(best, outcomes),
        ThresholdAlerts(decisions.thresholds(), decisions.threshold_action),
        RewardHackingWatch(decisions.reward_watch.build()) if decisions.reward_watch is not None else None,
    ]
    return [f for f in follow_ups if f is not None]
