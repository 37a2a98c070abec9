"""PassAtK and MajAtK: per-prompt estimates over ``n`` samples, averaged over prompts."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor
from torchmetrics import Metric

from areal_lightning.metrics.functional import _check_k, _maj_at_k_per_prompt, _pass_at_k_per_prompt


class _PerPromptMean(Metric):
    """Mean over prompts of a per-prompt estimate: float64 sum of estimates and prompt count."""

    is_differentiable = False
    higher_is_better = True
    full_state_update = False

    estimate_sum: Tensor
    num_prompts: Tensor

    def __init__(self, k: int, **kwargs: Any) -> None:
        # No compute cache: a cached compute skips the sync, so a rank without updates since its
        # last compute would skip the gathers the other ranks run (wrong values or a hang).
        super().__init__(**{"compute_with_cache": False, **kwargs})
        self.k = _check_k(k, type(self).__name__)
        self.add_state("estimate_sum", torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("num_prompts", torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")

    def _add(self, per_prompt: Tensor) -> None:
        self.estimate_sum += per_prompt.sum().to(self.estimate_sum.device)
        self.num_prompts += per_prompt.numel()

    def compute(self) -> Tensor:
        """Return the mean estimate over all prompts seen (float64 scalar); NaN with no prompt."""
        return torch.where(
            self.num_prompts == 0,
            torch.full_like(self.estimate_sum, math.nan),
            self.estimate_sum / self.num_prompts.clamp_min(1),
        )


class PassAtK(_PerPromptMean):
    """Unbiased pass@k (Chen et al. 2021) averaged over prompts.

    Each ``update`` may bring any number of prompts and any ``n >= k`` samples per prompt; each
    prompt weighs the same. Exact under DDP (float64 sums).

    Args:
        k: positive integer, the number of attempts allowed.
        kwargs: passed to :class:`torchmetrics.Metric`.

    Raises:
        ValueError: if ``k`` is not a positive integer.

    Example:
        >>> metric = PassAtK(k=2)
        >>> metric.update(torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0]]))
        >>> metric.compute()
        tensor(0.6667, dtype=torch.float64)
    """

    def update(self, correct: Tensor) -> None:
        """Add ``[P, n]`` bool or 0/1 correctness of ``n >= k`` samples for each of ``P`` prompts."""
        self._add(_pass_at_k_per_prompt(torch.as_tensor(correct).detach(), self.k, "PassAtK.update", "correct"))


class MajAtK(_PerPromptMean):
    """maj@k: share of prompts whose majority answer among the first ``k`` samples is correct.

    ``-1`` marks a sample without an answer; ties go to the answer that appears first (see
    :func:`~areal_lightning.metrics.functional.maj_at_k_per_prompt`). Exact under DDP.

    Args:
        k: positive integer, the number of samples that vote.
        kwargs: passed to :class:`torchmetrics.Metric`.

    Raises:
        ValueError: if ``k`` is not a positive integer.

    Example:
        >>> metric = MajAtK(k=3)
        >>> metric.update(torch.tensor([[3, 5, 5], [1, 1, 2]]), torch.tensor([[1, 0, 0], [1, 1, 0]]))
        >>> metric.compute()
        tensor(0.5000, dtype=torch.float64)
    """

    def update(self, answer_ids: Tensor, correct: Tensor) -> None:
        """Add ``[P, n]`` integer answer ids and ``[P, n]`` correctness, ``n >= k``."""
        per_prompt = _maj_at_k_per_prompt(
            torch.as_tensor(answer_ids).detach(), torch.as_tensor(correct).detach(), self.k,
            "MajAtK.update", "answer_ids",
        )
        self._add(per_prompt)
