"""Running reward functions: one sample's `Score` and `SafeScorer`, a scorer that cannot hang the run.

A task scores a completion against its answer; `Score` says what it got and how (``ok``,
``timeout``, ``parse_failure``, ``error``). `SafeScorer` runs a reward function in worker processes
with a per-call time limit. Pure Python (no torch): tasks and the app's config import it freely.
The counts of failed samples are a metric: `metrics.ScoringMetric`.
"""

from areal_lightning.scoring.safe_scorer import SafeScorer, ScorerFailingError
from areal_lightning.scoring.score import DEFAULT_TIMEOUT_S, Score, ScoreStatus

__all__ = ["DEFAULT_TIMEOUT_S", "SafeScorer", "Score", "ScoreStatus", "ScorerFailingError"]
