"""When to evaluate: `HybridTrigger`, the pure scheduler behind `EvaluationCallback`.

Pure Python (no Lightning, no torch), driven by the callback's hooks and tested with a fake clock.
Its rules as a user sees them (any trigger fires a round; training time only; a round that fell
due unwatched is made up; resume state) are in docs/triggers.md. The time trigger reads this
process's clock: the caller broadcasts one rank's decision before acting on it.
"""

from __future__ import annotations

import math
import numbers
import time
from collections.abc import Callable, Mapping
from enum import Enum
from typing import Any

from areal_lightning.errors import ArgumentError


class Cause(str, Enum):
    """Why a round runs; recorded in the eval history's ``trigger`` list (as its value)."""

    BEFORE_TRAIN = "before_train"
    STEPS = "steps"
    EPOCHS = "epochs"
    SECS = "secs"
    ADAPTIVE = "adaptive"  # the adaptive schedule (callbacks/adaptive.py), decided by the callback
    END = "end"

    def __str__(self) -> str:
        return self.value

    def __repr__(self) -> str:
        return repr(self.value)


# state_dict keys: they are part of the checkpoint format, renaming one breaks old resumes.
_KEY_LAST_STEP = "last_evaluated_step"
_KEY_EPOCHS_AT_EVAL = "epochs_done_at_last_eval"
_KEY_SECS = "training_secs_since_eval"
_KEY_STARTED = "training_started"


def _is_int(value: Any) -> bool:
    # bool is an int subclass, but `freq_steps: true` is a typo, not "every step".
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _positive_int_or_none(name: str, value: Any) -> int | None:
    if value is None:
        return None
    if not _is_int(value) or value <= 0:
        raise ArgumentError("HybridTrigger", name, value, "a positive integer or None")
    return int(value)


def _is_finite_real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def _positive_secs_or_none(value: Any) -> float | None:
    if value is None:
        return None
    if not _is_finite_real(value) or value <= 0:
        raise ArgumentError("HybridTrigger", "freq_secs", value, "a positive finite number of seconds or None")
    return float(value)


def _check_bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ArgumentError("HybridTrigger", name, value, "True or False")
    return value


def _plural(count: int | float, unit: str) -> str:
    return f"every {unit}" if count == 1 else f"every {count:g} {unit}s"


