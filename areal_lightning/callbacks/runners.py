"""How a round runs: on the training thread (`SyncRunner`) or in the background on a snapshot of
the weights (`AsyncRunner`: in a worker process, or in a thread for rounds that wait on servers).

The callback holds one runner and asks it three things: `submit` a round when a trigger fires,
`poll` every step, `finish` at the end or before a checkpoint. Each call returns the rounds that
ended during it, reduced on every rank (`Finished`), or that were not run (`Skipped`); the callback
concludes them the same way whichever runner produced them, and never asks which mode it is in.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import lightning as L
from lightning.pytorch.trainer.states import TrainerFn

from areal_lightning.callbacks.async_evaluator import AsyncEvaluator, module_evaluate
from areal_lightning.callbacks.choices import EvalMode, OnBusy
from areal_lightning.callbacks.parallelism import refuse_for_async
from areal_lightning.callbacks.progress_bar import trainer_progress
from areal_lightning.callbacks.thread_evaluator import ThreadEvaluator, in_thread
from areal_lightning.callbacks.trigger import Cause
from areal_lightning.eval_round import EvalRoundError, EvalSet, EvaluateFn, SetResult, reduce_round, run_round
from areal_lightning.eval_round.cache import ResultCache, cached_results
from areal_lightning.eval_round.precision import EvalPrecision, eval_precision

if TYPE_CHECKING:
    from areal_lightning.callbacks.settings import Execution

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RoundSpec:
    """What every round of a fit evaluates, fixed when training starts."""

    eval_sets: list[EvalSet]
    evaluate_fn: EvaluateFn | None
    seed: int
    max_table_rows: int
    precision: EvalPrecision
    lockstep: bool = False
    """Every rank runs the same number of forwards (sharded parameters)."""
    cache_dir: Path | None = None
    """Where the result cache lives; None: no cache."""


@dataclass
class Finished:
    """A round that ended: its reduced results (the same on every rank), or its error.

    `results` are the sets evaluated now, `cached` the ones the result cache answered; the
    follow-ups may add metrics to both, and `extras` (run-level numbers, logged as ``eval/<name>``)
    and `fields` (keys of every history record of the round).
    """

    step: int
    epoch: int
    causes: list[Cause]
    results: list[SetResult] = field(default_factory=list)
    cached: dict[str, SetResult] = field(default_factory=dict)
    blocked_secs: float = 0.0
    """How long the round held training up (the budget charges this)."""
    fields: dict[str, Any] = field(default_factory=dict)
    extras: dict[str, float] = field(default_factory=dict)
    error: EvalRoundError | None = None
    """The round's failure; `results` and `cached` still hold the sets that did not fail."""
    order: list[str] = field(default_factory=list)
    """The eval sets' names in their order; empty: the order of `results`."""

    @property
    def all_results(self) -> list[SetResult]:
        """Every set's result, fresh or cached, in the eval sets' order."""
        if not self.cached:
            return self.results
        by_name = {r.dataset: r for r in self.results} | self.cached
        return [by_name[name] for name in self.order]


@dataclass(frozen=True)
class Skipped:
    """A round that fell due while another was in flight, and was not run (``on_busy="skip"``)."""

    step: int
    running_step: int
    causes: list[Cause]


Outcome = Finished | Skipped


class Runner(Protocol):
    """Runs rounds for `EvaluationCallback`; every method is called on every rank alike."""

    mode: EvalMode

    @property
    def busy(self) -> bool:
        """A round is in flight (the same on every rank)."""

    def setup(self, trainer: L.Trainer) -> None:
        """Refuses a strategy the runner cannot work with, before training starts."""

    def start(self, trainer: L.Trainer, pl_module: L.LightningModule, spec: RoundSpec) -> None:
        """Training starts: what the rounds of this fit evaluate."""

    def submit(
        self, trainer: L.Trainer, pl_module: L.LightningModule, causes: list[Cause], epoch: int
    ) -> list[Outcome]:
        """A round of the current weights is due; `epoch` is the epoch of their last step."""

    def poll(self, trainer: L.Trainer, pl_module: L.LightningModule) -> list[Outcome]:
        """Every optimizer step: the rounds that ended since; never waits."""

    def finish(self, trainer: L.Trainer, pl_module: L.LightningModule) -> list[Outcome]:
        """Waits for the round in flight, if any."""

    def close(self, cancel: bool = False) -> None:
        """Training ended (or crashed, with `cancel`): release what the runner holds."""


def check_module_evaluates(evaluate_fn: EvaluateFn | None, pl_module: L.LightningModule) -> None:
    """Without an `evaluate_fn` the module must have its own ``evaluate(batches, ctx)``.

    Raises:
        ValueError: naming the module and the way out.
    """
    if evaluate_fn is None and not callable(getattr(pl_module, "evaluate", None)):
        raise ValueError(
            f"`EvaluationCallback(evaluate_fn=None)` needs a module with an `evaluate(batches, ctx)` method, "
            f"and {type(pl_module).__name__} has none; pass evaluate_fn=..."
        )


