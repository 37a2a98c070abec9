"""PassAtK, PassHatK and MajAtK: per-prompt estimates over ``n`` samples, averaged over prompts.

Each is an :class:`~areal_lightning.metrics.mean.ExactMean` of the per-prompt estimates: the
exact sum of the estimates (each a float64, e.g. 2/3 rounded once), the exact sum of their squares
and the number of prompts are summed over ranks, and the mean (and its standard error) is rounded
once, so the result is bit for bit the same whatever the number of ranks and however the prompts
were split between them and their updates.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor

from areal_lightning.errors import ArgumentError
from areal_lightning.metrics.checks import _check_k
from areal_lightning.metrics.exact import add_squares, merge_sums, new_sum, stderr_float
from areal_lightning.metrics.functional import _maj_at_k_per_prompt, _pass_at_k_per_prompt, _pass_hat_k_per_prompt
from areal_lightning.metrics.mean import ExactMean

STDERR_KEY = "stderr"
"""The key of the standard error in ``compute()``'s mapping (logged as ``pass@4/stderr``)."""


class _MeanOverPrompts(ExactMean):
    """An exact mean over prompts that knows its ``k``, and the standard error of that mean across
    prompts (sample std of the per-prompt values over the square root of their number); NaN before
    any prompt (the standard error: before two)."""

    higher_is_better = True
    symbol: ClassVar[str] = ""

    squares: Tensor

    def __init__(self, k: int, stderr: bool = False, **kwargs: Any) -> None:
        # ExactMean turns the compute cache off (a rank without updates would skip the gathers).
        super().__init__(**kwargs)
        self.k = _check_k(k, type(self).__name__)
        if not isinstance(stderr, bool):
            raise ArgumentError(type(self).__name__, "stderr", stderr, "True or False")
        self.stderr = stderr
        self.add_state("squares", new_sum(), dist_reduce_fx=merge_sums)

    @property
    def name(self) -> str:
        """The metric's conventional name, e.g. ``pass@4``: the key of its value when ``stderr=True``."""
        return f"{self.symbol}{self.k}"

    def _add(self, per_prompt: Tensor) -> None:
        super().update(per_prompt)
        self.squares = add_squares(self.squares, per_prompt)

    def compute(self) -> Any:
        """The mean over prompts (a float64 scalar); with ``stderr=True`` the mapping
        ``{name: mean, "stderr": standard error}`` (registered under `name`, the round logs
        ``pass@4`` and ``pass@4/stderr``)."""
        mean = super().compute()
        if not self.stderr:
            return mean
        return {self.name: mean, STDERR_KEY: torch.tensor(stderr_float(self.total, self.squares), dtype=torch.float64)}


class PassAtK(_MeanOverPrompts):
    """Unbiased pass@k (Chen et al. 2021) averaged over prompts.

    Each ``update`` may bring any number of prompts and any ``n >= k`` samples per prompt; each
    prompt weighs the same. Exact under DDP: the float64 nearest to the exact mean of the
    per-prompt float64 estimates, whatever the ranks and updates.

    Args:
        k: positive integer, the number of attempts allowed.
        stderr: ``compute()`` also gives the standard error across prompts (see `compute`).
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

    symbol = "pass@"

    def update(self, correct: Tensor) -> None:
        """Add ``[P, n]`` bool or 0/1 correctness of ``n >= k`` samples for each of ``P`` prompts."""
        self._add(_pass_at_k_per_prompt(torch.as_tensor(correct).detach(), self.k, "PassAtK.update", "correct"))


class PassHatK(_MeanOverPrompts):
    """Unbiased pass^k (all ``k`` attempts correct, ``C(c, k) / C(n, k)``) averaged over prompts.

    Each prompt weighs the same; exact under DDP as `PassAtK`.

    Args:
        k: positive integer, the number of attempts that must all succeed.
        stderr: ``compute()`` also gives the standard error across prompts.
        kwargs: passed to :class:`torchmetrics.Metric`.

    Raises:
        ValueError: if ``k`` is not a positive integer.

    ``compute()`` returns a float64 scalar, NaN before any prompt.

    Example:
        >>> metric = PassHatK(k=2, stderr=True)
        >>> metric.update(torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]]))
        >>> {key: round(value.item(), 4) for key, value in metric.compute().items()}
        {'pass^2': 0.75, 'stderr': 0.25}
    """

    symbol = "pass^"

    def update(self, correct: Tensor) -> None:
        """Add ``[P, n]`` bool or 0/1 correctness of ``n >= k`` samples for each of ``P`` prompts."""
        self._add(_pass_hat_k_per_prompt(torch.as_tensor(correct).detach(), self.k, "PassHatK.update", "correct"))


class MajAtK(_MeanOverPrompts):
    """maj@k: share of prompts whose majority answer among the first ``k`` samples is correct.

    ``-1`` marks a sample without an answer; ties go to the answer that appears first (see
    :func:`~areal_lightning.metrics.functional.maj_at_k_per_prompt`). The first ``k`` of ``n``
    independent samples are ``k`` independent samples, so the estimate is unbiased. Exact under DDP.

    Args:
        k: positive integer, the number of samples that vote.
        stderr: ``compute()`` also gives the standard error across prompts.
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

    symbol = "maj@"

    def update(self, answer_ids: Tensor, correct: Tensor) -> None:  # type: ignore[override]
        """Add ``[P, n]`` integer answer ids and ``[P, n]`` correctness, ``n >= k``."""
        self._add(
            _maj_at_k_per_prompt(
                torch.as_tensor(answer_ids).detach(),
                torch.as_tensor(correct).detach(),
                self.k,
                "MajAtK.update",
                "answer_ids",
            )
        )
