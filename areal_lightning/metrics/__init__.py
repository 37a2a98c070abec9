"""RL evaluation metrics: pure functions and torchmetrics classes that are exact under DDP.

``functional`` holds the math; the classes only accumulate float64 states (sums, min / max, and
RewardMetric's moments), each with its ``dist_reduce_fx``, so a result synced over ranks equals
the single-process result over the union of the data, whatever the number of updates per rank
(a rank with none included). Every
``compute()`` runs the same gathers on every rank (the classes default to
``compute_with_cache=False``); on a rank without update torchmetrics warns "compute ... before
update" on local rank 0 only, and the synced value is still right.
"""

from areal_lightning.metrics.accuracy import AccuracyMetric
from areal_lightning.metrics.advantage import AdvantageMetric
from areal_lightning.metrics.functional import (
    ADVANTAGE_EPS,
    NO_ANSWER,
    AdvantageStd,
    group_advantages,
    maj_at_k,
    maj_at_k_per_prompt,
    mean_at_n,
    pass_at_k,
    pass_at_k_per_prompt,
    wilson_interval,
    zero_std_groups,
)
from areal_lightning.metrics.reward import RewardMetric
from areal_lightning.metrics.sampling import MajAtK, PassAtK
from areal_lightning.metrics.scoring import SafeScorer, Score, ScorerFailingError, ScoreStatus, ScoringMetric

__all__ = [
    "ADVANTAGE_EPS",
    "NO_ANSWER",
    "AccuracyMetric",
    "AdvantageMetric",
    "AdvantageStd",
    "MajAtK",
    "PassAtK",
    "RewardMetric",
    "SafeScorer",
    "Score",
    "ScoreStatus",
    "ScorerFailingError",
    "ScoringMetric",
    "group_advantages",
    "maj_at_k",
    "maj_at_k_per_prompt",
    "mean_at_n",
    "pass_at_k",
    "pass_at_k_per_prompt",
    "wilson_interval",
    "zero_std_groups",
]
