"""One sample's score and how it came about (pure Python: tasks and the config import it without torch)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

DEFAULT_TIMEOUT_S = 5.0
"""Per-sample time limit of a scorer call (math-verify's own default is 5 s as well)."""


class ScoreStatus(str, Enum):
    """How a sample's score came about."""

    OK = "ok"
    TIMEOUT = "timeout"
    """The scorer did not answer within the time limit; its worker was replaced."""
    PARSE_FAILURE = "parse_failure"
    """The scorer found no answer to score (it returned None)."""
    ERROR = "error"
    """The scorer raised."""


@dataclass(frozen=True)
class Score:
    """One sample's reward and how it came about (a failed sample carries the wrong-answer reward)."""

    reward: float
    status: ScoreStatus = ScoreStatus.OK
