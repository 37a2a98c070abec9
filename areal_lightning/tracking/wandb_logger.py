"""The Weights & Biases logger that never stops training, the eval axis keys, resuming a run, finishing.

`SafeWandbLogger` is Lightning's `WandbLogger` whose every call into wandb goes through
`call_wandb`: the first exception is reported once and W&B is left alone for the rest of the run.
The functions below take any `WandbLogger`. A resumed run continues its W&B run rewound to the
checkpoint's row (`rewind_to`), or appends without the eval rounds it already holds
(`logged_eval_through`). Why the rows look as they do, and the wandb quirks handled here:
docs/wandb.md; resuming: docs/runs.md.
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

# Lightning's stand-in for an experiment on ranks other than 0; no public name exists for it.
from lightning.fabric.loggers.logger import _DummyExperiment, rank_zero_experiment
from lightning.pytorch.loggers import Logger, WandbLogger
from lightning.pytorch.utilities import rank_zero_only

from areal_lightning.tracking.history import HISTORY_FILENAME

if TYPE_CHECKING:
    pass

log = logging.getLogger(__name__)

T = TypeVar("T")

EVAL_STEP_KEY = "eval/step"
"""The W&B x axis of every eval metric: the global step whose weights were evaluated."""
EVAL_GLOB = "eval/*"
TRAINER_STEP_KEY = "trainer/global_step"
"""Lightning's `WandbLogger` x axis of everything it logs."""
SAMPLES_KEY = "samples"

# The first failure of each logger, kept outside the logger so that a plain `WandbLogger` that a
# user put in `trainer.loggers` is guarded too. Weak keys: no logger is kept alive.
_failures: weakref.WeakKeyDictionary[WandbLogger, str] = weakref.WeakKeyDictionary()
_failures_lock = threading.Lock()


# ---- failure handling --------------------------------------------------------------------------


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
        "and %s remains complete.",
        action,
        type(err).__name__,
        err,
        where,
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


