"""The fixed choices of `EvaluationCallback`, as Enums the app's config uses too (pure Python)."""

from __future__ import annotations

from enum import Enum
from typing import Any, TypeVar

from areal_lightning.errors import ArgumentError

DEFAULT_TABLE_ROWS = 16
"""Sample generations per eval set kept for the W&B table."""


class EvalMode(str, Enum):
    """``sync``: training waits for the round."""

    SYNC = "sync"


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


E = TypeVar("E", bound=Enum)


def choice(arg: str, value: Any, enum: type[E], owner: str = "EvaluationCallback") -> E:
    """`value` as a member of `enum` (a member or its value), or Timer's error naming the choices."""
    try:
        return enum(value)
    except ValueError:
        choices = ", ".join(m.value for m in enum)
        raise ArgumentError(owner, arg, value, f"one of {choices}",
                            f"Unsupported parameter value `{owner}({arg}={value!r})`. "
                            f"Possible choices are: {choices}") from None
