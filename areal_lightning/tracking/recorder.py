"""`EvalRecorder`: where everything an evaluation reports goes, in one place.

Rank 0 alone writes: the round's records to the eval history, its metrics to every Trainer logger,
events (``error``, ``skipped``, ``drift``, ``adaptive``, ``alert``) to the history and the Python
log, alerts to every logger that takes one (W&B). Every rank may call every method; the other
ranks do nothing, so callers need no rank checks.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

import lightning as L

from areal_lightning.errors import ArgumentError
from areal_lightning.eval_round import SetResult
from areal_lightning.tracking.console_log import round_line, terminal_width
from areal_lightning.tracking.history import EvalHistory, new_run_id
from areal_lightning.tracking.loggers import EVAL_PREFIX, log_eval_results, send_alert
from areal_lightning.tracking.records import eval_record, event_record

log = logging.getLogger(__name__)

SUMMARY_METRICS = ("accuracy", "reward/mean", "completion/length/mean", "completion/truncated", "completion/entropy")
"""The metrics of a round's summary line in the log when nobody names them, in this order (those the
round has); a task names its own (``summary_metrics``)."""


class EvalRecorder:
    """Writes one run's eval history and reports to the Trainer's loggers.

    Args:
        run_id: written in round, error and alert records; None: a new id.
        mode: written in every round record (``sync`` or ``async``).
        verbose: each round's summary line at INFO level (else DEBUG).
        summary_metrics: the metrics of that line, in order (``*`` stands for a name part:
            ``pass@*``); None: `SUMMARY_METRICS`.

    Raises:
        ArgumentError: for a run id that is not a non-empty string, summary metrics that are not names.
    """

    def __init__(
        self, run_id: str | None, mode: str, verbose: bool = True, summary_metrics: Sequence[str] | None = None
    ) -> None:
        if run_id is not None and (not isinstance(run_id, str) or not run_id):
            raise ArgumentError("EvaluationCallback", "run_id", run_id, "a non-empty string or None")
        if summary_metrics is not None and (
            isinstance(summary_metrics, str) or not all(isinstance(n, str) and n for n in summary_metrics)
        ):
            raise ArgumentError("EvaluationCallback", "summary_metrics", summary_metrics, "a list of names or None")
        self.summary_metrics = tuple(SUMMARY_METRICS if summary_metrics is None else summary_metrics)
        self.run_id = run_id or new_run_id()
        self.mode = mode
        self.verbose = verbose
        self.history: EvalHistory | None = None

    def open(self, trainer: L.Trainer, output_dir: Path, once_per_step: Collection[str]) -> None:
        """Rank 0 opens ``<output_dir>/eval_history.jsonl`` for appending; until then (or never,
        under ``fast_dev_run``) nothing is written, and the loggers and the log still get everything."""
        if trainer.is_global_zero:
            self.history = EvalHistory.in_run_dir(output_dir, once_per_step=once_per_step)

    def round(
        self,
        trainer: L.Trainer,
        results: Sequence[SetResult],
        step: int,
        epoch: int,
        causes: Sequence[str],
        *,
        cached: Collection[str] = (),
        fields: Mapping[str, Any] | None = None,
        extras: Mapping[str, float] | None = None,
    ) -> None:
        """One record per eval set (plus `fields`, and ``"cached": true`` for the sets in `cached`),
        the metrics to every logger, run-level `extras` as ``eval/<name>``, a summary line in the log."""
        if not trainer.is_global_zero:
            return
        records = []
        for r in results:
            record = eval_record(
                step,
                epoch,
                r.dataset,
                r.metrics,
                trigger=list(causes),
                num_samples=r.num_samples,
                num_prompts=r.num_prompts,
                eval_secs=r.eval_secs,
                mode=self.mode,
                world_size=trainer.world_size,
                sampling=r.sampling,
                notes=r.notes,
                run_id=self.run_id,
            )
            record.update(fields or {})
            if r.dataset in cached:
                record["cached"] = True
            records.append(record)
        if self.history is not None:
            self.history.append_many(records)
        log_eval_results(trainer.loggers, results, step)
        if extras:
            # Run-level numbers of the round, e.g. eval/budget_share, on the same eval x axis.
            for logger in trainer.loggers:
                logger.log_metrics(
                    {**{f"{EVAL_PREFIX}/{k}": v for k, v in extras.items()}, "eval/step": step}, step=step
                )
        head = f"evaluation at step {step} ({'+'.join(causes)}):"
        sets = {r.dataset: r.metrics for r in results}
        level = logging.INFO if self.verbose else logging.DEBUG
        log.log(level, "%s", round_line(head, sets, self.summary_metrics, terminal_width()))

    def event(
        self, trainer: L.Trainer, kind: str, step: int, message: str, *, level: int = logging.WARNING, **fields: Any
    ) -> None:
        """An event record with `fields` (and the run's id), and `message` in the log at `level`."""
        if not trainer.is_global_zero:
            return
        log.log(level, "%s", message)
        self._append(event_record(kind, step, message=message, **{"run_id": self.run_id, **fields}))

    def drift(self, trainer: L.Trainer, step: int, dataset: str, message: str) -> None:
        """An eval set changed during the run: a Python warning (users filter it) and a record."""
        if not trainer.is_global_zero:
            return
        warnings.warn(message, stacklevel=3)
        self._append(event_record("drift", step, dataset=dataset, message=message, run_id=self.run_id))

    def error(
        self,
        trainer: L.Trainer,
        step: int,
        err: Exception | str,
        *,
        dataset: str | None = None,
        stops: bool = False,
        why: str = "",
    ) -> None:
        """A failed round, or one failed eval set of a round (`dataset`); `stops`: training stops
        with it (else it goes on, ``on_error="log"``), `why` says why it stops when that is not ``on_error``."""
        if not trainer.is_global_zero:
            return
        what = f"evaluation of eval set {dataset!r}" if dataset is not None else "evaluation"
        if stops:
            log.error("%s at step %d failed; training stops%s:\n%s", what, step, f" {why}" if why else "", err)
        else:
            log.error("%s at step %d failed; training goes on (on_error='log'):\n%s", what, step, err)
        self._append(event_record("error", step, dataset=dataset, message=str(err), run_id=self.run_id))

    def alert(
        self, trainer: L.Trainer, step: int, *, dataset: str, message: str, title: str, source: str, **fields: Any
    ) -> None:
        """A warning in the log (``source: message``), an ``alert`` record with `fields`, and an
        alert to every logger that takes one (W&B)."""
        if not trainer.is_global_zero:
            return
        log.warning("%s: %s", source, message)
        self._append(event_record("alert", step, dataset=dataset, message=message, run_id=self.run_id, **fields))
        send_alert(trainer.loggers, title=title, text=message)

    def _append(self, record: Mapping[str, Any]) -> None:
        if self.history is not None:
            self.history.append(record)
