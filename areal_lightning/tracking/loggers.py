"""The logger fan-out: every Trainer logger receives the same eval metrics, W&B on its own x axis.

Eval metrics are flattened to ``eval/<dataset>/<metric>`` (``eval/easy/accuracy``,
``eval/easy/pass@4``, ``eval/easy/eval_secs``). Loggers that take a step (CSV, TensorBoard) get
them at the evaluated global step. A W&B run gets them in one ``run.log`` row together with
``eval/step`` (the evaluated global step; eval charts use it as their x axis), the same value as
``trainer/global_step`` and one ``wandb.Table`` of sample generations per eval set.

Why not ``run.log(..., step=...)``: W&B drops a row whose ``step`` is below the run's current
``_step``, which is exactly what an asynchronous round for an earlier step is. Rows logged
without ``step`` are never dropped; their x value lives in ``eval/step`` instead.

Why a ``define_metric`` per eval key and not only the ``eval/*`` glob: Lightning's logger defines
the glob ``*`` (x axis ``trainer/global_step``), wandb-core keeps globs in a Go map and assigns a
new key to whichever matching glob the map yields first, i.e. at random. An exact definition wins
over every glob, so each eval key is defined before it is first logged.

Why ``trainer/global_step`` in the eval row: both globs carry ``step_sync``, so a key that falls
to ``*`` (a table's sub-keys) would make wandb-core insert the *latest* training step into the
row. Setting it to the evaluated step keeps rows deterministic and puts eval points at the right
place in charts whose x axis is ``trainer/global_step``.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

from lightning.pytorch.loggers import Logger, WandbLogger
from lightning.pytorch.utilities import rank_zero_only

from areal_lightning.eval_round import SetResult
from areal_lightning.tracking.wandb import call_wandb, samples_table, wandb_failure

log = logging.getLogger(__name__)

EVAL_STEP_KEY = "eval/step"
"""The W&B x axis of every eval metric: the global step whose weights were evaluated."""

EVAL_PREFIX = "eval"
EVAL_GLOB = f"{EVAL_PREFIX}/*"
TRAINER_STEP_KEY = "trainer/global_step"
"""Lightning's `WandbLogger` x axis of everything it logs."""
EVAL_SECS_KEY = "eval_secs"
SAMPLES_KEY = "samples"
ALERT_LEVELS = ("INFO", "WARN", "ERROR")

# Eval keys already given their x axis, per wandb run (weak keys: a finished run may go away).
_defined_keys: "weakref.WeakKeyDictionary[Any, set[str]]" = weakref.WeakKeyDictionary()
_defined_lock = threading.Lock()


def eval_metric_key(dataset: str, metric: str) -> str:
    """``eval/<dataset>/<metric>``, the name of an eval metric in every logger."""
    return f"{EVAL_PREFIX}/{dataset}/{metric}"


def eval_metric_dict(results: Sequence[SetResult]) -> dict[str, float]:
    """A round's results flattened to ``eval/<dataset>/<metric>``, plus ``eval/<dataset>/eval_secs``.

    Args:
        results: one `SetResult` per eval set of the round.

    Raises:
        ValueError: two results are for the same eval set (one would overwrite the other).

    Example:
        >>> r = SetResult("easy", {"accuracy": 0.5, "pass@4": 0.75}, num_samples=16, num_prompts=4,
        ...               eval_secs=1.5, table_rows=[])
        >>> eval_metric_dict([r])
        {'eval/easy/accuracy': 0.5, 'eval/easy/pass@4': 0.75, 'eval/easy/eval_secs': 1.5}
    """
    out: dict[str, float] = {}
    seen: set[str] = set()
    for result in results:
        if result.dataset in seen:
            raise ValueError(
                f"eval_metric_dict(results=...) holds two results for eval set {result.dataset!r}; "
                "each eval set must appear once per round"
            )
        seen.add(result.dataset)
        for name, value in result.metrics.items():
            out[eval_metric_key(result.dataset, name)] = float(value)
        out[eval_metric_key(result.dataset, EVAL_SECS_KEY)] = float(result.eval_secs)
    return out


