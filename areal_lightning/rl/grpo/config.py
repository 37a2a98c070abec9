"""`GRPOConfig`: the options of group-relative policy optimisation, the YAML ``grpo`` section and
`GRPOModule(grpo=...)`.

Pure Python (no torch): the app's config loads it before anything heavy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from areal_lightning.errors import ArgumentError
from areal_lightning.metrics.constants import AdvantageStd

OWNER = "GRPOConfig"


def _count(name: str, value: Any, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ArgumentError(OWNER, name, value, "a positive integer" if low else "a non-negative integer")


def _number(name: str, value: Any, *, allow_zero: bool = False) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < 0 or (value == 0 and not allow_zero):
        raise ArgumentError(OWNER, name, value, "a non-negative number" if allow_zero else "a positive number")


@dataclass
class GRPOConfig:
    """Group-relative policy optimisation: rollouts, the loss and the format warm-up."""

    group_size: int = 16
    """Completions sampled per prompt; at least 2, or every advantage is zero."""
    prompts_per_step: int = 32
    """Prompts per optimizer step on each device."""
    lr: float = 3.0e-4
    """Adam learning rate."""
    kl_coef: float = 0.0
    """Weight of the KL penalty to the frozen initial policy; 0 turns it off."""
    temperature: float = 1.0
    """Sampling temperature of training rollouts."""
    max_new_tokens: int = 4
    """Tokens generated per completion."""
    scale_advantages: bool = True
    """Divide advantages by the group's std (plus a small epsilon)."""
    advantage_std: AdvantageStd = AdvantageStd.SAMPLE
    """sample: the group's sample std (n - 1), as TRL and verl divide by; population: the n-divided one."""
    warmup_steps: int = 150
    """Supervised steps that teach the answer format only (random digits, then end of sequence)."""
    warmup_lr: float = 1.0e-3
    """Learning rate of the format warm-up."""

    def validate(self) -> None:
        """Refuses impossible values (`GRPOModule` and the app's config call it).

        Raises:
            ArgumentError: naming the field, its value and what is accepted.

        Example:
            >>> GRPOConfig(lr=0.0).validate()
            Traceback (most recent call last):
            ...
            areal_lightning.errors.ArgumentError: `GRPOConfig(lr=...)` must be a positive number, got 0.0
        """
        if isinstance(self.group_size, bool) or not isinstance(self.group_size, int) or self.group_size < 2:
            raise ArgumentError(
                OWNER, "group_size", self.group_size, "at least 2 (advantages are relative to the group)"
            )
        _count("prompts_per_step", self.prompts_per_step, 1)
        _number("lr", self.lr)
        _number("kl_coef", self.kl_coef, allow_zero=True)
        _number("temperature", self.temperature)
        _count("max_new_tokens", self.max_new_tokens, 1)
        _count("warmup_steps", self.warmup_steps, 0)
        _number("warmup_lr", self.warmup_lr)
