"""Weights & Biases through Lightning's `WandbLogger`: built from the config, never fatal.

`SafeWandbLogger` is a `WandbLogger` whose
every call into wandb goes through `call_wandb`: the first exception (no network, a bad key, an
unusable ``save_dir``, a full disk) is reported once with ``logging.warning`` and W&B is left alone
for the rest of the run, so training and the eval history file go on untouched.

wandb quirks this module works around (wandb 0.31, Lightning 2.6):

* ``wandb.init(dir=...)`` with a directory it cannot create silently writes to the system temp
  dir instead; we create and check ``save_dir`` ourselves so that becomes a reported failure.
* Lightning sets ``os.environ["WANDB_MODE"] = "dryrun"`` for an offline logger and never undoes
  it (child processes inherit it); we restore the variable. wandb itself reads its environment
  once per process (the ``wandb.setup`` singleton), so we also pass ``mode="offline"`` to init.
* Lightning always passes ``anonymous=None``, which wandb 0.31 answers with a deprecation
  warning on every run; we drop the key when it is unset.
* Lightning's logger never calls ``run.finish()`` (the run lives on across ``fit`` and ``test``);
  `SafeWandbLogger.finish` does it, guarded, for whoever ends the run.
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Optional, TypeVar

from lightning.fabric.loggers.logger import _DummyExperiment, rank_zero_experiment
from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.utilities import rank_zero_only

from areal_lightning.tracking.history import HISTORY_FILENAME

log = logging.getLogger(__name__)

T = TypeVar("T")

TABLE_COLUMNS = ("index", "prompt", "completion", "answer", "reward", "correct")
"""Columns of the per-eval-set sample table; `SetResult.table_rows` are dicts with these keys."""

_TEXT_COLUMNS = frozenset({"prompt", "completion", "answer"})

# The first failure of each logger, kept outside the logger so a plain `WandbLogger` that a user
# put in `trainer.loggers` is guarded by the eval fan-out too. Weak keys: no logger is kept alive.
_failures: "weakref.WeakKeyDictionary[WandbLogger, str]" = weakref.WeakKeyDictionary()
_failures_lock = threading.Lock()


def wandb_failure(logger: WandbLogger) -> str | None:
    """Why W&B was turned off for `logger` (the first exception, as text), or None while it works."""
    return _failures.get(logger)


def _report_failure(logger: WandbLogger, action: str, err: BaseException) -> None:
    with _failures_lock:
        if logger in _failures:
            return
        _failures[logger] = f"{type(err).__name__}: {err}"
    history = getattr(logger, "history_file", None)
    where = str(history) if history else f"the eval history ({HISTORY_FILENAME})"
    log.warning(
        "W&B failed while %s (%s: %s). W&B logging is off for the rest of this run; training goes on "
        "and %s remains complete.", action, type(err).__name__, err, where,
    )


def call_wandb(logger: WandbLogger, action: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T | None:
    """``fn(*args, **kwargs)`` unless W&B already failed for `logger`; an exception turns W&B off.

    Args:
        logger: the W&B logger the call belongs to; its failure state is what is checked and set.
        action: what the call does, for the one warning, e.g. ``"logging eval metrics"``.
        fn: the call into wandb.

    Returns:
        What `fn` returned, or None when it raised or W&B was already off.

    Example:
        >>> lg = SafeWandbLogger(offline=True)
        >>> call_wandb(lg, "adding", lambda a, b: a + b, 1, 2)
        3
    """
    if logger in _failures:
        return None
    try:
        return fn(*args, **kwargs)
    except Exception as err:  # noqa: BLE001 - W&B must never stop training; reported once, below
        _report_failure(logger, action, err)
        return None


def _prepare_save_dir(save_dir: str | None) -> None:
    """Create `save_dir` or raise: wandb would silently fall back to the system temp dir."""
    if save_dir is None:
        return
    path = Path(save_dir)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise OSError(f"W&B save_dir {save_dir!r} cannot be created ({err.strerror or err})") from err
    if not os.access(path, os.W_OK | os.X_OK):
        raise PermissionError(f"W&B save_dir {save_dir!r} is not writable")


class SafeWandbLogger(WandbLogger):
    """Lightning's `WandbLogger`, except that no W&B failure ever reaches the training loop.

    Arguments are those of `WandbLogger`, plus:

    Args:
        history_file: the eval history file the failure warning points users to.

    Example:
        >>> lg = SafeWandbLogger(project="demo", offline=True, save_dir="runs/demo")
        >>> lg.name, wandb_failure(lg) is None
        ('demo', True)
    """

    def __init__(self, *args: Any, history_file: str | Path | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.history_file = history_file
        if self._wandb_init.get("anonymous") is None:
            self._wandb_init.pop("anonymous", None)

    @property
    def failure(self) -> str | None:
        """Why W&B was turned off for this logger, or None while it works."""
        return wandb_failure(self)

    def _start_run(self) -> Any:
        _prepare_save_dir(self._save_dir)
        saved_mode = os.environ.get("WANDB_MODE")
        try:
            return WandbLogger.experiment.fget(self)  # type: ignore[attr-defined]
        finally:
            # Lightning sets WANDB_MODE=dryrun for an offline logger and leaves it set.
            if saved_mode is None:
                os.environ.pop("WANDB_MODE", None)
            else:
                os.environ["WANDB_MODE"] = saved_mode

    @property
    @rank_zero_experiment
    def experiment(self) -> Any:
        """The wandb run; a no-op stand-in once W&B failed (also on ranks other than 0)."""
        if self._experiment is None and self.failure is None:
            call_wandb(self, "starting the run (wandb.init)", self._start_run)
        if self.failure is not None or self._experiment is None:
            return _DummyExperiment()
        return self._experiment

    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, float], step: Optional[int] = None) -> None:
        call_wandb(self, "logging metrics", super().log_metrics, metrics, step)

    @rank_zero_only
    def log_hyperparams(self, params: Any) -> None:
        call_wandb(self, "logging hyperparameters", super().log_hyperparams, params)

    @rank_zero_only
    def log_table(self, key: str, columns: Optional[list[str]] = None, data: Optional[list[list[Any]]] = None,
                  dataframe: Any = None, step: Optional[int] = None) -> None:
        call_wandb(self, f"logging the table {key!r}", super().log_table, key, columns, data, dataframe, step)

    @rank_zero_only
    def log_image(self, key: str, images: list[Any], step: Optional[int] = None, **kwargs: Any) -> None:
        call_wandb(self, f"logging images {key!r}", super().log_image, key, images, step, **kwargs)

    @rank_zero_only
    def log_audio(self, key: str, audios: list[Any], step: Optional[int] = None, **kwargs: Any) -> None:
        call_wandb(self, f"logging audio {key!r}", super().log_audio, key, audios, step, **kwargs)

    @rank_zero_only
    def log_video(self, key: str, videos: list[Any], step: Optional[int] = None, **kwargs: Any) -> None:
        call_wandb(self, f"logging videos {key!r}", super().log_video, key, videos, step, **kwargs)

    def watch(self, model: Any, log: Optional[str] = "gradients", log_freq: int = 100, log_graph: bool = True) -> None:
        call_wandb(self, "watching the model", super().watch, model, log, log_freq, log_graph)

    def after_save_checkpoint(self, checkpoint_callback: Any) -> None:
        call_wandb(self, "logging a checkpoint", super().after_save_checkpoint, checkpoint_callback)

    @rank_zero_only
    def finalize(self, status: str) -> None:
        call_wandb(self, "finalizing the run", super().finalize, status)

    @rank_zero_only
    def finish(self, exit_code: int = 0) -> None:
        """Ends the wandb run (flushes it to disk or the server); a no-op without a live run.

        Lightning leaves runs open so that ``fit`` and ``test`` share one; call this when done.
        """
        if self._experiment is not None and self.failure is None:
            call_wandb(self, "finishing the run", self._experiment.finish, exit_code=exit_code)


def _cell(column: str, value: Any) -> Any:
    if value is None:
        return None
    if column in _TEXT_COLUMNS:
        return str(value)
    # Tensors and numpy scalars become plain Python numbers.
    return value.item() if hasattr(value, "item") else value


def samples_table(rows: Sequence[Mapping[str, Any]]) -> Any:
    """A ``wandb.Table`` with `TABLE_COLUMNS` of `rows` (a missing key is an empty cell).

    Example:
        >>> table = samples_table([{"index": 0, "prompt": "1+2=", "completion": "03", "answer": "03",
        ...                         "reward": 1.0, "correct": True}])
        >>> table.columns, table.data
        (['index', 'prompt', 'completion', 'answer', 'reward', 'correct'], [[0, '1+2=', '03', '03', 1.0, True]])
    """
    import wandb

    data = [[_cell(c, row.get(c)) for c in TABLE_COLUMNS] for row in rows]
    # A reward that is an int in one row and a float in the next is not worth losing W&B over.
    return wandb.Table(columns=list(TABLE_COLUMNS), data=data, allow_mixed_types=True)


__all__ = [
    "TABLE_COLUMNS",
    "SafeWandbLogger",
    "call_wandb",
    "samples_table",
    "wandb_failure",
]