class HybridTrigger:
    """Decides at which global steps to evaluate; pure Python, driven by a training loop.

    Args:
        freq_epochs: evaluate at the end of every ``freq_epochs``-th epoch; None turns it off.
        freq_steps: evaluate after every global step that is a multiple of ``freq_steps``;
            None turns it off.
        freq_secs: evaluate once this many seconds of training time have passed since the end of
            the last evaluation; checked after each optimizer step. None turns it off.
        eval_before_train: evaluate the initial weights once, before the first training step.
        eval_at_end: evaluate when training ends, unless the last step was just evaluated.
        clock: returns seconds from a monotonic clock; tests pass a fake one.

    Raises:
        ValueError: an argument has a wrong type or value, or the configuration would never
            evaluate anything (every ``freq_*`` None and both flags False).

    Example:
        >>> trigger = HybridTrigger(freq_steps=2)
        >>> trigger.start()
        >>> for step in range(1, 6):
        ...     causes = trigger.after_step(step, epoch=0, last_batch_of_epoch=False)
        ...     if causes:
        ...         trigger.mark_evaluated(step)
        ...         print(step, causes)
        2 ['steps']
        4 ['steps']
        >>> trigger.at_end(5)
        ['end']
    """

    def __init__(
        self,
        freq_epochs: int | None = None,
        freq_steps: int | None = None,
        freq_secs: float | None = None,
        eval_before_train: bool = False,
        eval_at_end: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._freq_epochs = _positive_int_or_none("freq_epochs", freq_epochs)
        self._freq_steps = _positive_int_or_none("freq_steps", freq_steps)
        self._freq_secs = _positive_secs_or_none(freq_secs)
        self._eval_before_train = _check_bool("eval_before_train", eval_before_train)
        self._eval_at_end = _check_bool("eval_at_end", eval_at_end)
        if not callable(clock):
            raise ValueError(f"`HybridTrigger(clock=...)` must be a callable returning seconds, got {clock!r}")
        no_frequency = self._freq_epochs is None and self._freq_steps is None and self._freq_secs is None
        if no_frequency and not self._eval_before_train and not self._eval_at_end:
            raise ArgumentError(
                "HybridTrigger",
                "",
                None,
                "would never evaluate: freq_epochs, freq_steps and freq_secs are all None and eval_before_train and"
                " eval_at_end are False; set at least one of them",
            )
        self._clock = clock
        self._running_since: float | None = None  # clock value when training (re)started; None = stopped
        self._reset_progress()

    def _reset_progress(self) -> None:
        """The state a fresh trigger has; `load_state_dict` overwrites it key by key."""
        self._last_evaluated_step: int | None = None
        # Epochs completed when the last evaluation ran: an epoch trigger is due when a multiple of
        # freq_epochs completed epochs lies beyond it.
        self._epochs_done_at_eval = 0
        self._banked_secs = 0.0  # training seconds since the last evaluation, up to _running_since
        self._training_started = False
        # (global_step, completed epochs) at the latest decision point, so `mark_evaluated(step)`
        # knows which epochs the evaluation covers. Not saved: the next decision point refills it.
        self._observed: tuple[int, int] | None = None

    # ---------------------------------------------------------------- configuration

    @property
    def freq_epochs(self) -> int | None:
        """Evaluate at the end of every ``freq_epochs``-th epoch (None: off)."""
        return self._freq_epochs

    @property
    def freq_steps(self) -> int | None:
        """Evaluate after every multiple of ``freq_steps`` global steps (None: off)."""
        return self._freq_steps

    @property
    def freq_secs(self) -> float | None:
        """Evaluate after this many seconds of training time since the last evaluation (None: off)."""
        return self._freq_secs

    @property
    def eval_before_train(self) -> bool:
        """Evaluate the initial weights once before the first training step."""
        return self._eval_before_train

    @property
    def eval_at_end(self) -> bool:
        """Evaluate when training ends unless its last step was just evaluated."""
        return self._eval_at_end

    def describe(self) -> str:
        """Say in words which triggers are on, e.g. ``evaluate before training, every 500 steps``."""
        parts = []
        if self._eval_before_train:
            parts.append("before training")
        if self._freq_steps is not None:
            parts.append(_plural(self._freq_steps, "step"))
        if self._freq_epochs is not None:
            parts.append(_plural(self._freq_epochs, "epoch"))
        if self._freq_secs is not None:
            parts.append(f"every {self._freq_secs:g} s of training time")
        if self._eval_at_end:
            parts.append("at the end")
        return "evaluate " + ", ".join(parts)

    def __repr__(self) -> str:
        return (
            f"HybridTrigger(freq_epochs={self._freq_epochs!r}, freq_steps={self._freq_steps!r},"
            f" freq_secs={self._freq_secs!r}, eval_before_train={self._eval_before_train!r},"
            f" eval_at_end={self._eval_at_end!r})"
        )

    # ---------------------------------------------------------------- training clock

    def start(self) -> None:
        """Training (re)starts now: training time counts from here (also after a resume)."""
        self.stop()  # a second start() keeps the time counted so far
        self._running_since = self._clock()

    def stop(self) -> None:
        """Training stops or pauses: time from now on does not count. Calling it twice is harmless."""
        if self._running_since is not None:
            self._banked_secs += self._clock() - self._running_since
            self._running_since = None

    def training_secs_since_eval(self) -> float:
        """Training seconds since the end of the last evaluation (since the first start if none)."""
        running = self._clock() - self._running_since if self._running_since is not None else 0.0
        return self._banked_secs + running

    # ---------------------------------------------------------------- decisions

    @property
    def last_evaluated_step(self) -> int | None:
        """The global step of the latest evaluation (any cause), None before the first one."""
        return self._last_evaluated_step

    def before_train(self, global_step: int) -> list[Cause]:
        """Call when training starts (also after a resume); the causes to evaluate now.

        Returns ``["before_train"]`` when ``eval_before_train`` is on, training has never started
        in this run's history (a resumed state says it has) and ``global_step`` was not
        evaluated yet; otherwise ``[]``.
        """
        due = self._eval_before_train and not self._training_started and global_step != self._last_evaluated_step
        self._training_started = True
        return [Cause.BEFORE_TRAIN] if due else []

    def after_step(self, global_step: int, epoch: int, last_batch_of_epoch: bool) -> list[Cause]:
        """Call once after every optimizer step; the causes to evaluate now (``[]``: none).

        Args:
            global_step: the global step after this optimizer step (1 after the first one).
            epoch: 0-based index of the current epoch.
            last_batch_of_epoch: this step ends the epoch (pass False when the loader's length is
                unknown, and call `after_epoch` at the epoch's end instead).

        Returns:
            The causes that fired, in the order ``steps``, ``epochs``, ``secs``.

        Raises:
            RuntimeError: the training clock is stopped (``start()`` was not called).
        """
        if self._running_since is None:
            raise RuntimeError(
                "`HybridTrigger.after_step()` was called while the training clock is stopped: call"
                " start() when training (re)starts, so that the time trigger counts training time."
            )
        self._training_started = True
        self._observe(global_step, epoch + 1 if last_batch_of_epoch else epoch)
        if global_step == self._last_evaluated_step:
            return []
        causes: list[Cause] = []
        if self._steps_due(global_step):
            causes.append(Cause.STEPS)
        if self._epochs_due():
            causes.append(Cause.EPOCHS)
        if self._freq_secs is not None and self.training_secs_since_eval() >= self._freq_secs:
            causes.append(Cause.SECS)
        return causes

    def after_epoch(self, global_step: int, epoch: int) -> list[Cause]:
        """Call at the end of every epoch; ``["epochs"]`` if an epoch evaluation is due now.

        The fallback for loaders of unknown length: with a known length `after_step` already
        fired at the epoch's last step and this returns ``[]``. It also returns ``[]`` when
        ``global_step`` was evaluated already (for another cause): that evaluation saw the weights
        at the end of the epoch, so it counts as the epoch's evaluation.
        """
        self._observe(global_step, epoch + 1)
        if global_step == self._last_evaluated_step:
            return []
        return [Cause.EPOCHS] if self._epochs_due() else []

    def at_end(self, global_step: int) -> list[Cause]:
        """Call when training ends; ``["end"]`` if ``eval_at_end`` and ``global_step`` was not evaluated."""
        return [Cause.END] if self._eval_at_end and global_step != self._last_evaluated_step else []

    def mark_evaluated(self, global_step: int) -> None:
        """Record that the weights at ``global_step`` were just evaluated (any cause).

        Call it when the evaluation *ends*: the time trigger restarts from now, so evaluation
        time does not count as training time.
        """
        if self._last_evaluated_step is None or global_step > self._last_evaluated_step:
            self._last_evaluated_step = global_step
        if self._observed is not None and self._observed[0] == global_step:
            self._epochs_done_at_eval = max(self._epochs_done_at_eval, self._observed[1])
        self._banked_secs = 0.0
        if self._running_since is not None:
            self._running_since = self._clock()

    def _observe(self, global_step: int, epochs_done: int) -> None:
        self._observed = (global_step, epochs_done)
        if global_step == self._last_evaluated_step:
            # The evaluation at this very step saw these weights, so it covers an epoch that ended
            # here too (a loader of unknown length only tells us at `after_epoch`).
            self._epochs_done_at_eval = max(self._epochs_done_at_eval, epochs_done)

    def _steps_due(self, global_step: int) -> bool:
        if self._freq_steps is None:
            return False
        latest_multiple = (global_step // self._freq_steps) * self._freq_steps
        if latest_multiple == 0:
            return False
        return self._last_evaluated_step is None or latest_multiple > self._last_evaluated_step

    def _epochs_due(self) -> bool:
        if self._freq_epochs is None or self._observed is None:
            return False
        latest_multiple = (self._observed[1] // self._freq_epochs) * self._freq_epochs
        return latest_multiple > 0 and latest_multiple > self._epochs_done_at_eval

    # ---------------------------------------------------------------- resume

    def state_dict(self) -> dict[str, Any]:
        """What a resume needs, as plain Python values (safe for ``torch.load(weights_only=True)``).

        The training time includes the interval running now, so a checkpoint taken mid-run keeps it.
        """
        return {
            _KEY_LAST_STEP: self._last_evaluated_step,
            _KEY_EPOCHS_AT_EVAL: self._epochs_done_at_eval,
            _KEY_SECS: float(self.training_secs_since_eval()),
            _KEY_STARTED: self._training_started,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a `state_dict`; a missing key keeps the value a fresh trigger has.

        Call `start()` afterwards, when training resumes: the time between the checkpoint and
        that call (the downtime) does not count as training time.
        """
        self._reset_progress()
        last = state.get(_KEY_LAST_STEP)
        self._last_evaluated_step = None if last is None else int(last)
        self._epochs_done_at_eval = int(state.get(_KEY_EPOCHS_AT_EVAL, 0))
        self._banked_secs = float(state.get(_KEY_SECS, 0.0))
        self._training_started = bool(state.get(_KEY_STARTED, False))
        if self._running_since is not None:
            # Loaded while running: the loaded seconds replace everything counted so far.
            self._running_since = self._clock()
