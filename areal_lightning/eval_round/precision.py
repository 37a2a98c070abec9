"""Evaluation precision: autocast for the round only, the training precision untouched."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from enum import Enum
from typing import TYPE_CHECKING, Any

from areal_lightning.errors import ArgumentError

if TYPE_CHECKING:  # the Enum is read by the app's config, which must load without torch
    from torch import nn


class EvalPrecision(Enum):
    """``32``: full precision; ``bf16`` / ``16``: autocast to bfloat16 / float16 during evaluation.

    The values are what a YAML file says (``precision: 16`` is an int there, ``bf16`` a string).
    """

    FP32 = 32
    BF16 = "bf16"
    FP16 = 16

    @classmethod
    def parse(cls, value: Any) -> EvalPrecision:
        """A member from itself, its value, or its value as a string (``"16"``, ``"32"``).

        Raises:
            ArgumentError: for anything else, naming the choices.

        Example:
            >>> EvalPrecision.parse("16"), EvalPrecision.parse("bf16")
            (<EvalPrecision.FP16: 16>, <EvalPrecision.BF16: 'bf16'>)
        """
        for member in cls:
            if value is member or (not isinstance(value, bool) and str(value) == str(member.value)):
                return member
        choices = ", ".join(str(m.value) for m in cls)
        raise ArgumentError("EvaluationCallback", "precision", value, f"one of {choices}")


@contextlib.contextmanager
def eval_precision(module: nn.Module, precision: EvalPrecision) -> Iterator[None]:
    """`torch.autocast` on the module's device type at `precision` (nothing for ``32``).

    Example:
        >>> import torch
        >>> layer = torch.nn.Linear(2, 2)
        >>> with eval_precision(layer, EvalPrecision.BF16):
        ...     layer(torch.ones(1, 2)).dtype
        torch.bfloat16
        >>> layer.weight.dtype
        torch.float32
    """
    import torch

    from areal_lightning.eval_round.isolation import module_device

    if precision is EvalPrecision.FP32:
        yield
        return
    dtype = {EvalPrecision.BF16: torch.bfloat16, EvalPrecision.FP16: torch.float16}[precision]
    with torch.autocast(device_type=module_device(module).type, dtype=dtype):
        yield
