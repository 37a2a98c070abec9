"""`LabelCountMetric`: how many samples of a round carried each of a task's labels, summed over ranks.

A task names the outcomes it tells apart (`scoring.ScoreLabels`: a program's ``passed``,
``timeout``, ...) and puts them on each `Score` (``Score.labels``); the default evaluation counts
them. The counts are float64 sum states over a fixed list of labels, so every rank syncs the same
states and the result is exact whatever the number of ranks.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from areal_lightning.metrics.float64_states import Float64StateMetric
from areal_lightning.scoring.score import Score, ScoreLabels


class LabelCountMetric(Float64StateMetric):
    """Counts of each label of `labels` among the scores of a round (and, with ``labels.shares``,
    each label's share of the scores).

    ``compute()`` returns ``{label: count}`` (float64), plus ``{f"{label}_share": share}`` with
    shares (NaN before any score); created as ``ctx.metric(labels.prefix, ...)`` they are logged as
    ``eval/<set>/<prefix>/<label>``. Labels of other prefixes are ignored.

    Raises:
        ValueError: (in ``update``) for a label of this prefix that `labels` does not declare.

    Example:
        >>> from areal_lightning.scoring import Score, ScoreLabels
        >>> m = LabelCountMetric(ScoreLabels("code", ("passed", "failed")))
        >>> m.update([Score(1.0, labels=("code/passed",)), Score(0.0, labels=("code/failed",)), Score(1.0)])
        >>> {k: v.item() for k, v in m.compute().items()}
        {'passed': 1.0, 'failed': 1.0}
    """

    is_differentiable = False
    higher_is_better = None
    full_state_update = False

    counts: Tensor
    total: Tensor

    def __init__(self, labels: ScoreLabels, **kwargs: Any) -> None:
        super().__init__(**{"compute_with_cache": False, **kwargs})
        if not isinstance(labels, ScoreLabels):
            raise ValueError(f"`LabelCountMetric(labels=...)` must be a ScoreLabels, got {labels!r}")
        self.labels = labels
        self._index = {f"{labels.prefix}/{label}": i for i, label in enumerate(labels.labels)}
        self.add_state("counts", torch.zeros(len(labels.labels), dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("total", torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, scores: Sequence[Score]) -> None:
        """Counts the labels of this prefix on `scores`."""
        counts = [0] * len(self._index)
        prefix = f"{self.labels.prefix}/"
        for score in scores:
            for label in score.labels:
                if not label.startswith(prefix):
                    continue
                if label not in self._index:
                    raise ValueError(f"a score carries label {label!r}, which is not one of {sorted(self._index)}")
                counts[self._index[label]] += 1
        self.counts += torch.tensor(counts, dtype=torch.float64, device=self.counts.device)
        self.total += len(scores)

    def compute(self) -> dict[str, Tensor]:
        """Returns ``{label: count}``, and ``{label_share: share}`` with shares."""
        out = {label: self.counts[i] for i, label in enumerate(self.labels.labels)}
        if self.labels.shares:
            out.update({f"{label}_share": self.counts[i] / self.total for i, label in enumerate(self.labels.labels)})
        return out
