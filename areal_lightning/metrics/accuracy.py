"""AccuracyMetric: share of samples whose reward is above a threshold, with a Wilson interval that counts
each prompt once."""

from __future__ import annotations

import math
import numbers
from typing import Any

import torch
from torch import Tensor

from areal_lightning.metrics.checks import NanStrategy, _apply_nan_strategy, _check_confidence, _check_nan_strategy
from areal_lightning.metrics.float64_states import Float64StateMetric
from areal_lightning.metrics.intervals import prompt_wilson_interval

DEFAULT_THRESHOLD: float = 0.8
"""A sample succeeds when its reward is above 0.8 (``rewards > 0.8``)."""

DEFAULT_CONFIDENCE: float = 0.95


class AccuracyMetric(Float64StateMetric):
    """Share of samples with ``reward > threshold`` (strictly), plus its Wilson score interval.

    Rewards are assumed normalised to [0, 1], so ``threshold`` must lie in
    [0, 1]. A row of a 2-D ``rewards`` is one prompt's samples: the interval counts prompts, not
    samples (`prompt_wilson_interval`: the samples of one prompt are not independent); a 1-D
    ``rewards`` is one sample a prompt. States are three float64 sums (successes, samples, prompts),
    exact under DDP.

    Args:
        threshold: finite number in [0, 1]; a sample is correct when its reward is above it.
        confidence: level of the two-sided Wilson interval, in (0, 1).
        nan_strategy: what a NaN reward means, in torchmetrics' words: ``"error"`` (raise),
            ``"ignore"`` (drop it), ``"warn"`` (drop it with a warning), ``"disable"`` (no check:
            ``NaN > threshold`` is false, so it counts as incorrect) or a float that replaces it
            (``0.0``: incorrect).
        kwargs: passed to :class:`torchmetrics.Metric`.

    Raises:
        ValueError: if ``threshold``, ``confidence`` or ``nan_strategy`` is out of range.

    ``compute()`` returns ``{"accuracy", "ci_low", "ci_high"}`` (float64 scalars); with no
    sample, accuracy is NaN and the interval is (0, 1).

    Example:
        >>> metric = AccuracyMetric(threshold=0.8)
        >>> metric.update(torch.tensor([1.0, 0.9, 0.8, 0.0]))
        >>> {key: round(value.item(), 4) for key, value in metric.compute().items()}
        {'accuracy': 0.5, 'ci_low': 0.15, 'ci_high': 0.85}
    """

    is_differentiable = False
    higher_is_better = True
    full_state_update = False

    num_correct: Tensor
    num_samples: Tensor
    num_prompts: Tensor
    threshold: float
    confidence: float
    nan_strategy: NanStrategy

    def __init__(
        self,
        threshold: float = DEFAULT_THRESHOLD,
        confidence: float = DEFAULT_CONFIDENCE,
        nan_strategy: NanStrategy = "error",
        **kwargs: Any,
    ) -> None:
        # No compute cache: a cached compute skips the sync, so a rank without updates since its
        # last compute would skip the gathers the other ranks run (wrong values or a hang).
        super().__init__(**{"compute_with_cache": False, **kwargs})
        if isinstance(threshold, bool) or not isinstance(threshold, numbers.Real) or not 0 <= threshold <= 1:
            raise ValueError(
                f"`AccuracyMetric(threshold=...)` must be a finite number in [0, 1] "
                f"(rewards are normalised to [0, 1]), got {threshold!r}"
            )
        self.threshold = float(threshold)
        self.confidence = _check_confidence(confidence, "AccuracyMetric")
        self.nan_strategy = _check_nan_strategy(nan_strategy, "AccuracyMetric")
        self.add_state("num_correct", torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("num_samples", torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("num_prompts", torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, rewards: Tensor) -> None:
        """Count the samples of ``rewards`` whose reward is above the threshold, and the prompts they
        came from: the rows of a 2-D (or higher) ``rewards``, each value of a 1-D one."""
        rows = torch.as_tensor(rewards).detach()
        rows = rows.flatten(1) if rows.dim() >= 2 else rows.reshape(-1, 1)
        values = _apply_nan_strategy(rewards, self.nan_strategy, "AccuracyMetric.update")
        # A prompt counts when a sample of it counts: all of its rewards dropped as NaN, it does not.
        dropping = self.nan_strategy in ("ignore", "warn")
        self.num_prompts += int((~torch.isnan(rows)).any(dim=1).sum()) if dropping else rows.shape[0]
        # Compare in the rewards' own dtype, as a plain `rewards > 0.8` does: a float32 reward of
        # 0.8 is not above 0.8 (in float64 it would be 0.800000012 > 0.8).
        self.num_correct += (values > self.threshold).sum().to(self.num_correct.device)
        self.num_samples += values.numel()

    def compute(self) -> dict[str, Tensor]:
        """Return ``{"accuracy", "ci_low", "ci_high"}``."""
        accuracy = torch.where(
            self.num_samples == 0,
            torch.full_like(self.num_samples, math.nan),
            self.num_correct / self.num_samples.clamp_min(1),
        )
        low, high = prompt_wilson_interval(self.num_correct, self.num_samples, self.num_prompts, self.confidence)
        return {"accuracy": accuracy, "ci_low": low, "ci_high": high}
