"""RL evaluation metrics: pure functions and torchmetrics classes that are exact under DDP.

``functional`` holds the math; the classes only accumulate float64 states (counts, min / max,
and exact sums of float values, see ``exact``), each with its ``dist_reduce_fx``, so a result
synced over ranks is bit for bit the single-process result over the union of the data, whatever
the number of ranks and of updates per rank (a rank with none included); a mean is the float64
nearest to the exact mean of the float64 values. Every ``compute()`` runs the same gathers on
every rank (the classes default to ``compute_with_cache=False``); on a rank without update
torchmetrics warns "compute ... before update" on local rank 0 only, and the synced value is
still right.

The names below load on first use (PEP 562): `constants` is pure Python, so the app's config reads
`AdvantageStd` without importing torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from areal_lightning.lazy import lazy_exports as _lazy_exports

if TYPE_CHECKING:  # what type checkers and IDEs see; at run time `__getattr__` imports on first use
    from areal_lightning.metrics.accuracy import (
        AccuracyMetric as AccuracyMetric,
    )
    from areal_lightning.metrics.advantage import (
        AdvantageMetric as AdvantageMetric,
    )
    from areal_lightning.metrics.at_k import (
        MajAtK as MajAtK,
        PassAtK as PassAtK,
    )
    from areal_lightning.metrics.constants import (
        NO_ANSWER as NO_ANSWER,
        AdvantageStd as AdvantageStd,
    )
    from areal_lightning.metrics.functional import (
        ADVANTAGE_EPS as ADVANTAGE_EPS,
        group_advantages as group_advantages,
        maj_at_k as maj_at_k,
        maj_at_k_per_prompt as maj_at_k_per_prompt,
        mean_at_n as mean_at_n,
        pass_at_k as pass_at_k,
        pass_at_k_per_prompt as pass_at_k_per_prompt,
        wilson_interval as wilson_interval,
        zero_std_groups as zero_std_groups,
    )
    from areal_lightning.metrics.label_counts import (
        LabelCountMetric as LabelCountMetric,
    )
    from areal_lightning.metrics.mean import (
        ExactMean as ExactMean,
    )
    from areal_lightning.metrics.reward import (
        RewardMetric as RewardMetric,
    )
    from areal_lightning.metrics.scoring_failures import (
        ScoringMetric as ScoringMetric,
    )


_FUNCTIONAL = "areal_lightning.metrics.functional"
_EXPORTS = {
    "AccuracyMetric": "areal_lightning.metrics.accuracy",
    "AdvantageMetric": "areal_lightning.metrics.advantage",
    "AdvantageStd": "areal_lightning.metrics.constants",
    "ExactMean": "areal_lightning.metrics.mean",
    "LabelCountMetric": "areal_lightning.metrics.label_counts",
    "MajAtK": "areal_lightning.metrics.at_k",
    "PassAtK": "areal_lightning.metrics.at_k",
    "RewardMetric": "areal_lightning.metrics.reward",
    "NO_ANSWER": "areal_lightning.metrics.constants",
    "ScoringMetric": "areal_lightning.metrics.scoring_failures",
    **{
        name: _FUNCTIONAL
        for name in (
            "ADVANTAGE_EPS",
            "group_advantages",
            "maj_at_k",
            "maj_at_k_per_prompt",
            "mean_at_n",
            "pass_at_k",
            "pass_at_k_per_prompt",
            "wilson_interval",
            "zero_std_groups",
        )
    },
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = _lazy_exports(__name__, _EXPORTS, globals())
