"""The evaluation precision a user writes (YAML int or string, a member) and what it does to a
round: autocast to its dtype inside the block only, nothing at 32, the choices named on a typo."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from areal_lightning.errors import ArgumentError
from areal_lightning.eval_round.precision import EvalPrecision, eval_precision


@pytest.mark.parametrize(
    ("value", "member"),
    [
        (32, EvalPrecision.FP32),
        ("32", EvalPrecision.FP32),
        (16, EvalPrecision.FP16),
        ("16", EvalPrecision.FP16),
        ("bf16", EvalPrecision.BF16),
        (EvalPrecision.BF16, EvalPrecision.BF16),
    ],
)
def test_what_a_config_says_is_parsed_to_its_member(value: Any, member: EvalPrecision) -> None:
    assert EvalPrecision.parse(value) is member


@pytest.mark.parametrize("bad", ["half", "BF16", True, 1, 32.5, None])
def test_anything_else_is_refused_naming_the_choices(bad: Any) -> None:
    with pytest.raises(ArgumentError) as info:
        EvalPrecision.parse(bad)
    assert str(info.value) == f"`EvaluationCallback(precision=...)` must be one of 32, bf16, 16, got {bad!r}"


@pytest.mark.parametrize(
    ("precision", "dtype"), [(EvalPrecision.FP16, torch.float16), (EvalPrecision.BF16, torch.bfloat16)]
)
def test_a_round_autocasts_to_its_dtype_and_training_precision_is_back_after(
    precision: EvalPrecision, dtype: torch.dtype
) -> None:
    layer = torch.nn.Linear(4, 4)
    with eval_precision(layer, precision):
        assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == dtype
        assert layer(torch.ones(1, 4)).dtype == dtype
    assert not torch.is_autocast_enabled("cpu") and layer(torch.ones(1, 4)).dtype == torch.float32
    assert layer.weight.dtype == torch.float32


def test_full_precision_changes_nothing() -> None:
    layer = torch.nn.Linear(4, 4)
    with eval_precision(layer, EvalPrecision.FP32):
        assert not torch.is_autocast_enabled("cpu")
        assert layer(torch.ones(1, 4)).dtype == torch.float32
