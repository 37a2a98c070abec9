"""`HarnessAggregate`: a harness metric of an eval set, aggregated by the harness's own function.

Each rank keeps the value of every document it evaluated, with the document's id; the reduction
gathers them all (a ``cat`` state: exact), and `compute` orders them by document id, as the
harness's own evaluation lists them, and applies the task's aggregation (``mean`` ...) or its
standard error (`lm_eval.api.metrics.stderr_for_metric`: closed form for a mean, the bootstrap for
a median). So the value is the harness's, to the last digit, on any number of ranks.
"""

from __future__ import annotations

import math
from enum import Enum
from typing import Any

import torch
from torch import Tensor
from torchmetrics import Metric
from torchmetrics.utilities import dim_zero_cat

from areal_lightning.metrics import PassAtK


class Statistic(Enum):
    VALUE = "value"
    STDERR = "stderr"


def _aggregation(name: str) -> Any:
    from lm_eval.api import metrics

    return getattr(metrics, name)


class HarnessAggregate(Metric):
    """One harness metric under one filter (``exact_match,strict-match``), or its standard error.

    Args:
        aggregation: the name of the task's aggregation function in `lm_eval.api.metrics` (``mean``).
        statistic: the aggregate itself, or its standard error (NaN for one document, where the
            harness writes ``N/A``).
        bootstrap_iters: the bootstrap's draws, as `simple_evaluate`'s ``bootstrap_iters``.

    Example:
        >>> m = HarnessAggregate("mean")
        >>> m.update([2, 0], [1.0, 0.0]); m.update([1], [1.0])
        >>> float(m.compute())
        0.6666666666666666
    """

    full_state_update = False
    higher_is_better = None
    doc_ids: list[Tensor]
    values: list[Tensor]

    def __init__(
        self, aggregation: str, statistic: Statistic = Statistic.VALUE, bootstrap_iters: int = 100_000
    ) -> None:
        super().__init__()
        self.aggregation = aggregation
        self.statistic = statistic
        self.bootstrap_iters = bootstrap_iters
        self.add_state("doc_ids", default=[], dist_reduce_fx="cat")
        self.add_state("values", default=[], dist_reduce_fx="cat")

    def update(self, doc_ids: list[int], values: list[float]) -> None:
        self.doc_ids.append(torch.tensor(doc_ids, dtype=torch.int64, device=self.device))
        self.values.append(torch.tensor(values, dtype=torch.float64, device=self.device))

    def compute(self) -> Tensor:
        if isinstance(self.values, list) and not self.values:  # after a sync the state is one tensor
            return torch.tensor(math.nan, dtype=torch.float64)
        ids, values = dim_zero_cat(self.doc_ids).cpu(), dim_zero_cat(self.values).cpu()
        items = values[torch.argsort(ids, stable=True)].tolist()
        function = _aggregation(self.aggregation)
        if self.statistic is Statistic.VALUE:
            return torch.tensor(float(function(items)), dtype=torch.float64)
        from lm_eval.api.metrics import stderr_for_metric

        stderr = stderr_for_metric(metric=function, bootstrap_iters=self.bootstrap_iters)
        if stderr is None or len(items) < 2:
            return torch.tensor(math.nan, dtype=torch.float64)
        return torch.tensor(float(stderr(items)), dtype=torch.float64)


class FilterPassAtK(PassAtK):
    """Unbiased pass@k of the documents' repeats under one filter of the task, logged as
    ``pass@k,<filter>`` and ``pass@k,<filter>/stderr`` (a repeat passes when the task's first metric
    scores it above 0).

    Example:
        >>> m = FilterPassAtK(2, "strict-match")
        >>> m.update(torch.tensor([[True, False, False], [False, False, False]]))
        >>> {k: round(float(v), 4) for k, v in m.compute().items()}
        {'pass@2,strict-match': 0.3333, 'stderr': 0.3333}
    """

    def __init__(self, k: int, filter_name: str) -> None:
        super().__init__(k, stderr=True)
        self.filter_name = filter_name

    @property
    def name(self) -> str:
        return f"{self.symbol}{self.k},{self.filter_name}"
