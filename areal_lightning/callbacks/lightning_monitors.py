"""Eval metrics as Lightning's own decision inputs: ``trainer.callback_metrics``.

A round's metrics are written there under their logged names (``eval/<set>/<metric>``), on every
rank, as float tensors, as ``self.log`` would leave them, so that `ModelCheckpoint(monitor=...)` and
`EarlyStopping(monitor=...)` read them. An `EarlyStopping` on an ``eval/`` metric checks right after
each round (patience counts rounds); a `ModelCheckpoint` keeps its own schedule and scores a save
before the first round as the worst (NaN). docs/decisions.md says what the user sees.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint

from areal_lightning.eval_round import SetResult
from areal_lightning.tracking.loggers import EVAL_PREFIX, eval_metric_dict

log = logging.getLogger(__name__)

EVAL_STEP_KEY = f"{EVAL_PREFIX}/step"
"""``eval/step``: the global step whose weights the latest round evaluated (earlier than the
current step when results arrive late)."""


def round_callback_metrics(results: Sequence[SetResult], step: int) -> dict[str, torch.Tensor]:
    """A round's metrics as ``trainer.callback_metrics`` entries: float32 CPU scalars.

    Example:
        >>> r = SetResult("easy", {"accuracy": 0.75}, num_samples=4, num_prompts=4, eval_secs=0.5, table_rows=[])
        >>> {k: float(v) for k, v in round_callback_metrics([r], step=20).items()}
        {'eval/easy/accuracy': 0.75, 'eval/easy/eval_secs': 0.5, 'eval/step': 20.0}
    """
    values: Mapping[str, float] = {**eval_metric_dict(results), EVAL_STEP_KEY: float(step)}
    return {key: torch.tensor(value, dtype=torch.float32) for key, value in values.items()}


def publish_round(trainer: L.Trainer, results: Sequence[SetResult], step: int) -> None:
    """Puts a round's metrics into ``trainer.callback_metrics``; call it on every rank.

    They stay there until the next round replaces them (a metric the module logs under the same
    name would overwrite them: eval names start with ``eval/``, which modules do not use).
    """
    trainer.callback_metrics.update(round_callback_metrics(results, step))


def _checked_after_rounds(*args: Any, **kwargs: Any) -> None:
    """Stands in for an adopted `EarlyStopping`'s epoch-end and validation-end hooks."""


def adopt_eval_monitors(trainer: L.Trainer) -> list[EarlyStopping]:
    """The `EarlyStopping` callbacks that monitor an ``eval/`` metric; their checks run after each
    round (`check_after_round`) and their own epoch-end and validation-end hooks do nothing. Call it
    from `setup`.

    Why the two hooks are shadowed on the instance: Lightning's `EarlyStopping`
    (``lightning/pytorch/callbacks/early_stopping.py``) runs `_run_early_stopping_check` only from
    `on_train_epoch_end` or `on_validation_end`, chosen by ``check_on_train_epoch_end``, and has no
    entry point for another event. Left to run, those hooks would count patience in epochs or
    validations instead of rounds, re-read a stale round, and before the first round meet a missing
    monitor (``strict=True`` raises) or a NaN placeholder (``check_finite`` stops training). A
    subclass would leave the user's own ``EarlyStopping(monitor="eval/...")`` unadopted.

    Example:
        >>> es = EarlyStopping(monitor="eval/easy/accuracy", mode="max")
        >>> [cb is es for cb in adopt_eval_monitors(L.Trainer(callbacks=[es], logger=False))]
        [True]
    """
    adopted = []
    for callback in trainer.callbacks:  # type: ignore[attr-defined]
        if isinstance(callback, EarlyStopping) and _monitors_eval(callback):
            # Instance attributes shadow the class's hooks: Lightning calls them by name.
            callback.on_train_epoch_end = _checked_after_rounds  # type: ignore[method-assign]
            callback.on_validation_end = _checked_after_rounds  # type: ignore[method-assign]
            adopted.append(callback)
    return adopted


def hold_monitor_places(trainer: L.Trainer) -> None:
    """NaN under each eval metric a `ModelCheckpoint` monitors, until a round gives it a value: a
    save before the first round is then scored worst instead of failing. Call it on every rank."""
    for callback in trainer.checkpoint_callbacks:
        if isinstance(callback, ModelCheckpoint) and callback.monitor is not None and _monitors_eval(callback):
            trainer.callback_metrics.setdefault(callback.monitor, torch.tensor(math.nan))


def check_after_round(trainer: L.Trainer, pl_module: L.LightningModule, adopted: Sequence[EarlyStopping]) -> None:
    """Runs each adopted `EarlyStopping`'s check as its own class would after a validation (or an
    epoch end, as it was configured); every rank, right after a round's metrics are published."""
    for es in adopted:
        if es.monitor not in trainer.callback_metrics:
            continue  # a name the sanity pass accepted that later rounds log (a paired change from round 2)
        # Exactly one of the two runs the check, depending on `check_on_train_epoch_end`.
        type(es).on_train_epoch_end(es, trainer, pl_module)
        type(es).on_validation_end(es, trainer, pl_module)


def _monitors_eval(callback: EarlyStopping | ModelCheckpoint) -> bool:
    return isinstance(callback.monitor, str) and callback.monitor.startswith(f"{EVAL_PREFIX}/")


def read_train_metric(trainer: L.Trainer, name: str) -> float | None:
    """Rank 0's value of a training metric in ``trainer.callback_metrics`` (None when not logged),
    the same on every rank.

    A metric logged without ``sync_dist=True`` holds each rank's own value; the watch's state must
    not depend on the rank, so rank 0's value is broadcast (one small collective per round).
    """
    value = trainer.callback_metrics.get(name)
    number = float(value) if value is not None and torch.as_tensor(value).numel() == 1 else math.nan
    number = trainer.strategy.broadcast(number, src=0)
    return None if math.isnan(number) else number
