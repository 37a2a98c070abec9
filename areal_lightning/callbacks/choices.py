"""The fixed choices of `EvaluationCallback`, as Enums the app's config uses too (pure Python)."""

from __future__ import annotations

import re
from enum import Enum
from typing import Any, TypeVar

from areal_lightning.errors import ArgumentError

DEFAULT_TABLE_ROWS = 16
"""Sample generations per eval set kept for the W&B table."""


class EvalMode(str, Enum):
    """``sync``: training waits for the round; ``async``: a worker process evaluates a snapshot of
    the weights while training goes on."""

    SYNC = "sync"
    ASYNC = "async"


class OnBusy(str, Enum):
    """What an async round that falls due while the previous one still runs does: ``skip`` (record
    a ``skipped`` event) or ``wait`` (training waits for the previous round, then submits)."""

    SKIP = "skip"
    WAIT = "wait"


class ThresholdAction(str, Enum):
    """What a threshold alert does: ``alert`` (log, history record, W&B alert) or ``stop`` (also stop)."""

    ALERT = "alert"
    STOP = "stop"


class ErrorPolicy(str, Enum):
    """What a failed round does: ``log`` (record it, keep training) or ``raise``."""

    LOG = "log"
    RAISE = "raise"


class Direction(str, Enum):
    """Which way a metric improves: ``max`` (accuracy, reward) or ``min`` (a loss, a length)."""

    MAX = "max"
    MIN = "min"


class WatchReference(str, Enum):
    """The round the reward-hacking watch compares with: the ``previous`` one or the ``best`` one
    (the highest value of the eval metric so far, the round ``.../delta_best`` pairs with)."""

    PREVIOUS = "previous"
    BEST = "best"


class IntegrityAction(str, Enum):
    """What the integrity checks at the start of fit do with a problem they find: ``warn`` (an event
    and a warning, training goes on), ``fail`` (training does not start) or ``off`` (no checks)."""

    WARN = "warn"
    FAIL = "fail"
    OFF = "off"


E = TypeVar("E", bound=Enum)


def choice(arg: str, value: Any, enum: type[E], owner: str = "EvaluationCallback") -> E:
    """`value` as a member of `enum` (a member or its value), or Timer's error naming the choices."""
    try:
        return enum(value)
    except ValueError:
        choices = ", ".join(m.value for m in enum)
        raise ArgumentError(
            owner,
            arg,
            value,
            f"one of {choices}",
            f"Unsupported parameter value `{owner}({arg}={value!r})`. Possible choices are: {choices}",
        ) from None


DEFAULT_MAX_SNAPSHOT_MIB = 4096.0
"""Default bound of the memory the async weight snapshot (the replica) may take, in MiB."""
DEFAULT_ASYNC_THREADS = 1
"""Default torch intra-op threads of the async worker process."""
_DEVICE = re.compile(r"(cpu|cuda|mps|xpu)(:\d+)?")


def check_async_options(device: Any, threads: Any, max_snapshot_mib: Any) -> None:
    """The async arguments of `EvaluationCallback`, checked at construction (the config reuses it).

    Raises:
        ArgumentError: naming the argument, its value and what is accepted.
    """
    if device is not None and not (isinstance(device, str) and _DEVICE.fullmatch(device)):
        raise ArgumentError("EvaluationCallback", "async_device", device, "a device string (cpu, cuda:1) or None")
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ArgumentError("EvaluationCallback", "async_threads", threads, "a positive integer")
    if max_snapshot_mib is not None and (
        isinstance(max_snapshot_mib, bool)
        or not isinstance(max_snapshot_mib, (int, float))
        or not max_snapshot_mib > 0
        or max_snapshot_mib == float("inf")
    ):
        raise ArgumentError(
            "EvaluationCallback", "max_snapshot_mib", max_snapshot_mib, "a positive number of MiB or None"
        )


def check_cache_mode(mode: EvalMode, cache: bool) -> None:
    """The result cache answers sync rounds only: the async worker evaluates every snapshot it gets.

    Raises:
        ArgumentError: for ``cache=True`` with ``mode="async"``.
    """
    if cache and mode is EvalMode.ASYNC:
        raise ArgumentError(
            "EvaluationCallback",
            "",
            cache,
            "cannot use rounds.cache with execution.mode async: the result cache answers sync rounds only (the "
            "async worker evaluates every snapshot); set cache to False or mode to sync",
        )