def round_evaluate_fn(spec: RoundSpec, pl_module: L.LightningModule) -> EvaluateFn:
    """The spec's `evaluate_fn`, else the module's own ``evaluate`` as a plain function (its
    qualified name and code key the result cache)."""
    return (
        spec.evaluate_fn
        or getattr(type(pl_module), "evaluate", None)
        or (lambda module, batches, ctx: module.evaluate(batches, ctx))
    )


def run_unrecorded(
    trainer: L.Trainer, pl_module: L.LightningModule, spec: RoundSpec, eval_sets: list[EvalSet]
) -> list[SetResult]:
    """The sanity pass's round of `eval_sets` on the training thread (``ctx.sanity``), at the spec's
    precision, with no cache and no progress display; raises `EvalRoundError` as `run_round` does."""
    with eval_precision(pl_module, spec.precision):
        return run_round(
            pl_module,
            eval_sets,
            round_evaluate_fn(spec, pl_module),
            seed=spec.seed,
            global_step=trainer.global_step,
            epoch=trainer.current_epoch,
            lockstep=spec.lockstep,
            sanity=True,
        )


class SyncRunner:
    """Runs each round at once on the training thread, answering eval sets from the result cache
    when the spec names a cache directory."""

    mode = EvalMode.SYNC
    busy = False

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._spec: RoundSpec | None = None

    def setup(self, trainer: L.Trainer) -> None:
        pass

    def start(self, trainer: L.Trainer, pl_module: L.LightningModule, spec: RoundSpec) -> None:
        self._spec = spec

    def submit(
        self, trainer: L.Trainer, pl_module: L.LightningModule, causes: list[Cause], epoch: int
    ) -> list[Outcome]:
        spec = self._spec
        assert spec is not None, "start() comes first"
        step = trainer.global_step
        started = self._clock()
        evaluate_fn = round_evaluate_fn(spec, pl_module)
        cached, keys = self._cached_results(trainer, pl_module, evaluate_fn)
        error = None
        try:
            with eval_precision(pl_module, spec.precision):
                fresh = run_round(
                    pl_module,
                    [s for s in spec.eval_sets if s.name not in cached],
                    evaluate_fn,
                    seed=spec.seed,
                    global_step=step,
                    epoch=epoch,
                    max_table_rows=spec.max_table_rows,
                    progress=trainer_progress(trainer),
                    lockstep=spec.lockstep,
                )
        except EvalRoundError as err:
            fresh, error = err.results, err  # the sets that did not fail are kept
        if keys:
            assert spec.cache_dir is not None  # keys exist only with the cache on
            for r in fresh:
                ResultCache(spec.cache_dir).put(keys[r.dataset], r)  # rank 0 only: `keys` is empty elsewhere
        order = [s.name for s in spec.eval_sets if s.name in cached or any(r.dataset == s.name for r in fresh)]
        blocked = self._clock() - started
        # Evaluated at the step that asked for it: a lag of 0 steps, recorded as async rounds record theirs.
        return [
            Finished(
                step, epoch, causes, fresh, cached, blocked_secs=blocked, error=error, order=order,
                fields={"lag_steps": 0},
            )
        ]  # fmt: skip

    def poll(self, trainer: L.Trainer, pl_module: L.LightningModule) -> list[Outcome]:
        return []

    def finish(self, trainer: L.Trainer, pl_module: L.LightningModule) -> list[Outcome]:
        return []

    def close(self, cancel: bool = False) -> None:
        pass

    def _cached_results(
        self, trainer: L.Trainer, pl_module: L.LightningModule, evaluate_fn: EvaluateFn
    ) -> tuple[dict[str, SetResult], dict[str, str]]:
        spec = self._spec
        if spec is None or spec.cache_dir is None:
            return {}, {}
        return cached_results(
            spec.cache_dir,
            pl_module,
            spec.eval_sets,
            evaluate_fn,
            is_global_zero=trainer.is_global_zero,
            broadcaster=trainer.strategy,
            seed=spec.seed,
            precision=str(spec.precision.value),
            max_table_rows=spec.max_table_rows,
        )


