"""`EvaluationCallback`: evaluate while training, when any configured trigger fires."""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback, EarlyStopping
from typing_extensions import override

from areal_lightning.callbacks.adaptive import AdaptiveSchedule
from areal_lightning.callbacks.async_evaluator import (
    AsyncEvaluator,
    Snapshot,
    module_evaluate,
    refuse_sharded,
)
from areal_lightning.callbacks.best import DEFAULT_BEST_METRICS, BestValues
from areal_lightning.callbacks.budget import EvalBudget
from areal_lightning.callbacks.decisions import (
    adopt_eval_monitors,
    check_after_round,
    hold_monitor_places,
    publish_round,
    report_alert,
    watch_round,
)
from areal_lightning.callbacks.imports import import_object
from areal_lightning.callbacks.options import (
    DEFAULT_ASYNC_THREADS,
    DEFAULT_MAX_SNAPSHOT_MB,
    DEFAULT_TABLE_ROWS,
    Direction,
    ErrorPolicy,
    EvalMode,
    OnBusy,
    ThresholdAction,
    check_cache_mode,
    choice,
)
from areal_lightning.callbacks.parallelism import forwards_in_lockstep
from areal_lightning.callbacks.progress import trainer_progress
from areal_lightning.callbacks.reward_watch import RewardWatch, as_reward_watch
from areal_lightning.callbacks.thresholds import Alert, ThresholdMonitor
from areal_lightning.callbacks.trigger import Cause, HybridTrigger
from areal_lightning.errors import ArgumentError
from areal_lightning.eval_round import (
    EvalRoundError,
    EvalSet,
    EvaluateFn,
    LocalSetResult,
    SetResult,
    as_eval_sets,
    check_eval_sets_consistent,
    reduce_set,
    run_round,
)
from areal_lightning.eval_round.cache import (
    CACHE_DIRNAME,
    ResultCache,
    UncacheableError,
    function_identity,
    result_key,
    weights_digest,
)
from areal_lightning.eval_round.drift import DriftMonitor
from areal_lightning.eval_round.precision import EvalPrecision, eval_precision
from areal_lightning.metrics.paired import PairedRounds
from areal_lightning.tracking.history import (
    EvalHistory,
    eval_record,
    event_record,
    new_run_id,
)
from areal_lightning.tracking.loggers import log_eval_results

log = logging.getLogger(__name__)


