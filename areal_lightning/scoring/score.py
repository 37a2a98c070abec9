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
    """One sample's reward and how it came about (a failed sample carries the wrong-answer reward).

    `labels` are a task's own words for the outcome, each ``<prefix>/<label>`` (a program's
    ``code/timeout``), counted per round when the task declares them (`ScoreLabels`); `correct`
    overrides ``reward >= 1`` as the sample's correctness (a grader whose reward is continuous,
    beside a verifier's verdict).
    """

    reward: float
    status: ScoreStatus = ScoreStatus.OK
    labels: tuple[str, ...] = ()
    correct: bool | None = None


@dataclass(frozen=True)
class ScoreLabels:
    """Labels a task's `Score`s may carry (``Score.labels``), counted per round as ``<prefix>/<label>``.

    A task whose ``score_labels`` holds ``ScoreLabels("code", ("passed", "failed", ...))`` gets, from
    the default evaluation, one exact count per label and eval set (``eval/<set>/code/passed``);
    every label is logged, 0 when no sample carried it, so that every rank syncs the same states.
    With `shares`, each label's share of the samples too (``<prefix>/<label>_share``).

    Raises:
        ValueError: for an empty prefix, no labels, or a label given twice.
    """

    prefix: str
    labels: tuple[str, ...]
    shares: bool = False

    def __post_init__(self) -> None:
        if not self.prefix or not self.labels or len(set(self.labels)) != len(self.labels):
            raise ValueError(
                f"ScoreLabels needs a prefix and distinct labels, got prefix={self.prefix!r}, labels={self.labels!r}"
            )

    def names(self) -> list[str]:
        """The metric names it logs under the eval set (``code/passed``, ...)."""
        names = [f"{self.prefix}/{label}" for label in self.labels]
        return names + ([f"{name}_share" for name in names] if self.shares else [])
