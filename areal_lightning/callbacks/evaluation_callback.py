"""`EvaluationCallback`: evaluate while training, when any configured trigger fires.

The hooks are guards: they ask the trigger whether a round is due, hand it to the runner
(`runners`: sync or async), and conclude every round the runner returns (`conclusion`: the
follow-ups of `follow_ups` and the recorder of `tracking.recorder`, in one fixed order).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from areal_lightning.callbacks import training_position as position
from areal_lightning.callbacks.conclusion import Conclusion
from areal_lightning.callbacks.follow_ups import (
    AdaptiveInterval,
    BestMetrics,
    BudgetShare,
    FollowUp,
    RewardHackingWatch,
    build_follow_ups,
)
from areal_lightning.callbacks.imports import named
from areal_lightning.callbacks.lightning_monitors import adopt_eval_monitors, hold_monitor_places
from areal_lightning.callbacks.parallelism import forwards_in_lockstep
from areal_lightning.callbacks.runners import RoundSpec, Runner, check_module_evaluates, make_runner
from areal_lightning.callbacks.sanity import SanityPass, check_set_names
from areal_lightning.callbacks.settings import Decisions, Execution, RoundSettings, Schedule, resolve_settings
from areal_lightning.callbacks.trigger import Cause
from areal_lightning.eval_round import EvalSet, EvaluateFn, as_eval_sets, check_eval_sets_consistent
from areal_lightning.tracking.console_log import show_package_lines
from areal_lightning.tracking.recorder import EvalRecorder

log = logging.getLogger(__name__)


class EvaluationCallback(Callback):
    """Evaluates the module on named eval sets whenever any trigger fires.

    The decision is the same on every rank. Each round runs `evaluate_fn` on this rank's deal of
    every eval set (`eval_round.run_round`), logs ``eval/<set>/<metric>`` to every Trainer logger
    at the evaluated global step and appends to ``<output_dir>/eval_history.jsonl``. When `fit`
    starts, a sanity pass runs `evaluate_fn` on the first batch of each eval set and checks every
    metric name the settings and the ``eval/`` monitors of `ModelCheckpoint` and `EarlyStopping`
    use (`callbacks.sanity`).

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
        run_id: the run's id in every history record; None: a new id (a resume keeps the checkpoint's).
        clock: seconds source of the time trigger and the budget (tests inject one).

    Each group is its dataclass, a mapping of its fields, or None for its defaults. Under
    ``fast_dev_run`` a round evaluates each eval set's first batch and records nothing.

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
        self.eval_sets = as_eval_sets(named(eval_sets, "eval_sets", call=True))
        evaluate_fn = named(evaluate_fn, "evaluate_fn")
        if evaluate_fn is not None and not callable(evaluate_fn):
            raise ValueError(f"`EvaluationCallback(evaluate_fn=...)` must be callable or None, got {evaluate_fn!r}")
        self.schedule, self.execution, self.rounds, self.decisions = resolve_settings(
            schedule, execution, rounds, decisions, evaluate_fn
        )
        check_set_names(self.schedule, self.decisions, [s.name for s in self.eval_sets])
        self.trigger = self.schedule.trigger(clock)
        self.runner: Runner = make_runner(self.execution, clock, evaluate_fn)
        self.follow_ups: list[FollowUp] = build_follow_ups(self.schedule, self.decisions, clock, self.eval_sets)
        self.adaptive_schedule = self.schedule.adaptive and self._follow_up(AdaptiveInterval).schedule
        self.best = self._follow_up(BestMetrics).best
        self.reward_watch = self.decisions.reward_watch and self._follow_up(RewardHackingWatch).watch
        self.recorder = EvalRecorder(run_id, self.execution.mode.value, verbose=self.rounds.verbose)
        self.output_dir = Path(output_dir) if output_dir is not None else None
        self.seed = seed
        self._evaluate_fn = evaluate_fn
        self._checked_eval_sets = False
        self._last_seen_step = -1
        self.weights_epoch: int | None = None  # the epoch of the latest step: its rounds' epoch
        self.conclusion = Conclusion(self.follow_ups, self.recorder, self.rounds.on_error)
        sanity_batches = self.rounds.sanity_batches
        self.sanity = SanityPass(sanity_batches, self.schedule, self.decisions, self.follow_ups, self.runner)
        freqs = {k: getattr(self.trigger, k) for k in ("freq_epochs", "freq_steps", "freq_secs")}  # state_key:
        self._state_key = self._generate_state_key(**freqs, eval_sets=[s.name for s in self.eval_sets])  # read often

    @property
    @override
    def state_key(self) -> str:
        return self._state_key

    @property
    def run_id(self) -> str:
        """The run's id in every history record; a resumed run keeps its checkpoint's."""
        return self.recorder.run_id

    @property
    def evaluated_steps(self) -> list[int]:
        """The steps whose rounds were concluded, in order (an async round at its snapshot's step)."""
        return self.conclusion.evaluated_steps

    @property
    def deferred_steps(self) -> list[int]:
        """The steps whose rounds the eval-time budget deferred."""
        budget = self._follow_up(BudgetShare)
        return budget.deferred_steps if budget is not None else []

    def _follow_up(self, kind: type[FollowUp]) -> Any:
        return next((f for f in self.follow_ups if isinstance(f, kind)), None)

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        check_module_evaluates(self._evaluate_fn, pl_module)
        if self.output_dir is None:
            self.output_dir = Path(trainer.default_root_dir)
        if self.seed is None:
            self.seed = int(getattr(pl_module, "seed", 0))
        show_package_lines()  # one line per round, as Lightning shows its own lines
        if not position.fast_dev_run(trainer):  # fast_dev_run writes nothing, as Lightning's own callbacks do not
            # A resumed run evaluates again the steps between its checkpoint and the crash: one record each.
            self.recorder.open(trainer, self.output_dir, once_per_step=[c.value for c in Cause])
        self.runner.setup(trainer)
        self.conclusion.adopted = adopt_eval_monitors(trainer)

    @override
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self._checked_eval_sets:
            check_eval_sets_consistent(self.eval_sets)  # every rank: a mismatch fails everywhere at once
            self._checked_eval_sets = True
        self.conclusion.rounds_this_fit = 0
        if trainer.global_step == 0 or self.weights_epoch is None:
            self.weights_epoch = trainer.current_epoch
        hold_monitor_places(trainer)
        if position.fast_dev_run(trainer):  # as Lightning runs one validation batch: each set's first batch
            self.eval_sets = [s.first_batches() for s in self.eval_sets]
            log.info("fast_dev_run: rounds evaluate the first batch of each eval set and record nothing")
        spec = RoundSpec(
            self.eval_sets,
            self._evaluate_fn,
            seed=int(self.seed or 0),
            max_table_rows=self.rounds.max_table_rows,
            precision=self.rounds.precision,
            lockstep=forwards_in_lockstep(trainer.strategy, pl_module),  # raises for tensor parallelism
            cache_dir=self.rounds.cache_path(Path(self.output_dir or trainer.default_root_dir)),
        )
        self.sanity.start(trainer, pl_module, spec, self.recorder, self.conclusion)  # before any clock runs
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
        self.weights_epoch = trainer.current_epoch
        self.conclusion(trainer, self.runner.poll(trainer, pl_module))
        last_batch = trainer.fit_loop.epoch_loop.batch_progress.is_last_batch
        causes = self.trigger.after_step(step, trainer.current_epoch, last_batch)
        causes = self._due(trainer, step, causes, adaptive=True, last_batch=last_batch)
        if causes:
            self._evaluate(trainer, pl_module, causes)

    @override
    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not position.epoch_ran_to_end(trainer):
            return  # max_steps or a stop cut the epoch short: no completed epoch (no `freq_epochs` round)
        step = trainer.global_step
        causes = self._due(trainer, step, self.trigger.after_epoch(step, trainer.current_epoch), last_batch=True)
        if causes:
            self._evaluate(trainer, pl_module, causes)

    @override
    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.conclusion(trainer, self.runner.finish(trainer, pl_module))  # eval_at_end waits for rounds in flight
        causes = self.trigger.at_end(trainer.global_step)
        if not causes and self.trigger.eval_at_end and self.conclusion.skipped_step == trainer.global_step:
            causes = [Cause.END]  # the last step's round was skipped while busy: the end still evaluates it
        if causes:
            self._evaluate(trainer, pl_module, causes)  # never deferred by the budget
            self.conclusion(trainer, self.runner.finish(trainer, pl_module))
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
        checkpoint[position.WEIGHTS_EPOCH_KEY] = self.weights_epoch  # `evaluate` records the weights under it
        if not self.runner.busy:
            return
        # A round in flight is finished and recorded before the checkpoint is written, so a resume
        # neither loses nor repeats it. Every rank saves (Lightning dumps the checkpoint on all),
        # and every rank has the same round in flight: the reduction's collectives match.
        self.conclusion(trainer, self.runner.finish(trainer, pl_module))
        if "callbacks" in checkpoint:  # Lightning took our state before this hook: take it again
            checkpoint["callbacks"][self.state_key] = self.state_dict()

    @override
    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {
            "run_id": self.run_id,
            "trigger": self.trigger.state_dict(),
            position.WEIGHTS_EPOCH_KEY: self.weights_epoch,
        }
        for follow_up in self.follow_ups:
            if follow_up.state_key is not None:
                state[follow_up.state_key] = follow_up.state_dict()
        return state

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.recorder.run_id = state_dict.get("run_id", self.run_id)  # a resumed run goes on as the same run
        self.weights_epoch = state_dict.get(position.WEIGHTS_EPOCH_KEY)  # None: a checkpoint from before it was kept
        self.trigger.load_state_dict(state_dict.get("trigger", {}))
        for follow_up in self.follow_ups:
            if follow_up.state_key is not None:
                follow_up.load_state_dict(state_dict.get(follow_up.state_key, {}))

    def _due(
        self, trainer: L.Trainer, step: int, causes: list[Cause], *, last_batch: bool, adaptive: bool = False
    ) -> list[Cause]:
        """The causes every rank acts on: the trigger's, the adaptive schedule's (not while a round is
        in flight: its verdict, did the metric move, is not in yet), none while the budget defers
        the round (the trigger keeps it due); and the end's, when training stops after this step."""
        interval: AdaptiveInterval | None = self._follow_up(AdaptiveInterval)
        if adaptive and interval and step != self.trigger.last_evaluated_step and not self.runner.busy:
            causes += [Cause.ADAPTIVE] if interval.schedule.due(step) else []
        budget: BudgetShare | None = self._follow_up(BudgetShare)
        if causes and budget is not None and not budget.allows(step):
            causes = []
        if self.trigger.freq_secs is not None or budget is not None:
            # Each rank reads its own clock, so the time trigger or the budget can decide one way on
            # one rank and the other way on another; acting on that would leave ranks waiting in
            # different collectives. Rank 0 decides. (Steps and epochs are the same on every rank.)
            causes = trainer.strategy.broadcast(causes, src=0)
        if causes and self.trigger.eval_at_end and position.is_last_step(trainer, step, last_batch):
            causes = [*causes, Cause.END]  # the end round would evaluate these weights again
        return causes

    def _evaluate(self, trainer: L.Trainer, pl_module: L.LightningModule, causes: list[Cause]) -> None:
        step = trainer.global_step
        outcomes = self.runner.submit(trainer, pl_module, causes, int(self.weights_epoch or 0))
        self.trigger.mark_evaluated(step)  # sync: the round ended; async: training goes on from the snapshot
        self.conclusion(trainer, outcomes)