SANITY_NOTE = (
    "(the first evaluation round of a fit is a sanity round, as Lightning's sanity check is for validation: "
    "its failure stops training whatever on_error says; later rounds follow on_error)"
)


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
        freq_epochs, freq_steps, freq_secs, eval_before_train, eval_at_end: see `HybridTrigger`.
        metric_thresholds: `{metric: minimum}`; a metric that reached its minimum and falls below
            it raises one alert per crossing.
        threshold_action: ``alert`` (log, history record, W&B alert) or ``stop`` (also stop training).
        on_error: ``log`` (record the exception and keep training) or ``raise``. The first round
            of a fit is a sanity round: when it fails, training stops whatever `on_error` says.
        output_dir: where the eval history goes; None: the Trainer's `default_root_dir`.
        seed: run seed from which each sample's seed derives; None: the module's `seed` or 0.
        max_table_rows: sample generations per eval set kept for W&B tables.
        mode: ``sync`` (training waits for the round) or ``async`` (a worker process evaluates a
            snapshot of the weights while training goes on; see ``docs/async_evaluation.md``).
        on_busy: async only: a round that falls due while the previous one still runs is
            ``skip``-ped (recorded as a ``skipped`` event) or ``wait``-s for it.
        async_device: async only: where the worker evaluates; None: the training device.
        async_threads: async only: torch threads of the worker process.
        max_snapshot_mb: async only: the most MiB the weight snapshot may take; None: no bound.
        run_id: the run's id, written in every history record; None: a new id. A run resumed
            from a checkpoint passes its first session's id, so that its records continue that run.
        adaptive: an `AdaptiveSchedule` (or its arguments as a mapping): one more trigger (OR) whose
            interval shrinks while the watched metric moves by more than its paired interval and
            grows while it does not; each change is logged and recorded (``"event": "adaptive"``).
        budget: the largest share of training wall time spent evaluating, in (0, 1]; rounds are
            deferred to keep it (never the final one). None: no budget.
        use_cache: answer an eval set from ``cache_dir`` when the same weights were evaluated with
            the same eval set and settings (history ``"cached": true``, `evaluate_fn` not called).
        cache_dir: where the cache lives; None: ``<output_dir>/eval_cache``.
        precision: ``32``, ``bf16`` or ``16``: autocast during evaluation only.
        best_metrics: ``{metric: "max" | "min"}`` whose best value and step are kept (in the
            checkpoint) and logged as ``eval/<set>/<metric>/best`` and ``.../best_step``; None:
            ``accuracy`` and ``reward/mean``, higher is better.
        reward_watch: a `RewardWatch` (or its arguments as a mapping): alert when the training
            reward rises while an eval metric falls beyond its noise (``docs/decisions.md``).
        clock: seconds source of the time trigger and the budget (tests inject one).

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
        >>> cb = EvaluationCallback({"easy": [1, 2, 3]}, evaluate_fn=lambda m, b, ctx: {}, freq_steps=100)
        >>> cb.trigger.describe()
        'evaluate every 100 steps, at the end'
    """

    def __init__(
        self,
        eval_sets: Mapping[str, Sequence[Any]] | Sequence[EvalSet] | str,
        evaluate_fn: EvaluateFn | str | None = None,
        *,
        freq_epochs: int | None = None,
        freq_steps: int | None = None,
        freq_secs: float | None = None,
        eval_before_train: bool = False,
        eval_at_end: bool = True,
        metric_thresholds: Mapping[str, float] | None = None,
        threshold_action: ThresholdAction | str = ThresholdAction.ALERT,
        on_error: ErrorPolicy | str = ErrorPolicy.LOG,
        output_dir: str | Path | None = None,
        seed: int | None = None,
        max_table_rows: int = DEFAULT_TABLE_ROWS,
        mode: EvalMode | str = EvalMode.SYNC,
        on_busy: OnBusy | str = OnBusy.SKIP,
        async_device: str | None = None,
        async_threads: int = DEFAULT_ASYNC_THREADS,
        max_snapshot_mb: float | None = DEFAULT_MAX_SNAPSHOT_MB,
        run_id: str | None = None,
        adaptive: AdaptiveSchedule | Mapping[str, Any] | None = None,
        budget: float | None = None,
        use_cache: bool = False,
        cache_dir: str | Path | None = None,
        precision: EvalPrecision | int | str = EvalPrecision.FP32,
        best_metrics: Mapping[str, Direction | str] | None = None,
        reward_watch: RewardWatch | Mapping[str, Any] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if isinstance(eval_sets, str):  # a factory (or a value) named in a YAML file
            found = import_object(eval_sets, "EvaluationCallback", "eval_sets")
            self.eval_sets = as_eval_sets(found() if callable(found) else found)
        else:
            self.eval_sets = as_eval_sets(eval_sets)
        if isinstance(evaluate_fn, str):  # e.g. LightningCLI's init_args: evaluate_fn: my_project.evals.evaluate
            evaluate_fn = import_object(evaluate_fn, "EvaluationCallback", "evaluate_fn")
        if evaluate_fn is not None and not callable(evaluate_fn):
            raise ValueError(f"`EvaluationCallback(evaluate_fn=...)` must be callable or None, got {evaluate_fn!r}")
        self.threshold_action = choice("threshold_action", threshold_action, ThresholdAction)
        self.on_error = choice("on_error", on_error, ErrorPolicy)
        self.mode = choice("mode", mode, EvalMode)
        self.on_busy = choice("on_busy", on_busy, OnBusy)
        # Checked in either mode, so that a config error shows before the mode is switched.
        async_evaluator = AsyncEvaluator(async_device, async_threads, max_snapshot_mb)
        self._async = async_evaluator if self.mode is EvalMode.ASYNC else None
        # Checked here, not at the first round: a negative count would silently keep no table rows.
        if isinstance(max_table_rows, bool) or not isinstance(max_table_rows, int) or max_table_rows < 0:
            raise ArgumentError("EvaluationCallback", "max_table_rows", max_table_rows, "a non-negative integer")
        self.trigger = HybridTrigger(
            freq_epochs=freq_epochs,
            freq_steps=freq_steps,
            freq_secs=freq_secs,
            eval_before_train=eval_before_train,
            eval_at_end=eval_at_end,
            clock=clock,
        )
        self.thresholds = ThresholdMonitor(metric_thresholds)
        if run_id is not None and (not isinstance(run_id, str) or not run_id):
            raise ArgumentError("EvaluationCallback", "run_id", run_id, "a non-empty string or None")
        self.run_id = run_id or new_run_id()
        # ---- smarter evaluation (issue 13): each piece lives in its own module
        if adaptive is not None and not isinstance(adaptive, AdaptiveSchedule):
            if not isinstance(adaptive, Mapping):
                raise ArgumentError(
                    "EvaluationCallback", "adaptive", adaptive, "an AdaptiveSchedule, a mapping or None"
                )
            adaptive = AdaptiveSchedule(**adaptive)
        self.adaptive = adaptive
        self.budget = EvalBudget(budget, clock) if budget is not None else None
        if not isinstance(use_cache, bool):
            raise ArgumentError("EvaluationCallback", "use_cache", use_cache, "True or False")
        check_cache_mode(self.mode, use_cache)
        if use_cache and evaluate_fn is not None:
            try:
                function_identity(evaluate_fn)
            except UncacheableError as err:
                raise ValueError(
                    f"`EvaluationCallback(use_cache=True)` cannot key evaluate_fn: {err}; pass use_cache=False"
                ) from None
        self.use_cache = use_cache
        self.cache_dir = Path(cache_dir) if cache_dir is not None else None
        self.precision = EvalPrecision.parse(precision)
        self.pairs = PairedRounds()
        self.drift = DriftMonitor()
        # ---- decisions (issue 16): best values and the reward-hacking watch, in their own modules
        self.best = BestValues(DEFAULT_BEST_METRICS if best_metrics is None else best_metrics)
        self.reward_watch = as_reward_watch(reward_watch)
        self.deferred_steps: list[int] = []
        self._deferred_since_round = 0
        self._clock = clock
        self.output_dir = Path(output_dir) if output_dir is not None else None
        self.seed = seed
        self.max_table_rows = max_table_rows
        self._evaluate_fn = evaluate_fn
        self._history: EvalHistory | None = None
        self._adopted: list[EarlyStopping] = []  # EarlyStopping on eval metrics: checked after each round
        self._rounds_this_fit = 0  # the first round of a fit is a sanity round: its failure stops training
        self._checked_eval_sets = False
        self._last_seen_step = -1
        self._lockstep = False  # decided from the strategy once the model is sharded (on_train_start)
        self._skipped_step: int | None = None  # async: the latest step whose round was skipped
        self._blocked_secs = 0.0  # async: training time the round in flight has taken so far (its copy)
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
        # fast_dev_run writes nothing, as Lightning's own callbacks do not.
        if trainer.is_global_zero and not _fast_dev_run(trainer):
            # A resumed run evaluates again the steps between its checkpoint and the crash: one record each.
            self._history = EvalHistory.in_run_dir(self.output_dir, once_per_step=[c.value for c in Cause])
        if self.use_cache and self.cache_dir is None:
            self.cache_dir = self.output_dir / CACHE_DIRNAME
        if self._async is not None:
            refuse_sharded(trainer.strategy)
        self._adopted = adopt_eval_monitors(trainer)

    @override
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self._checked_eval_sets:
            check_eval_sets_consistent(self.eval_sets)  # every rank: a mismatch fails everywhere at once
            self._checked_eval_sets = True
        self._lockstep = forwards_in_lockstep(trainer.strategy, pl_module)  # raises for tensor parallelism
        self._rounds_this_fit = 0
        hold_monitor_places(trainer)
        if _fast_dev_run(trainer):
            # As Lightning's fast_dev_run runs one validation batch: each eval set's first batch, unrecorded.
            self.eval_sets = [s.first_batch() for s in self.eval_sets]
            log.info("fast_dev_run: rounds evaluate the first batch of each eval set and record nothing")
        self._check_drift(trainer)
        self.trigger.start()
        if self.budget is not None:
            self.budget.start()
        self._last_seen_step = trainer.global_step
        if self._async is not None:
            self._async.start(
                pl_module,
                self.eval_sets,
                self._evaluate_fn or module_evaluate,
                seed=int(self.seed or 0),
                rank=trainer.global_rank,
                world_size=trainer.world_size,
                max_table_rows=self.max_table_rows,
                precision=self.precision,
            )
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
        if self._async is not None:
            if self._async.in_flight is not None:
                self._finish_async(trainer, pl_module, wait=False)
            else:
                self._async.poll_start()
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
        self._finish_async(trainer, pl_module, wait=True)  # eval_at_end waits for rounds in flight
        causes = self.trigger.at_end(trainer.global_step)
        if not causes and self.trigger.eval_at_end and self._skipped_step == trainer.global_step:
            causes = [Cause.END]  # the last step's round was skipped while busy: the end still evaluates it
        if causes:
            self._evaluate(trainer, pl_module, causes)  # never deferred by the budget
            self._finish_async(trainer, pl_module, wait=True)
        self.trigger.stop()
        if self.budget is not None:
            self.budget.stop()
        if self._async is not None:
            self._async.close()

    @override
    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        if self._async is not None:
            self._async.close(cancel=True)  # a crash or Ctrl-C leaves no worker behind

    @override
    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self._async is not None:
            self._async.close(cancel=True)

    @override
    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        if self._async is None or self._async.in_flight is None:
            return
        # A round in flight is finished and recorded before the checkpoint is written, so a resume
        # neither loses nor repeats it. Every rank saves (Lightning dumps the checkpoint on all),
        # and every rank has the same round in flight: the reduction's collectives match.
        self._finish_async(trainer, pl_module, wait=True)
        if "callbacks" in checkpoint:  # Lightning took our state before this hook: take it again
            checkpoint["callbacks"][self.state_key] = self.state_dict()

    @override
    def state_dict(self) -> dict[str, Any]:
        state = {
            "run_id": self.run_id,
            "trigger": self.trigger.state_dict(),
            "thresholds": self.thresholds.state_dict(),
            "drift": self.drift.state_dict(),
            "best": self.best.state_dict(),
            "pairs": self.pairs.state_dict(),  # every rank's outcomes: a collective under DDP
        }
        if self.reward_watch is not None:
            state["reward_watch"] = self.reward_watch.state_dict()
        if self.adaptive is not None:
            state["adaptive"] = self.adaptive.state_dict()
        if self.budget is not None:
            state["budget"] = self.budget.state_dict()
        return state

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.run_id = state_dict.get("run_id", self.run_id)  # a resumed run goes on as the same run
        self.trigger.load_state_dict(state_dict.get("trigger", {}))
        self.thresholds.load_state_dict(state_dict.get("thresholds", {}))
        self.drift.load_state_dict(state_dict.get("drift", {}))
        self.best.load_state_dict(state_dict.get("best", {}))
        self.pairs.load_state_dict(state_dict.get("pairs", {}))
        if self.reward_watch is not None:
            self.reward_watch.load_state_dict(state_dict.get("reward_watch", {}))
        if self.adaptive is not None:
            self.adaptive.load_state_dict(state_dict.get("adaptive", {}))
        if self.budget is not None:
            self.budget.load_state_dict(state_dict.get("budget", {}))

    # ---- the decision and the round ------------------------------------------------------------

    def _agree(self, trainer: L.Trainer, causes: list[Cause]) -> list[Cause]:
        if self.trigger.freq_secs is None and self.budget is None:
            return causes  # steps, epochs and the adaptive schedule are the same numbers on every rank
        # Each rank reads its own clock, so the time trigger or the budget can decide one way on one
        # rank and the other way on another; acting on that would leave ranks waiting in different
        # collectives. Rank 0 decides.
        return trainer.strategy.broadcast(causes, src=0)

    def _adaptive_due(self, step: int) -> bool:
        """The adaptive schedule asks for a round; while an async round is in flight, its verdict
        (did the metric move?) is not in yet, and the next interval waits for it."""
        if self.adaptive is None or step == self.trigger.last_evaluated_step:
            return False
        if self._async is not None and self._async.in_flight is not None:
            return False  # the same on every rank: rounds start and finish at agreed steps
        return self.adaptive.due(step)

    def _within_budget(self, step: int, causes: list[Cause]) -> list[Cause]:
        """`causes`, or none when the budget defers the round (the trigger keeps it due)."""
        if not causes or self.budget is None or self.budget.allows():
            return causes
        self.deferred_steps.append(step)
        self.budget.defer()
        return []

    def _check_drift(self, trainer: L.Trainer) -> None:
        for name, message in self.drift.check(self.eval_sets).items():
            self.pairs.reset(name)  # the new content has nothing to pair with
            if trainer.is_global_zero:
                warnings.warn(message, stacklevel=2)
            if self._history is not None:
                self._history.append(event_record("drift", trainer.global_step, dataset=name, message=message))

    def _cache_keys(self, pl_module: L.LightningModule, evaluate_fn: EvaluateFn) -> dict[str, str]:
        weights = weights_digest(pl_module)
        settings = {
            "seed": int(self.seed or 0),
            "precision": str(self.precision.value),
            "evaluate_fn": function_identity(evaluate_fn),
            "max_table_rows": self.max_table_rows,
        }
        return {s.name: result_key(weights, s, **settings) for s in self.eval_sets}

    def _cached_results(
        self, trainer: L.Trainer, pl_module: L.LightningModule, evaluate_fn: EvaluateFn
    ) -> tuple[dict[str, SetResult], dict[str, str]]:
        """The eval sets answered from the cache (rank 0 looks, every rank gets its answer) and,
        on rank 0, every set's key."""
        if not self.use_cache:
            return {}, {}
        keys: dict[str, str] = {}
        hits: dict[str, SetResult] = {}
        if trainer.is_global_zero:
            assert self.cache_dir is not None
            try:
                keys = self._cache_keys(pl_module, evaluate_fn)
            except UncacheableError as err:  # state changed since construction: evaluate, cache nothing
                warnings.warn(f"result cache skipped this round: {err}", stacklevel=2)
            cache = ResultCache(self.cache_dir)
            hits = {name: r for name, key in keys.items() if (r := cache.get(key)) is not None}
        # Every rank must skip the same eval sets, or the ranks that evaluate wait for the others.
        return trainer.strategy.broadcast(hits, src=0), keys

    def _evaluate(self, trainer: L.Trainer, pl_module: L.LightningModule, causes: list[Cause]) -> None:
        if self._async is not None:
            self._submit(trainer, pl_module, causes)
            return
        step, epoch = trainer.global_step, trainer.current_epoch
        started = self._clock()
        # The module's own method as a plain function: its qualified name and code key the cache.
        evaluate_fn = (
            self._evaluate_fn
            or getattr(type(pl_module), "evaluate", None)
            or (lambda module, batches, ctx: module.evaluate(batches, ctx))
        )
        cached, keys = self._cached_results(trainer, pl_module, evaluate_fn)
        try:
            with eval_precision(pl_module, self.precision):
                fresh = run_round(
                    pl_module,
                    [s for s in self.eval_sets if s.name not in cached],
                    evaluate_fn,
                    seed=int(self.seed or 0),
                    global_step=step,
                    epoch=epoch,
                    max_table_rows=self.max_table_rows,
                    progress=trainer_progress(trainer),
                    lockstep=self._lockstep,
                )
        except EvalRoundError as err:
            self.trigger.mark_evaluated(step)
            self._fail_round(trainer, step, err)
            return
        if keys:
            assert self.cache_dir is not None  # keys exist only with the cache on, and then it has a directory
            for r in fresh:
                ResultCache(self.cache_dir).put(keys[r.dataset], r)  # rank 0 only: `keys` is empty elsewhere
        self.trigger.mark_evaluated(step)
        self._conclude(trainer, fresh, cached, step, epoch, causes, blocked_secs=self._clock() - started)

    def _conclude(
        self,
        trainer: L.Trainer,
        fresh: list[SetResult],
        cached: Mapping[str, SetResult],
        step: int,
        epoch: int,
        causes: Sequence[Cause],
        *,
        blocked_secs: float,
        fields: Mapping[str, Any] | None = None,
    ) -> None:
        """What every reduced round goes through, sync or async, at the step of its weights: the paired
        deltas, the budget (`blocked_secs`: how long the round held training up), the adaptive schedule,
        the best values, the record, the thresholds and the reward watch. Every rank, the same results."""
        for r in fresh:  # every rank, the same sets: one reduction per metric and reference
            r.metrics.update(
                self.pairs.update(r.dataset, r.outcomes, r.outcome_names, r.metrics, trainer.strategy.root_device)
            )
        by_name = {r.dataset: r for r in fresh} | dict(cached)
        results = [by_name[s.name] for s in self.eval_sets]
        self.evaluated_steps.append(step)
        self._rounds_this_fit += 1
        extras: dict[str, float] = {}
        if self.budget is not None:
            self._deferred_since_round = self.budget.add_round(blocked_secs)
            extras["budget_share"] = self.budget.spent_share()
        if self.adaptive is not None:
            change = self.adaptive.observe(
                step,
                {
                    r.dataset: {m: (c.low, c.high) for m, c in self.pairs.last_changes.get(r.dataset, {}).items()}
                    for r in fresh
                },
            )
            extras["adaptive_interval"] = float(self.adaptive.interval)
            if change.old != change.new and trainer.is_global_zero:
                self._record_interval_change(step, change.old, change.new, change.moved)
        self._decide(trainer, results, step)  # issue 16: every rank, before the record
        if trainer.is_global_zero:
            self._record(trainer, results, step, epoch, list(causes), set(cached), extras, fields)
        self._deferred_since_round = 0
        self._check_thresholds(trainer, results, step)
        self._watch_rewards(trainer, results, step)  # issue 16

    # ---- decisions (issue 16): an async round's results must pass here too, at the snapshot's step

    def _decide(self, trainer: L.Trainer, results: list[SetResult], step: int) -> None:
        """Best values join the round's metrics (so history and loggers get them), then every metric
        goes to ``trainer.callback_metrics`` for ModelCheckpoint and EarlyStopping."""
        for r in results:  # reduced metrics: the same on every rank, and so the best values
            r.metrics.update(self.best.update(r.dataset, r.metrics, step))
        publish_round(trainer, results, step)
        check_after_round(trainer, trainer.lightning_module, self._adopted)

    def _watch_rewards(self, trainer: L.Trainer, results: list[SetResult], step: int) -> None:
        if self.reward_watch is not None:
            watch_round(trainer, self.reward_watch, results, step, self._history, self.run_id)

    def _submit(self, trainer: L.Trainer, pl_module: L.LightningModule, causes: list[Cause]) -> None:
        assert self._async is not None
        step = trainer.global_step
        running = self._async.in_flight
        if running is not None and self.on_busy is OnBusy.SKIP:
            # Whether a round is in flight is the same on every rank (rounds start and finish at
            # agreed steps), so every rank skips alike.
            self.trigger.mark_evaluated(step)
            self._skipped_step = step
            if trainer.is_global_zero:
                message = (
                    f"evaluation of step {step} skipped: the round of step {running.step} is still running "
                    "(on_busy='skip')"
                )
                log.warning(message)
                if self._history is not None:
                    trigger = [str(c) for c in causes]
                    self._history.append(
                        event_record("skipped", step, message=message, trigger=trigger, running_step=running.step)
                    )
            return
        if running is not None:
            self._finish_async(trainer, pl_module, wait=True)
        copy_started = self._clock()
        snapshot = self._async.submit(pl_module, step, trainer.current_epoch, causes)
        self._blocked_secs += self._clock() - copy_started
        self.trigger.mark_evaluated(step)  # training time counts from the snapshot: training goes on
        log.info(
            "async evaluation of step %d started: %.2f MiB snapshot copied in %.4f s",
            step,
            snapshot.mb,
            snapshot.copy_secs,
        )

    def _finish_async(self, trainer: L.Trainer, pl_module: L.LightningModule, wait: bool) -> None:
        if self._async is None or self._async.in_flight is None:
            return
        if not wait:
            # Each rank's worker finishes on its own clock, and the reduction is collective: a
            # rank that merged alone would wait for the others. Merge when every rank is ready.
            ready = trainer.strategy.reduce_boolean_decision(self._async.ready(), all=True)
            if not ready:
                return
        started = self._clock()
        snapshot, local = self._async.collect(self.eval_sets)
        self._merge(trainer, pl_module, snapshot, local, started)

    def _merge(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        snapshot: Snapshot,
        local: list[LocalSetResult],
        started: float,
    ) -> None:
        """Reduces an async round on every rank and concludes it at its snapshot's step; the budget is
        charged what held training up: the snapshot's copy, the wait for the worker, the reduction."""
        blocked, self._blocked_secs = self._blocked_secs, 0.0
        try:
            results = [reduce_set(r, s, device=pl_module.device) for r, s in zip(local, self.eval_sets, strict=True)]
        except EvalRoundError as err:
            self._fail_round(trainer, snapshot.step, err)
            return
        fields = {
            "lag_steps": trainer.global_step - snapshot.step,
            "snapshot_mb": snapshot.mb,
            "snapshot_secs": snapshot.copy_secs,
        }
        causes = [Cause(c) for c in snapshot.causes]
        blocked += self._clock() - started
        self._conclude(trainer, results, {}, snapshot.step, snapshot.epoch, causes, blocked_secs=blocked, fields=fields)

    def _record_interval_change(self, step: int, old: int, new: int, moved: bool) -> None:
        assert self.adaptive is not None
        how = "moved beyond" if moved else "stayed within"
        message = (
            f"{self.adaptive.metric} {how} its paired 95% interval: the next adaptive round comes "
            f"{new} steps after step {step} (was {old})"
        )
        log.info("adaptive evaluation: %s", message)
        if self._history is None:
            return
        self._history.append(
            event_record(
                "adaptive",
                step,
                message=message,
                metric=self.adaptive.metric,
                old_interval=old,
                new_interval=new,
                moved=moved,
            )
        )

    def _record(
        self,
        trainer: L.Trainer,
        results: list[SetResult],
        step: int,
        epoch: int,
        causes: list[Cause],
        cached: set[str] | None = None,
        extras: Mapping[str, float] | None = None,
        fields: Mapping[str, Any] | None = None,
    ) -> None:
        cached, extras = cached or set(), extras or {}
        records = []
        for r in results:
            record = eval_record(
                step,
                epoch,
                r.dataset,
                r.metrics,
                trigger=causes,
                num_samples=r.num_samples,
                num_prompts=r.num_prompts,
                eval_secs=r.eval_secs,
                mode=self.mode.value,
                world_size=trainer.world_size,
                sampling=r.sampling,
                run_id=self.run_id,
            )
            record.update(fields or {})  # async: lag_steps, snapshot_mb, snapshot_secs
            if r.dataset in cached:
                record["cached"] = True
            if self.budget is not None:
                record["budget_share"] = extras["budget_share"]
                record["deferred"] = self._deferred_since_round
            records.append(record)
        if self._history is not None:
            self._history.append_many(records)
        log_eval_results(trainer.loggers, results, step)
        if extras:
            # Run-level numbers of the round, e.g. eval/budget_share, on the same eval x axis.
            for logger in trainer.loggers:
                logger.log_metrics({**{f"eval/{k}": v for k, v in extras.items()}, "eval/step": step}, step=step)
        summary = ", ".join(
            f"{r.dataset}: "
            + " ".join(f"{k}={v:.3f}" for k, v in r.metrics.items() if k in ("accuracy", "reward/mean"))
            for r in results
        )
        log.info("evaluation at step %d (%s): %s", step, "+".join(causes), summary)

    def _fail_round(self, trainer: L.Trainer, step: int, err: EvalRoundError) -> None:
        """Records a failed round; raises (every rank alike) for the sanity round or ``on_error='raise'``.

        The first round of a fit is a sanity round, as Lightning's sanity check is for validation:
        its failure is most likely a bug in `evaluate_fn`, which would fail every later round too.
        """
        sanity = self._rounds_this_fit == 0
        if trainer.is_global_zero:
            if sanity:
                log.error("evaluation at step %d failed; training stops %s:\n%s", step, SANITY_NOTE, err)
            elif self.on_error is ErrorPolicy.RAISE:
                log.error("evaluation at step %d failed; training stops:\n%s", step, err)
            else:
                log.error("evaluation at step %d failed; training goes on (on_error='log'):\n%s", step, err)
            if self._history is not None:
                self._history.append(event_record("error", step, message=str(err), run_id=self.run_id))
        if sanity:
            raise EvalRoundError(f"{err}\n{SANITY_NOTE}") from err
        if self.on_error is ErrorPolicy.RAISE:
            raise err

    def _check_thresholds(self, trainer: L.Trainer, results: list[SetResult], step: int) -> None:
        if not self.thresholds.thresholds:
            return
        if not self.thresholds.resolved:
            self.thresholds.resolve({name for r in results for name in r.metrics})
        alerts: list[Alert] = [a for r in results for a in self.thresholds.check(r.dataset, r.metrics, step)]
        for alert in alerts:
            report_alert(
                trainer,
                self._history,
                step,
                dataset=alert.dataset,
                message=alert.message,
                title=f"areal-lightning: {alert.dataset}/{alert.metric} below threshold",
                run_id=self.run_id,
                source="threshold alert",
                metric=alert.metric,
                value=alert.value,
                threshold=alert.threshold,
            )
        if self.threshold_action is ThresholdAction.STOP:
            # Reduced metrics are identical on every rank, but a stop decided alone would leave
            # the other ranks in the next step's collectives: agree explicitly.
            stop = trainer.strategy.reduce_boolean_decision(bool(alerts), all=False)
            if stop:
                trainer.should_stop = True
