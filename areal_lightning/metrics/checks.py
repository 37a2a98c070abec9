r"""Argument checks of the metric functions and classes: each names the call, the argument, the
value and what is accepted (``\`pass_at_k(k=...)\` must be a positive integer, got k=0``)."""

from __future__ import annotations

import math
import numbers
from typing import Literal

import torch
from torch import Tensor
from torchmetrics.utilities import rank_zero_warn


def _as_2d(x: Tensor, name: str, where: str) -> Tensor:
    x = torch.as_tensor(x)
    if x.ndim != 2:
        raise ValueError(
            f"`{where}({name}=...)` must be a 2-D tensor [P, n] (prompts x samples), got shape {tuple(x.shape)}"
        )
    return x


def _check_k(k: int, where: str) -> int:
    if isinstance(k, bool) or not isinstance(k, numbers.Integral) or k < 1:
        raise ValueError(f"`{where}(k=...)` must be a positive integer, got k={k!r}")
    return int(k)


def _check_k_le_n(k: int, n: int, where: str, name: str) -> None:
    if k > n:
        raise ValueError(f"`{where}({name}=...)` needs k <= n (samples per prompt), got k={k}, n={n}")


def _check_binary(x: Tensor, name: str, where: str) -> Tensor:
    if x.dtype != torch.bool:
        bad = x[(x != 0) & (x != 1)]
        if bad.numel():
            raise ValueError(f"`{where}({name}=...)` must hold booleans or 0/1 values, got {bad.flatten()[0].item()!r}")
    return x.bool()


def _check_confidence(confidence: float, where: str) -> float:
    if isinstance(confidence, bool) or not isinstance(confidence, numbers.Real) or not 0 < confidence < 1:
        raise ValueError(f"`{where}(confidence=...)` must be a number in (0, 1), got {confidence!r}")
    return float(confidence)


NanStrategy = Literal["error", "warn", "ignore", "disable"] | float
"""torchmetrics' ``nan_strategy`` vocabulary (``torchmetrics.aggregation``): what a NaN reward means."""

_NAN_STRATEGY_NAMES: tuple[str, ...] = ("error", "warn", "ignore", "disable")


def _check_nan_strategy(nan_strategy: NanStrategy, where: str) -> NanStrategy:
    if isinstance(nan_strategy, str) and nan_strategy in _NAN_STRATEGY_NAMES:
        return nan_strategy
    if isinstance(nan_strategy, numbers.Real) and not isinstance(nan_strategy, bool) and math.isfinite(nan_strategy):
        return float(nan_strategy)
    raise ValueError(
        f"`{where}(nan_strategy=...)` must be one of {_NAN_STRATEGY_NAMES} or a finite float that replaces "
        f"NaN, got {nan_strategy!r}"
    )


def _apply_nan_strategy(values: Tensor, nan_strategy: NanStrategy, where: str) -> Tensor:
    """Flatten ``values`` (dtype kept) and handle NaN as ``nan_strategy`` (already checked) says."""
    # Not torchmetrics' BaseAggregator._cast_and_nan_check_input: it is private, writes a float
    # replacement into the caller's tensor in place, and its error names neither metric nor count.
    values = torch.as_tensor(values).detach().flatten()
    if nan_strategy == "disable":
        return values
    nan = torch.isnan(values)
    num_nan = int(nan.sum())
    if num_nan == 0:
        return values
    seen = f"`{where}(rewards=...)` got {num_nan} NaN value(s) out of {values.numel()}"
    if nan_strategy == "error":
        raise ValueError(
            f"{seen} with nan_strategy='error'; pass nan_strategy='ignore' (or 'warn') to drop them, "
            "or a float such as 0.0 to replace them"
        )
    if nan_strategy in ("ignore", "warn"):
        if nan_strategy == "warn":
            rank_zero_warn(f"{seen}; dropped them (nan_strategy='warn')", UserWarning)
        return values[~nan]
    return torch.where(nan, torch.full_like(values, float(nan_strategy)), values)


def _check_rewards_2d(rewards: Tensor, where: str) -> Tensor:
    rewards = _as_2d(rewards, "rewards", where)
    if torch.isinf(rewards).any():
        raise ValueError(
            f"`{where}(rewards=...)` must be finite or NaN (NaN marks a missing reward), "
            f"got {int(torch.isinf(rewards).sum())} infinite value(s)"
        )
    return rewards
