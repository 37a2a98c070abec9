"""`ScoringMetric`: how many samples' scoring timed out, failed to parse or raised, summed over ranks.

The statuses come from `scoring.Score` (a `SafeScorer` or a task's own ``score_many``); the
counts are float64 sum states, exact across ranks.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from areal_lightning.metrics.float64_states import Float64StateMetric
from areal_lightning.scoring.score import Score, ScoreStatus


class ScoringMetric(Float64StateMetric):
    """Counts of samples whose scoring timed out, failed to parse or raised, summed over ranks.

    ``compute()`` returns ``{"timeouts", "parse_failures", "errors"}`` (float64 counts), logged as
    ``eval/<set>/scoring/timeouts`` and so on by the default evaluation.

    Example:
        >>> m = ScoringMetric()
        >>> m.update([Score(1.0), Score(0.0, ScoreStatus.TIMEOUT), Score(0.0, ScoreStatus.PARSE_FAILURE)])
        >>> {k: v.item() for k, v in m.compute().items()}
        {'timeouts': 1.0, 'parse_failures': 1.0, 'errors': 0.0}
    """

    is_differentiable = False
    higher_is_better = False
    full_state_update = False

    timeouts: Tensor
    parse_failures: Tensor
    errors: Tensor

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**{"compute_with_cache": False, **kwargs})
        for name in ("timeouts", "parse_failures", "errors"):
            self.add_state(name, torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, scores: Sequence[Score]) -> None:
        """Counts the failed `Score`s among `scores`."""
        statuses = [s.status for s in scores]
        self.timeouts += statuses.count(ScoreStatus.TIMEOUT)
        self.parse_failures += statuses.count(ScoreStatus.PARSE_FAILURE)
        self.errors += statuses.count(ScoreStatus.ERROR)

    def compute(self) -> dict[str, Tensor]:
        """Returns ``{"timeouts", "parse_failures", "errors"}``."""
        return {"timeouts": self.timeouts, "parse_failures": self.parse_failures, "errors": self.errors}
