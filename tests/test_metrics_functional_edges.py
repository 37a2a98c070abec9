"""Edges of the functional metrics a user can hit: advantages keep the rewards' float dtype and
are computed in float64 whatever it is, eps must be a finite non-negative number (not True, not
inf), an empty group is a bool "zero std", and maj@k names the argument of the wrong shape."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch

from areal_lightning.metrics.functional import group_advantages, maj_at_k, maj_at_k_per_prompt, zero_std_groups


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.float64])
def test_advantages_keep_the_rewards_float_dtype(dtype: torch.dtype) -> None:
    assert group_advantages(torch.tensor([[0.0, 1.0], [1.0, 1.0]], dtype=dtype)).dtype == dtype


def test_advantages_of_float32_rewards_are_computed_in_float64() -> None:
    # A large common offset: a float32 mean would lose the rewards' spread in rounding.
    rng = np.random.default_rng(0)
    spread = rng.random((8, 16))
    rewards = torch.tensor(spread + 3e4, dtype=torch.float32)
    exact = group_advantages(rewards.to(torch.float64) - 3e4)  # the same float32 values, shifted exactly
    assert torch.allclose(group_advantages(rewards).to(torch.float64), exact, rtol=0, atol=2e-6)


@pytest.mark.parametrize("bad", [True, math.inf, -0.5, "0.1", None])
def test_eps_must_be_a_finite_non_negative_number(bad: Any) -> None:
    with pytest.raises(ValueError) as info:
        group_advantages(torch.zeros(1, 2), eps=bad)
    assert str(info.value) == f"`group_advantages(eps=...)` must be a finite number >= 0, got {bad!r}"


def test_eps_at_its_limits_is_accepted() -> None:
    half = 1 / math.sqrt(2)  # [0, 2]: mean 1, sample std sqrt(2)
    assert torch.allclose(group_advantages(torch.tensor([[0.0, 2.0]]), eps=0), torch.tensor([[-half, half]]))


def test_empty_groups_are_zero_std_as_booleans() -> None:
    flags = zero_std_groups(torch.zeros(3, 0))
    assert flags.dtype == torch.bool and flags.tolist() == [True, True, True]


@pytest.mark.parametrize("fn", [maj_at_k, maj_at_k_per_prompt])
def test_maj_at_k_names_a_correct_tensor_of_the_wrong_shape(fn: Any) -> None:
    with pytest.raises(ValueError) as info:
        fn(torch.tensor([[1, 2]]), torch.tensor([1, 0]), k=2)
    assert str(info.value) == (
        f"`{fn.__name__}(correct=...)` must be a 2-D tensor [P, n] (prompts x samples), got shape (2,)"
    )


def test_a_nan_reward_under_the_error_strategy_says_every_way_out() -> None:
    from areal_lightning.metrics.reward import RewardMetric

    with pytest.raises(ValueError) as info:
        RewardMetric(nan_strategy="error").update(torch.tensor([1.0, math.nan]))
    assert str(info.value) == (
        "`RewardMetric.update(rewards=...)` got 1 NaN value(s) out of 2 with nan_strategy='error'; pass "
        "nan_strategy='ignore' (or 'warn') to drop them, or a float such as 0.0 to replace them"
    )