# ---- the logger --------------------------------------------------------------------------------


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

    Arguments are those of `WandbLogger` (``id=`` names the run; an existing run of that id
    continues, W&B's ``resume="allow"``), plus:

    Args:
        history_file: the eval history file the failure warning points users to.
        rewind_to: continue the run ``id`` from its row ``_step == rewind_to`` (W&B's rewind): its
            later rows are dropped. None: append to the run.
        logged_eval_through: the last evaluated step this W&B run already holds (its earlier
            session logged it before a crash); without a rewind (none asked, or W&B refused it),
            rounds of steps up to it are not logged again.

    Example:
        >>> lg = SafeWandbLogger(project="demo", offline=True, save_dir="runs/demo", id="r1")
        >>> lg.name, lg.version, wandb_failure(lg) is None
        ('demo', 'r1', True)
    """

    def __init__(
        self,
        *args: Any,
        history_file: str | Path | None = None,
        rewind_to: int | None = None,
        logged_eval_through: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.history_file = history_file
        self.rewind_to = rewind_to
        # With a rewind the resumed session logs every step after the rewind point afresh.
        self.logged_eval_through = None if rewind_to is not None else logged_eval_through
        self._eval_through_without_rewind = logged_eval_through
        # Lightning always passes anonymous=None (a wandb deprecation warning); its init kwargs
        # are only reachable through the private dict.
        if self._wandb_init.get("anonymous") is None:
            self._wandb_init.pop("anonymous", None)
        if rewind_to is not None:
            if self._id is None:
                raise ValueError("SafeWandbLogger(rewind_to=...) needs the id of the run to rewind (id=...)")
            # wandb refuses `resume` beside `resume_from`; Lightning always passes resume="allow".
            self._wandb_init.pop("resume", None)
            self._wandb_init["resume_from"] = f"{self._id}?_step={int(rewind_to)}"

    @property
    def failure(self) -> str | None:
        """Why W&B was turned off for this logger, or None while it works."""
        return wandb_failure(self)

    def _start_run(self) -> Any:
        _prepare_save_dir(self.save_dir)
        if self._wandb_init.get("dir") is not None:
            # The W&B service that writes the run's transaction log may be another process's, with
            # another working directory: a process started by one that runs W&B (a sweep agent, a
            # notebook, a test runner) inherits its WANDB_SERVICE and joins it. A relative dir
            # would then be resolved there: the log lands elsewhere, or nowhere.
            self._wandb_init["dir"] = os.path.abspath(self._wandb_init["dir"])
        if "resume_from" not in self._wandb_init:
            return self._init_run()
        try:
            return self._init_run()
        except Exception as err:  # noqa: BLE001 - a refused rewind still leaves a run to continue
            log.warning(
                "W&B refused to rewind run %s to _step %s (%s: %s); the run continues without rewinding: "
                "rows its earlier session logged after the checkpoint stay, and eval rounds up to step %s "
                "are not logged again",
                self._id,
                self.rewind_to,
                type(err).__name__,
                err,
                self._eval_through_without_rewind,
            )
            self._wandb_init.pop("resume_from")
            self._wandb_init["resume"] = "allow"
            self.rewind_to = None
            self.logged_eval_through = self._eval_through_without_rewind
            return self._init_run()

    def _init_run(self) -> Any:
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
        # `_experiment` is Lightning's cache of the started run; `experiment` itself would start one.
        if self._experiment is None and self.failure is None:
            call_wandb(self, "starting the run (wandb.init)", self._start_run)
        if self.failure is not None or self._experiment is None:
            return _DummyExperiment()
        return self._experiment

    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        call_wandb(self, "logging metrics", super().log_metrics, metrics, step)

    @rank_zero_only
    def log_hyperparams(self, params: Any) -> None:
        call_wandb(self, "logging hyperparameters", super().log_hyperparams, params)

    @rank_zero_only
    def log_table(
        self,
        key: str,
        columns: list[str] | None = None,
        data: list[list[Any]] | None = None,
        dataframe: Any = None,
        step: int | None = None,
    ) -> None:
        call_wandb(self, f"logging the table {key!r}", super().log_table, key, columns, data, dataframe, step)

    @rank_zero_only
    def log_image(self, key: str, images: list[Any], step: int | None = None, **kwargs: Any) -> None:
        call_wandb(self, f"logging images {key!r}", super().log_image, key, images, step, **kwargs)

    @rank_zero_only
    def log_audio(self, key: str, audios: list[Any], step: int | None = None, **kwargs: Any) -> None:
        call_wandb(self, f"logging audio {key!r}", super().log_audio, key, audios, step, **kwargs)

    @rank_zero_only
    def log_video(self, key: str, videos: list[Any], step: int | None = None, **kwargs: Any) -> None:
        call_wandb(self, f"logging videos {key!r}", super().log_video, key, videos, step, **kwargs)

    def watch(self, model: Any, log: str | None = "gradients", log_freq: int = 100, log_graph: bool = True) -> None:
        call_wandb(self, "watching the model", super().watch, model, log, log_freq, log_graph)

    def after_save_checkpoint(self, checkpoint_callback: Any) -> None:
        call_wandb(self, "logging a checkpoint", super().after_save_checkpoint, checkpoint_callback)

    @rank_zero_only
    def finalize(self, status: str) -> None:
        call_wandb(self, "finalizing the run", super().finalize, status)


def started_run(logger: WandbLogger) -> Any:
    """The logger's wandb run if one was started, else None (never starts one)."""
    # No public "has the run started" on `WandbLogger`: `experiment` would call wandb.init.
    return logger._experiment


def last_logged_step(loggers: Sequence[Logger]) -> int | None:
    """The ``_step`` of the last row that the first started W&B run among `loggers` logged, i.e. the
    point to rewind it to when training resumes from a checkpoint taken now; None without such a
    run (not started, failed, or no W&B logger) or before its first row."""
    for logger in loggers:
        if isinstance(logger, WandbLogger) and wandb_failure(logger) is None:
            run = started_run(logger)
            if run is not None:
                # `step` is the next row's; a rewound session reports 0 until its first row, and
                # its `starting_step` (the row after the rewind point) until then.
                steps = call_wandb(logger, "reading the run's step", lambda r: max(r.step, r.starting_step), run)
                return None if steps is None or steps == 0 else int(steps) - 1
    return None


@rank_zero_only
def finish_wandb(loggers: Sequence[Logger], exit_code: int = 0) -> None:
    """Ends the W&B run of every W&B logger among `loggers` that started one (Lightning never
    does, so that ``fit`` and ``test`` share a run); W&B failures never raise.

    Example:
        >>> finish_wandb([])
    """
    for logger in loggers:
        if isinstance(logger, WandbLogger) and wandb_failure(logger) is None:
            run = started_run(logger)
            if run is not None:
                call_wandb(logger, "finishing the run", run.finish, exit_code=exit_code)


__all__ = [
    "EVAL_STEP_KEY",
    "SafeWandbLogger",
    "call_wandb",
    "finish_wandb",
    "last_logged_step",
    "started_run",
    "wandb_failure",
]
