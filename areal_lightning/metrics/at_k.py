"""PassAtK and MajAtK: per-prompt estimates over ``n`` samples, averaged over prompts.

Both are an :class:`~areal_lightning.metrics.mean.ExactMean` of the per-prompt estimates: the
exact sum of the estimates (each a float64, e.g. 2/3 rounded once) and the number of prompts are
summed over ranks, and the mean is rounded once, so the result is bit for bit the same whatever
the number of ranks and however the prompts were split between them and their updates.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from areal_lightning.metrics.checks import _check_k
from areal_lightning.metrics.functional import _maj_at_k_per_prompt, _pass_at_k_per_prompt
from areal_lightning.metrics.mean import ExactMean


class _MeanOverPrompts(ExactMean):
    """An exact mean over prompts that knows its ``k``; NaN before any prompt."""

    higher_is_better = True

    def __init__(self, k: int, **kwargs: Any) -> None:
        # ExactMean turns the compute cache off (a rank without updates would skip the gathers).
        super().__init__(**kwargs)
        self.k = _check_k(k, type(self).__name__)


class PassAtK(_MeanOverPrompts):
    """Unbiased pass@k (Chen et al. 2021) averaged over prompts.

    Each ``update`` may bring any number of prompts and any ``n >= k`` samples per prompt; each
    prompt weighs the same. Exact under DDP: the float64 nearest to the exact mean of the
    per-prompt float64 estimates, whatever the ranks and updates.

    Args:
        k: positive integer, the number of attempts allowed.
        kwargs: passed to :class:`torchmetrics.Metric`.

    Raises:
        ValueError: if ``k`` is not a positive integer.

    ``compute()`` returns a float64 scalar, NaN before any prompt.

    Example:
        >>> metric = PassAtK(k=2)
        >>> metric.update(torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0]]))
        >>> metric.compute()
        tensor(0.6667, dtype=torch.float64)
    """

    def update(self, correct: Tensor) -> None:
        """Add ``[P, n]`` bool or 0/1 correctness of ``n >= k`` samples for each of ``P`` prompts."""
        super().update(_pass_at_k_per_prompt(torch.as_tensor(correct).detach(), self.k, "PassAtK.update", "correct"))


class MajAtK(_MeanOverPrompts):
    """maj@k: share of prompts whose majority answer among the first ``k`` samples is correct.

    ``-1`` marks a sample without an answer; ties go to the answer that appears first (see
    :func:`~areal_lightning.metrics.functional.maj_at_k_per_prompt`). Exact under DDP.

    Args:
        k: positive integer, the number of samples that vote.
        kwargs: passed to :class:`torchmetrics.Metric`.

    Raises:
        ValueError: if ``k`` is not a positive integer.

    ``compute()`` returns a float64 scalar, NaN before any prompt.

    Example:
        >>> metric = MajAtK(k=3)
        >>> metric.update(torch.tensor([[3, 5, 5], [1, 1, 2]]), torch.tensor([[1, 0, 0], [1, 1, 0]]))
        >>> metric.compute()
        tensor(0.5000, dtype=torch.float64)
    """

    def update(self, answer_ids: Tensor, correct: Tensor) -> None:  # type: ignore[override]
        """Add ``[P, n]`` integer answer ids and ``[P, n]`` correctness, ``n >= k``."""
        super().update(
            _maj_at_k_per_prompt(
                torch.as_tensor(answer_ids).detach(),
                torch.as_tensor(correct).detach(),
                self.k,
                "MajAtK.update",
                "answer_ids",
            )
        )
