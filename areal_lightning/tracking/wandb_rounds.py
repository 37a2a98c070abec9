"""A round's metrics and sample table on W&B's ``eval/step`` axis, and alerts to W&B; the logger
itself (`SafeWandbLogger`, failures that never stop training) is in `wandb_logger`."""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.utilities import rank_zero_only

from areal_lightning.eval_round import SetResult
from areal_lightning.tracking.wandb_logger import (
    EVAL_GLOB,
    EVAL_STEP_KEY,
    SAMPLES_KEY,
    TRAINER_STEP_KEY,
    call_wandb,
    wandb_failure,
)

if TYPE_CHECKING:
    from wandb.sdk.wandb_alerts import AlertLevel

# The same logger name as `wandb_logger`'s: every W&B message of the package is filtered by one name.
log = logging.getLogger("areal_lightning.tracking.wandb_logger")

# Eval keys already given their x axis, per wandb run (weak keys: a finished run may go away).
_defined_keys: weakref.WeakKeyDictionary[Any, set[str]] = weakref.WeakKeyDictionary()
_defined_lock = threading.Lock()


# ---- eval rounds -------------------------------------------------------------------------------


def _cell(value: Any) -> Any:
    # Tensors and numpy scalars become plain Python numbers; everything else goes as it is.
    return value.item() if hasattr(value, "item") and callable(value.item) else value


def samples_table(rows: Sequence[Mapping[str, Any]]) -> Any:
    """A ``wandb.Table`` of `rows`: a column per key of any row, in first-seen order; a key a row
    lacks is an empty cell.

    Example:
        >>> table = samples_table([{"prompt": "1+2=", "completion": "03"}, {"prompt": "2+2=", "reward": 1.0}])
        >>> table.columns, table.data
        (['prompt', 'completion', 'reward'], [['1+2=', '03', None], ['2+2=', None, 1.0]])
    """
    import wandb

    columns = list(dict.fromkeys(key for row in rows for key in row))
    data = [[_cell(row.get(c)) for c in columns] for row in rows]
    # A reward that is an int in one row and a float in the next is not worth losing W&B over.
    # (wandb annotates `columns` as list[str | int]; a list[str] is not one, lists being invariant.)
    return wandb.Table(columns=[*columns], data=data, allow_mixed_types=True)


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


def _log_round(logger: WandbLogger, metrics: Mapping[str, float], results: Sequence[SetResult], step: int) -> None:
    run = logger.experiment
    if wandb_failure(logger) is not None:
        return
    # Read once the run has started: a refused rewind sets it then.
    already = getattr(logger, "logged_eval_through", None)
    if already is not None and step <= already:
        log.info(
            "eval round of step %d not logged to W&B: the run's earlier session logged steps up to %d", step, already
        )
        return
    _define_eval_axis(run, list(metrics))
    row: dict[str, Any] = {**metrics, EVAL_STEP_KEY: step, TRAINER_STEP_KEY: step}
    for result in results:
        if result.table_rows:
            row[f"eval/{result.dataset}/{SAMPLES_KEY}"] = samples_table(result.table_rows)
    run.log(row)


@rank_zero_only
def log_eval_round(logger: WandbLogger, metrics: Mapping[str, float], results: Sequence[SetResult], step: int) -> None:
    """One eval round as one row of `logger`'s run, on the ``eval/step`` axis; never raises.

    Args:
        logger: a `WandbLogger` (a `SafeWandbLogger` skips steps up to its `logged_eval_through`).
        metrics: the round flattened to ``eval/<set>/<metric>`` (`loggers.eval_metric_dict`).
        results: the round's `SetResult`s; those with `table_rows` get a sample table.
        step: the global step whose weights were evaluated.
    """
    call_wandb(logger, "logging eval metrics", _log_round, logger, metrics, results, step)


# ---- alerts and the end of a run ---------------------------------------------------------------


def alert_level(level: str | AlertLevel) -> AlertLevel:
    """`level` as a ``wandb.AlertLevel`` (names in any case).

    Raises:
        ValueError: `level` is not INFO, WARN or ERROR.

    Example:
        >>> alert_level("warn")
        <AlertLevel.WARN: 'WARN'>
    """
    from wandb.sdk.wandb_alerts import AlertLevel

    try:
        return AlertLevel(str(getattr(level, "value", level)).upper())
    except ValueError:
        accepted = ", ".join(m.value for m in AlertLevel)
        raise ValueError(f"send_alert(level=...) must be one of {accepted}, got {level!r}") from None


def _alert_run(logger: WandbLogger, title: str, text: str, level: AlertLevel) -> None:
    import wandb

    run = logger.experiment
    if wandb_failure(logger) is not None or not isinstance(run, wandb.Run):
        return
    # `_is_finished`: wandb has no public "finished" flag, and alerting a finished run raises.
    if run.offline or run.disabled or getattr(run, "_is_finished", False):
        log.debug(
            "W&B alert %r not sent: the run is offline, disabled or finished (only a live online run "
            "can alert); it stays in the log and the eval history",
            title,
        )
        return
    run.alert(title=title, text=text, level=level)


@rank_zero_only
def send_wandb_alert(logger: WandbLogger, title: str, text: str, level: AlertLevel) -> None:
    """``run.alert(...)`` if `logger`'s run is live and online; W&B failures never raise."""
    call_wandb(logger, f"sending the alert {title!r}", _alert_run, logger, title, text, level)


__all__ = ["alert_level", "log_eval_round", "samples_table", "send_wandb_alert"]
