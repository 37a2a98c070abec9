"""The logger fan-out: every Trainer logger receives the same eval metrics and alerts.

Eval metrics are flattened to ``eval/<dataset>/<metric>`` (``eval/easy/accuracy``,
``eval/easy/pass@4``, ``eval/easy/eval_secs``). Loggers that take a step (CSV, TensorBoard) get
them at the evaluated global step; W&B loggers get them through `tracking.wandb_logger`, on their
own ``eval/step`` axis with sample tables. Alerts go to W&B loggers only (the others have none).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from lightning.pytorch.loggers import Logger, WandbLogger
from lightning.pytorch.utilities import rank_zero_only

from areal_lightning.eval_round import SetResult
from areal_lightning.tracking.wandb_rounds import alert_level, log_eval_round, send_wandb_alert

if TYPE_CHECKING:
    from wandb.sdk.wandb_alerts import AlertLevel

EVAL_PREFIX = "eval"
EVAL_SECS_KEY = "eval_secs"


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


@rank_zero_only
def log_eval_results(loggers: Sequence[Logger], results: Sequence[SetResult], step: int) -> None:
    """Sends one round's results to every logger; call it on rank 0 with ``trainer.loggers``.

    A W&B failure is reported once and never raised (see `SafeWandbLogger`); the other loggers
    still get the metrics.

    Args:
        loggers: the Trainer's loggers.
        results: one `SetResult` per eval set.
        step: the global step whose weights were evaluated (earlier than the current one in
            async mode).

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
            log_eval_round(logger, metrics, results, step)
        else:
            logger.log_metrics(metrics, step=step)


@rank_zero_only
def send_alert(loggers: Sequence[Logger], title: str, text: str, level: str | AlertLevel = "WARN") -> None:
    """An alert on every live online W&B run among `loggers`; W&B failures never raise.

    Args:
        loggers: the Trainer's loggers; those that are not W&B loggers are skipped.
        title: the alert's title.
        text: the alert's body.
        level: a ``wandb.AlertLevel`` or its name, INFO, WARN or ERROR (any case).

    Raises:
        ValueError: `level` is not INFO, WARN or ERROR.

    Example:
        >>> send_alert([], "accuracy fell", "eval/easy/accuracy 0.6 < 0.7")
    """
    checked = alert_level(level)
    for logger in loggers:
        if isinstance(logger, WandbLogger):
            send_wandb_alert(logger, title, text, checked)


__all__ = [
    "eval_metric_dict",
    "eval_metric_key",
    "log_eval_results",
    "send_alert",
]