class AsyncRunner:
    """Hands each round to an `AsyncEvaluator` worker and reduces its results at a step every rank
    agrees on; at most one round in flight, the next one skipped or waiting per `on_busy`."""

    mode = EvalMode.ASYNC

    def __init__(
        self,
        evaluator: AsyncEvaluator | ThreadEvaluator,
        on_busy: OnBusy = OnBusy.SKIP,
        clock: Callable[[], float] = time.monotonic,
        evaluate_fn: EvaluateFn | None = None,
    ) -> None:
        self.evaluator = evaluator
        self.evaluate_fn = evaluate_fn
        self.on_busy = on_busy
        self._clock = clock
        self._eval_sets: list[EvalSet] = []
        self._blocked_secs = 0.0  # training time the round in flight has taken so far (its copy)

    @property
    def busy(self) -> bool:
        return self.evaluator.in_flight is not None

    def setup(self, trainer: L.Trainer) -> None:
        refuse_for_async(trainer.strategy)
        if in_thread(self.evaluate_fn, trainer.lightning_module) and isinstance(self.evaluator, AsyncEvaluator):
            # Rounds that wait on servers need no worker process: a thread of this one runs them.
            self.evaluator = ThreadEvaluator(self.evaluator.max_snapshot_mib)
        if trainer.state.fn == TrainerFn.FITTING:
            # Started now, the worker is ready when training starts and the first round falls due.
            modules = {type(m).__module__ for m in trainer.lightning_module.modules()} - {"__main__"}
            self.evaluator.launch(sorted(modules))

    def start(self, trainer: L.Trainer, pl_module: L.LightningModule, spec: RoundSpec) -> None:
        self._eval_sets = list(spec.eval_sets)
        self.evaluator.start(
            pl_module,
            spec.eval_sets,
            spec.evaluate_fn or module_evaluate,
            seed=spec.seed,
            rank=trainer.global_rank,
            world_size=trainer.world_size,
            max_table_rows=spec.max_table_rows,
            precision=spec.precision,
        )

    def submit(
        self, trainer: L.Trainer, pl_module: L.LightningModule, causes: list[Cause], epoch: int
    ) -> list[Outcome]:
        step = trainer.global_step
        running = self.evaluator.in_flight
        if running is not None and self.on_busy is OnBusy.SKIP:
            # Whether a round is in flight is the same on every rank (rounds start and finish at
            # agreed steps), so every rank skips alike.
            return [Skipped(step, running.step, causes)]
        done = self.finish(trainer, pl_module)
        copy_started = self._clock()
        snapshot = self.evaluator.submit(pl_module, step, epoch, causes)
        self._blocked_secs += self._clock() - copy_started
        log.info(
            "async evaluation of step %d started: %.2f MiB snapshot copied in %.4f s",
            step,
            snapshot.mib,
            snapshot.copy_secs,
        )
        return done

    def poll(self, trainer: L.Trainer, pl_module: L.LightningModule) -> list[Outcome]:
        if self.evaluator.in_flight is None:
            self.evaluator.poll_start()
            return []
        # Each rank's worker finishes on its own clock, and the reduction is collective: a rank
        # that reduced alone would wait for the others. Reduce when every rank is ready.
        if not trainer.strategy.reduce_boolean_decision(self.evaluator.ready(), all=True):
            return []
        return self._collect(trainer, pl_module)

    def finish(self, trainer: L.Trainer, pl_module: L.LightningModule) -> list[Outcome]:
        return self._collect(trainer, pl_module) if self.evaluator.in_flight is not None else []

    def close(self, cancel: bool = False) -> None:
        self.evaluator.close(cancel=cancel)

    def _collect(self, trainer: L.Trainer, pl_module: L.LightningModule) -> list[Outcome]:
        """Reduces the round in flight on every rank, at its snapshot's step; the budget is charged
        what held training up: the snapshot's copy, the wait for the worker, the reduction."""
        started = self._clock()
        snapshot, local = self.evaluator.collect(self._eval_sets)
        blocked, self._blocked_secs = self._blocked_secs, 0.0
        causes = [Cause(c) for c in snapshot.causes]
        error = None
        try:
            results = reduce_round(local, self._eval_sets, device=pl_module.device)
        except EvalRoundError as err:  # every rank alike; the other sets are still reduced
            results, error = err.results, err
        fields: Mapping[str, Any] = {
            "lag_steps": trainer.global_step - snapshot.step,
            "snapshot_mib": snapshot.mib,
            "snapshot_secs": snapshot.copy_secs,
            "start_secs": self.evaluator.start_secs,
        }
        blocked += self._clock() - started
        return [
            Finished(
                snapshot.step, snapshot.epoch, causes, results, blocked_secs=blocked, fields=dict(fields), error=error
            )
        ]


def make_runner(
    execution: Execution, clock: Callable[[], float] = time.monotonic, evaluate_fn: EvaluateFn | None = None
) -> Runner:
    """The runner of `execution.mode`: the one place that looks at the mode. An async round runs in a
    worker process, or in a thread where `evaluate_fn` (None: the module's ``evaluate``) waits on
    servers (`thread_evaluator.in_thread`, decided when fit sets up)."""
    if execution.mode is EvalMode.ASYNC:
        evaluator = AsyncEvaluator(execution.async_device, execution.async_threads, execution.max_snapshot_mib)
        return AsyncRunner(evaluator, execution.on_busy, clock, evaluate_fn)
    return SyncRunner(clock)
