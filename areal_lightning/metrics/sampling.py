"""PassAtK and MajAtK: per-prompt estimates over ``n`` samples, averaged over prompts.

Both are a float64 :class:`torchmetrics.MeanMetric` of the per-prompt estimate: its two states
(sum of estimates, number of prompts) are summed over ranks, so the DDP result is exact.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torchmetrics import MeanMetric

from areal_lightning.metrics.functional import _check_k, _maj_at_k_per_prompt, _pass_at_k_per_prompt


class _MeanOverPrompts(MeanMetric):
    """A float64 ``MeanMetric`` over prompts that knows its ``k``; NaN before any prompt."""

    # torchmetrics' BaseAggregator assigns None to both without an annotation (Metric says bool | None).
    is_differentiable = False  # type: ignore[assignment]
    higher_is_better = True  # type: ignore[assignment]

    def __init__(self, k: int, **kwargs: Any) -> None:
        # No compute cache: a cached compute skips the sync, so a rank without updates since its
        # last compute would skip the gathers the other ranks run (wrong values or a hang).
        # The estimates are never NaN (inputs are checked 0/1), so MeanMetric's NaN scan is off.
        super().__init__(nan_strategy="disable", **{"compute_with_cache": False, **kwargs})
        self.k = _check_k(k, type(self).__name__)
        self.set_dtype(torch.float64)


class PassAtK(_MeanOverPrompts):
    """Unbiased pass@k (Chen et al. 2021) averaged over prompts.

    Each ``update`` may bring any number of prompts and any ``n >= k`` samples per prompt; each
    prompt weighs the same. Exact under DDP (float64 sums).

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

    def update(self, correct: Tensor) -> None:  # type: ignore[override]
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