def _define_eval_axis(run: Any, keys: Sequence[str]) -> None:
    """Give `keys` the x axis ``eval/step``, each key once per run, before its first log."""
    with _defined_lock:
        defined = _defined_keys.setdefault(run, set())
        if EVAL_STEP_KEY not in defined:
            # The axis itself first, exactly, so that no glob claims it.
            run.define_metric(EVAL_STEP_KEY)
            run.define_metric(EVAL_GLOB, step_metric=EVAL_STEP_KEY)
            defined.add(EVAL_STEP_KEY)
        for key in keys:
            if key not in defined:
                run.define_metric(key, step_metric=EVAL_STEP_KEY)
                defined.add(key)


def _log_eval_to_wandb(logger: WandbLogger, metrics: Mapping[str, float], results: Sequence[SetResult],
                       step: int) -> None:
    run = logger.experiment
    if wandb_failure(logger) is not None:
        return
    _define_eval_axis(run, list(metrics))
    row: dict[str, Any] = {**metrics, EVAL_STEP_KEY: step, TRAINER_STEP_KEY: step}
    for result in results:
        if result.table_rows:
            row[eval_metric_key(result.dataset, SAMPLES_KEY)] = samples_table(result.table_rows)
    run.log(row)


@rank_zero_only
def log_eval_results(loggers: Sequence[Logger], results: Sequence[SetResult], step: int) -> None:
    """Sends one round's results to every logger; call it on rank 0 with ``trainer.loggers``.

    A W&B failure is reported once and never raised (see `SafeWandbLogger`); the other loggers
    still get the metrics.

    Args:
        loggers: the Trainer's loggers.
        results: one `SetResult` per eval set.
        step: the global step whose weights were evaluated (earlier than the current one in
            async mode; W&B keeps it, see the module docstring).

    Raises:
        ValueError: two results are for the same eval set.

    Example:
        >>> from lightning.pytorch.loggers import CSVLogger
        >>> r = SetResult("easy", {"accuracy": 0.5}, 4, 4, 0.1, [])
        >>> log_eval_results([CSVLogger("runs/demo")], [r], step=100)  # doctest: +SKIP
    """
    if not results:
        return
    metrics = eval_metric_dict(results)
    for logger in loggers:
        if isinstance(logger, WandbLogger):
            call_wandb(logger, "logging eval metrics", _log_eval_to_wandb, logger, metrics, results, step)
        else:
            logger.log_metrics(metrics, step=step)


def _alert_run(logger: WandbLogger, title: str, text: str, level: str) -> None:
    import wandb

    run = logger.experiment
    if wandb_failure(logger) is not None or not isinstance(run, wandb.Run):
        return
    if run.offline or run.disabled or getattr(run, "_is_finished", False):
        log.debug("W&B alert %r not sent: the run is offline, disabled or finished (only a live online run "
                  "can alert); it stays in the log and the eval history", title)
        return
    run.alert(title=title, text=text, level=level)


@rank_zero_only
def send_alert(loggers: Sequence[Logger], title: str, text: str, level: str = "WARN") -> None:
    """``run.alert(...)`` on every live online W&B run among `loggers`; W&B failures never raise.

    Args:
        loggers: the Trainer's loggers; those that are not W&B loggers are skipped.
        title: the alert's title.
        text: the alert's body.
        level: INFO, WARN or ERROR (any case).

    Raises:
        ValueError: `level` is not INFO, WARN or ERROR.

    Example:
        >>> send_alert([], "accuracy fell", "eval/easy/accuracy 0.6 < 0.7")
    """
    upper = str(level).upper()
    if upper not in ALERT_LEVELS:
        raise ValueError(f"send_alert(level=...) must be one of {', '.join(ALERT_LEVELS)}, got {level!r}")
    for logger in loggers:
        if isinstance(logger, WandbLogger):
            call_wandb(logger, f"sending the alert {title!r}", _alert_run, logger, title, text, upper)


@rank_zero_only
def finish_wandb(loggers: Sequence[Logger], exit_code: int = 0) -> None:
    """Ends the W&B run of every W&B logger (Lightning never does); W&B failures never raise.

    Example:
        >>> finish_wandb([])
    """
    for logger in loggers:
        if isinstance(logger, WandbLogger) and logger._experiment is not None:
            call_wandb(logger, "finishing the run", logger._experiment.finish, exit_code=exit_code)


__all__ = [
    "ALERT_LEVELS",
    "EVAL_STEP_KEY",
    "eval_metric_dict",
    "eval_metric_key",
    "finish_wandb",
    "log_eval_results",
    "send_alert",
]
