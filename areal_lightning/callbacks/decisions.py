"""Eval metrics as Lightning's own decision inputs: ``trainer.callback_metrics``.

`ModelCheckpoint(monitor=...)` and `EarlyStopping(monitor=...)` read ``trainer.callback_metrics``.
A round's metrics are written there under their logged names (``eval/<set>/<metric>``), on every
rank (the reduced values are the same everywhere, so every rank's `EarlyStopping` sees the same
number and none finds its monitor missing), as float tensors, as ``self.log`` would leave them.

Order matters: Lightning runs `ModelCheckpoint` after every other callback, so a checkpoint saved
at the step of a round sees that round. `EarlyStopping` runs in list order: it must come after
`EvaluationCallback` in ``callbacks=[...]`` (`early_stopping_before` finds the ones that do not).
"""

from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Mapping, Sequence

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, EarlyStopping

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


def early_stopping_before(callbacks: Sequence[Callback], evaluation: Callback) -> list[EarlyStopping]:
    """The `EarlyStopping` callbacks on an ``eval/`` metric that run before `evaluation`: at an
    epoch end they would decide on the previous round's value.

    Example:
        >>> es = EarlyStopping(monitor="eval/easy/accuracy", mode="max")
        >>> cb = Callback()
        >>> early_stopping_before([es, cb], cb) == [es], early_stopping_before([cb, es], cb)
        (True, [])
    """
    found = []
    for callback in callbacks:
        if callback is evaluation:
            break
        if isinstance(callback, EarlyStopping) and callback.monitor.startswith(f"{EVAL_PREFIX}/"):
            found.append(callback)
    return found


def warn_early_stopping_order(callbacks: Sequence[Callback], evaluation: Callback) -> None:
    """A warning per `early_stopping_before`; call it from `setup`."""
    for es in early_stopping_before(callbacks, evaluation):
        warnings.warn(
            f"EarlyStopping(monitor={es.monitor!r}) comes before EvaluationCallback in the Trainer's "
            "callbacks, so at an epoch end it decides on the previous round; list it after",
            stacklevel=3,
        )


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
