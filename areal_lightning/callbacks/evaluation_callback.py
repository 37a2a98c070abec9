"""`EvaluationCallback`: evaluate while training, when any configured trigger fires.

The hooks are guards: they ask the trigger whether a round is due, hand it to the runner
(`runners`: sync or async), and conclude every round the runner returns through the follow-ups
(`follow_ups`) and the recorder (`tracking.recorder`), in one fixed order (`_conclude`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback, EarlyStopping
from typing_extensions import override

from areal_lightning.callbacks.async_evaluator import AsyncEvaluator
from areal_lightning.callbacks.decisions import (
    adopt_eval_monitors,
    check_after_round,
    hold_monitor_places,
    publish_round,
)
from areal_lightning.callbacks.follow_ups import AdaptiveInterval, BudgetShare, FollowUp, build_follow_ups
from areal_lightning.callbacks.imports import import_object
from areal_lightning.callbacks.options import (
    ErrorPolicy,
    EvalMode,
)
from areal_lightning.callbacks.parallelism import forwards_in_lockstep
from areal_lightning.callbacks.runners import AsyncRunner, Finished, Outcome, RoundSpec, Runner, Skipped, SyncRunner
from areal_lightning.callbacks.settings import (
    Decisions,
    Execution,
    RoundSettings,
    Schedule,
    as_settings,
    validate_together,
)
from areal_lightning.callbacks.trigger import Cause
from areal_lightning.errors import ArgumentError
from areal_lightning.eval_round import EvalRoundError, EvalSet, EvaluateFn, as_eval_sets, check_eval_sets_consistent
from areal_lightning.eval_round.cache import CACHE_DIRNAME
from areal_lightning.tracking.history import new_run_id
from areal_lightning.tracking.recorder import EvalRecorder

log = logging.getLogger(__name__)


def _eval_sets(value: Mapping[str, Sequence[Any]] | Sequence[EvalSet] | str) -> list[EvalSet]:
    if isinstance(value, str):  # a factory (or a value) named in a YAML file
        found = import_object(value, "EvaluationCallback", "eval_sets")
        return as_eval_sets(found() if callable(found) else found)
    return as_eval_sets(value)


def _fast_dev_run(trainer: L.Trainer) -> bool:
    """`Trainer(fast_dev_run=...)` is on (an attribute the Trainer sets but does not declare)."""
    return bool(getattr(trainer, "fast_dev_run", False))


def _epoch_ran_to_end(trainer: L.Trainer) -> bool:
    """The epoch loop consumed its last batch (or its `limit_train_batches`), the same on every rank."""
    progress = trainer.fit_loop.epoch_loop.batch_progress
    return bool(progress.is_last_batch) or progress.current.ready == trainer.num_training_batches


class EvaluationCallback(Callback):
    """Evaluates the module on named eval sets whenever any trigger fires.

    Triggers (any of them fires): every `freq_steps` global steps, at the end of every
    `freq_epochs`-th epoch, after `freq_secs` seconds of training since the last evaluation;
    plus `eval_before_train` (step 0) and `eval_at_end` (unless the last step was just evaluated).
    The decision is the same on every rank. Each round runs `evaluate_fn` on this rank's deal of
    every eval set (`eval_round.run_round`), logs ``eval/<set>/<metric>`` to every Trainer logger
    at the evaluated global step, appends to ``<output_dir>/eval_history.jsonl`` and checks
    `metric_thresholds`.

    Args:
        eval_sets: `{name: samples}` or a list of `EvalSet`; or a dotted path
            (``my_project.data.eval_sets``) to either, or to a function returning either.
        evaluate_fn: ``evaluate_fn(module, batches, ctx) -> {name: value}``, or its dotted path
            (``my_project.evals.evaluate``, as a LightningCLI YAML file gives it); None uses the
            module's own ``evaluate(batches, ctx)`` (as `GRPOModule` has).
        schedule: when rounds run: `Schedule` (triggers, adaptive frequency, eval-time budget).
        execution: where they run: `Execution` (``sync``, or ``async`` in a worker process; see
            ``docs/async_evaluation.md``).
        rounds: what each round does: `RoundSettings` (precision, result cache, table rows, on_error).
        decisions: what follows a round: `Decisions` (thresholds, best values, reward watch).
        output_dir: where the eval history goes; None: the Trainer's `default_root_dir`.
        seed: run seed from which each sample's seed derives; None: the module's `seed` or 0.
        run_id: the run's id, written in every history record; None: a new id. A run resumed
            from a checkpoint passes its first session's id, so that its records continue that run.
        clock: seconds source of the time trigger and the budget (tests inject one).

    Each group is its dataclass, a mapping of its fields, or None for its defaults; the fields
    and their defaults are documented in `areal_lightning.callbacks.settings`, and the YAML
    ``evaluator`` block holds the same fields under the same names.

    Every round's metrics also reach ``trainer.callback_metrics`` under their logged names, on
    every rank, so ``ModelCheckpoint(monitor="eval/easy/accuracy", mode="max")`` and
    ``EarlyStopping(monitor=...)`` decide on them; an `EarlyStopping` on an ``eval/`` metric
    checks right after each round (``docs/decisions.md``). Under the Trainer's progress bar each
    round shows its batches as validation does; under ``fast_dev_run`` a round evaluates each eval
    set's first batch and records nothing.

    Every round also logs, per eval set and per metric whose per-prompt outcomes `evaluate_fn`
    recorded (``ctx.record_outcomes``), the paired change since the previous round and since the
    best round with its 95% interval: ``eval/<set>/<metric>/delta``, ``.../delta_ci_low``,
    ``.../delta_ci_high``, ``.../delta_best`` (and its ``_ci_low`` / ``_ci_high``).

    Raises:
        ValueError: for an unsupported argument value, naming it and the choices, or a dotted
            path that does not import.

    Example:
        >>> cb = EvaluationCallback({"easy": [1, 2, 3]}, lambda m, b, ctx: {}, schedule={"freq_steps": 100})
        >>> cb.trigger.describe()
        'evaluate every 100 steps, at the end'
    """

    def __init__(
        self,
        eval_sets: Mapping[str, Sequence[Any]] | Sequence[EvalSet] | str,
        evaluate_fn: EvaluateFn | str | None = None,
        *,
        schedule: Schedule | Mapping[str, Any] | None = None,
        execution: Execution | Mapping[str, Any] | None = None,
        rounds: RoundSettings | Mapping[str, Any] | None = None,
        decisions: Decisions | Mapping[str, Any] | None = None,
        output_dir: str | Path | None = None,
        seed: int | None = None,
        run_id: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.eval_sets = _eval_sets(eval_sets)
        if isinstance(evaluate_fn, str):  # e.g. LightningCLI's init_args: evaluate_fn: my_project.evals.evaluate
            evaluate_fn = import_object(evaluate_fn, "EvaluationCallback", "evaluate_fn")
        if evaluate_fn is not None and not callable(evaluate_fn):
            raise ValueError(f"`EvaluationCallback(evaluate_fn=...)` must be callable or None, got {evaluate_fn!r}")
        self.schedule = as_settings(Schedule, schedule, "schedule")
        self.execution = as_settings(Execution, execution, "execution")
        self.rounds = as_settings(RoundSettings, rounds, "rounds")
        self.decisions = as_settings(Decisions, decisions, "decisions")
        self.execution.validate()  # checked in either mode: a config error shows before the mode is switched
        self.rounds.validate()
        validate_together(self.execution, self.rounds)
        self.trigger = self.schedule.trigger(clock)
        self.runner: Runner = (
            AsyncRunner(AsyncEvaluator.of(self.execution), self.execution.on_busy, clock)
            if self.execution.mode is EvalMode.ASYNC
            else SyncRunner(clock)
        )
        if run_id is not None and (not isinstance(run_id, str) or not run_id):
            raise ArgumentError("EvaluationCallback", "run_id", run_id, "a non-empty string or None")
        adaptive = self.schedule.adaptive.build() if self.schedule.adaptive is not None else None
        self.adaptive = adaptive
        self.best = self.decisions.best()
        self.reward_watch = self.decisions.reward_watch.build() if self.decisions.reward_watch is not None else None
        self.follow_ups: list[FollowUp] = build_follow_ups(
            thresholds=self.decisions.thresholds(),
            threshold_action=self.decisions.threshold_action,
            best=self.best,
            adaptive=adaptive,
            budget=self.schedule.eval_budget(clock),
            reward_watch=self.reward_watch,
        )
        self.recorder = EvalRecorder(run_id or new_run_id(), self.execution.mode.value)
        self.output_dir = Path(output_dir) if output_dir is not None else None
        self.seed = seed
        self._evaluate_fn = evaluate_fn
        self._adopted: list[EarlyStopping] = []  # EarlyStopping on eval metrics: checked after each round
        self._rounds_this_fit = 0  # the first round of a fit is a sanity round: its failure stops training
        self._checked_eval_sets = False
        self._last_seen_step = -1
        self._skipped_step: int | None = None  # the latest step whose round was skipped while busy
        self.evaluated_steps: list[int] = []
        # Lightning reads `state_key` around every hook call of every step (profiler labels), and
        # the arguments it depends on never change: build the string once.
        self._state_key = self._generate_state_key(
            freq_epochs=self.trigger.freq_epochs,
            freq_steps=self.trigger.freq_steps,
            freq_secs=self.trigger.freq_secs,
            eval_sets=[s.name for s in self.eval_sets],
        )

    @property
    @override
    def state_key(self) -> str:
        return self._state_key

    @property
    def run_id(self) -> str:
        """The run's id in every history record; a resumed run keeps its checkpoint's."""
        return self.recorder.run_id

    @property
    def deferred_steps(self) -> list[int]:
        """The steps whose rounds the eval-time budget deferred."""
        budget = self._follow_up(BudgetShare)
        return budget.deferred_steps if budget is not None else []

    def _cache_dir(self) -> Path | None:
        if not self.rounds.cache:
            return None
        assert self.output_dir is not None, "setup() comes first"
        return Path(self.rounds.cache_dir) if self.rounds.cache_dir is not None else self.output_dir / CACHE_DIRNAME

    def _follow_up(self, kind: type[FollowUp]) -> Any:
        return next((f for f in self.follow_ups if isinstance(f, kind)), None)

    # ---- hooks: short guards around one private method each -------------------------------------

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self._evaluate_fn is None and not callable(getattr(pl_module, "evaluate", None)):
            raise ValueError(
                f"`EvaluationCallback(evaluate_fn=None)` needs a module with an `evaluate(batches, ctx)` method, "
                f"and {type(pl_module).__name__} has none; pass evaluate_fn=..."
            )
        if self.output_dir is None:
            self.output_dir = Path(trainer.default_root_dir)
        if self.seed is None:
            self.seed = int(getattr(pl_module, "seed", 0))
        if not _fast_dev_run(trainer):  # fast_dev_run writes nothing, as Lightning's own callbacks do not
            # A resumed run evaluates again the steps between its checkpoint and the crash: one record each.
            self.recorder.open(trainer, self.output_dir, once_per_step=[c.value for c in Cause])
        self.runner.setup(trainer)
        self._adopted = adopt_eval_monitors(trainer)

    @override
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self._checked_eval_sets:
            check_eval_sets_consistent(self.eval_sets)  # every rank: a mismatch fails everywhere at once
            self._checked_eval_sets = True
        self._rounds_this_fit = 0
        hold_monitor_places(trainer)
        if _fast_dev_run(trainer):
            # As Lightning's fast_dev_run runs one validation batch: each eval set's first batch, unrecorded.
            self.eval_sets = [s.first_batch() for s in self.eval_sets]
            log.info("fast_dev_run: rounds evaluate the first batch of each eval set and record nothing")
        spec = RoundSpec(
            self.eval_sets,
            self._evaluate_fn,
            seed=int(self.seed or 0),
            max_table_rows=self.rounds.max_table_rows,
            precision=self.rounds.precision,
            lockstep=forwards_in_lockstep(trainer.strategy, pl_module),  # raises for tensor parallelism
            cache_dir=self._cache_dir(),
        )
        for follow_up in self.follow_ups:
            follow_up.start(trainer, self.eval_sets, self.recorder)
        self.trigger.start()
        self._last_seen_step = trainer.global_step
        self.runner.start(trainer, pl_module, spec)
        causes = self.trigger.before_train(trainer.global_step)
        if causes:
            self._evaluate(trainer, pl_module, causes)

    @override
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        step = trainer.global_step  # read once: it is a chain of Lightning properties, and this runs every step
        if step == self._last_seen_step:
            return  # gradient accumulation: no optimizer step since the last call
        self._last_seen_step = step
        self._conclude(trainer, self.runner.poll(trainer, pl_module))
        last_batch = trainer.fit_loop.epoch_loop.batch_progress.is_last_batch
        causes = self.trigger.after_step(step, trainer.current_epoch, last_batch)
        if self._adaptive_due(step):
            causes.append(Cause.ADAPTIVE)
        causes = self._agree(trainer, self._within_budget(step, causes))
        if causes:
            self._evaluate(trainer, pl_module, causes)

    @override
    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not _epoch_ran_to_end(trainer):
            # Lightning calls this hook also when max_steps or a stop request cut the epoch short;
            # a partial epoch is no completed epoch (it would fire `freq_epochs` at the last step).
            return
        causes = self._within_budget(
            trainer.global_step, self.trigger.after_epoch(trainer.global_step, trainer.current_epoch)
        )
        causes = self._agree(trainer, causes)
        if causes:
            self._evaluate(trainer, pl_module, causes)

    @override
    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._conclude(trainer, self.runner.finish(trainer, pl_module))  # eval_at_end waits for rounds in flight
        causes = self.trigger.at_end(trainer.global_step)
        if not causes and self.trigger.eval_at_end and self._skipped_step == trainer.global_step:
            causes = [Cause.END]  # the last step's round was skipped while busy: the end still evaluates it
        if causes:
            self._evaluate(trainer, pl_module, causes)  # never deferred by the budget
            self._conclude(trainer, self.runner.finish(trainer, pl_module))
        self.trigger.stop()
        for follow_up in self.follow_ups:
            follow_up.stop()
        self.runner.close()

    @override
    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self.runner.close(cancel=True)  # a crash or Ctrl-C leaves no worker behind

    @override
    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self.runner.close(cancel=True)

    @override
    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        if not self.runner.busy:
            return
        # A round in flight is finished and recorded before the checkpoint is written, so a resume
        # neither loses nor repeats it. Every rank saves (Lightning dumps the checkpoint on all),
        # and every rank has the same round in flight: the reduction's collectives match.
        self._conclude(trainer, self.runner.finish(trainer, pl_module))
        if "callbacks" in checkpoint:  # Lightning took our state before this hook: take it again
            checkpoint["callbacks"][self.state_key] = self.state_dict()

    @override
    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {"run_id": self.run_id, "trigger": self.trigger.state_dict()}
        for follow_up in self.follow_ups:
            if follow_up.state_key is not None:
                state[follow_up.state_key] = follow_up.state_dict()
        return state

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.recorder.run_id = state_dict.get("run_id", self.run_id)  # a resumed run goes on as the same run
        self.trigger.load_state_dict(state_dict.get("trigger", {}))
        for follow_up in self.follow_ups:
            if follow_up.state_key is not None:
                follow_up.load_state_dict(state_dict.get(follow_up.state_key, {}))

    # ---- the decision and the round ------------------------------------------------------------

    def _agree(self, trainer: L.Trainer, causes: list[Cause]) -> list[Cause]:
        if self.trigger.freq_secs is None and self._follow_up(BudgetShare) is None:
            return causes  # steps, epochs and the adaptive schedule are the same numbers on every rank
        # Each rank reads its own clock, so the time trigger or the budget can decide one way on one
        # rank and the other way on another; acting on that would leave ranks waiting in different
        # collectives. Rank 0 decides.
        return trainer.strategy.broadcast(causes, src=0)

    def _adaptive_due(self, step: int) -> bool:
        """The adaptive schedule asks for a round; while a round is in flight, its verdict (did the
        metric move?) is not in yet, and the next interval waits for it."""
        adaptive: AdaptiveInterval | None = self._follow_up(AdaptiveInterval)
        if adaptive is None or step == self.trigger.last_evaluated_step or self.runner.busy:
            return False  # the same on every rank: rounds start and finish at agreed steps
        return adaptive.schedule.due(step)

    def _within_budget(self, step: int, causes: list[Cause]) -> list[Cause]:
        """`causes`, or none when the budget defers the round (the trigger keeps it due)."""
        budget: BudgetShare | None = self._follow_up(BudgetShare)
        if not causes or budget is None or budget.allows(step):
            return causes
        return []

    def _evaluate(self, trainer: L.Trainer, pl_module: L.LightningModule, causes: list[Cause]) -> None:
        step = trainer.global_step
        outcomes = self.runner.submit(trainer, pl_module, causes)
        self.trigger.mark_evaluated(step)  # sync: the round ended; async: training goes on from the snapshot
        self._conclude(trainer, outcomes)

    def _conclude(self, trainer: L.Trainer, outcomes: Sequence[Outcome]) -> None:
        """Every round the runner returns, at the step of its weights, on every rank alike: errors go
        by `on_error`; a finished round goes through the follow-ups, the callback metrics (for
        ModelCheckpoint and EarlyStopping), the record, then the follow-ups that read the record."""
        for done in outcomes:
            if isinstance(done, Skipped):
                self._skipped_step = done.step
                message = (
                    f"evaluation of step {done.step} skipped: the round of step {done.running_step} is still "
                    "running (on_busy='skip')"
                )
                trigger = [str(c) for c in done.causes]
                self.recorder.event(
                    trainer, "skipped", done.step, message, trigger=trigger, running_step=done.running_step
                )
                continue
            if done.error is not None:
                self._fail_round(trainer, done.step, done.error)
                continue
            self._conclude_round(trainer, done)

    def _fail_round(self, trainer: L.Trainer, step: int, err: EvalRoundError) -> None:
        """Records a failed round; raises (every rank alike) for the sanity round or ``on_error='raise'``.

        The first round of a fit is a sanity round, as Lightning's sanity check is for validation:
        its failure is most likely a bug in `evaluate_fn`, which would fail every later round too.
        """
        sanity = self._rounds_this_fit == 0
        self.recorder.error(trainer, step, err, stops=sanity or self.rounds.on_error is ErrorPolicy.RAISE)
        if sanity:
            raise EvalRoundError(
                f"{err}\n(This was the first evaluation round of this fit, a sanity round as Lightning's sanity check "
                "is for validation: its failure stops training whatever on_error says; later rounds follow on_error.)"
            ) from err
        if self.rounds.on_error is ErrorPolicy.RAISE:
            raise err

    def _conclude_round(self, trainer: L.Trainer, done: Finished) -> None:
        self.evaluated_steps.append(done.step)
        self._rounds_this_fit += 1
        for follow_up in self.follow_ups:
            if not follow_up.after_record:
                follow_up.observe(trainer, done, self.recorder)
        results = done.all_results
        publish_round(trainer, results, done.step)
        check_after_round(trainer, trainer.lightning_module, self._adopted)
        causes = [str(c) for c in done.causes]
        self.recorder.round(
            trainer,
            results,
            done.step,
            done.epoch,
            causes,
            cached=set(done.cached),
            fields=done.fields,
            extras=done.extras,
        )
        for follow_up in self.follow_ups:
            if follow_up.after_record:
                follow_up.observe(trainer, done, self.recorder)
