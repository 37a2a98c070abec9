"""Evaluation that leaves no trace: eval mode and no grad inside, train flags and RNG states restored after."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from lightning.pytorch.utilities.seed import isolate_rng
from torch import nn


@contextlib.contextmanager
def evaluation_mode(module: nn.Module) -> Iterator[None]:
    """`eval()` and `no_grad()` for the round; afterwards each submodule's train flag and the
    global RNG states (torch CPU and CUDA, NumPy, Python) are as they were.

    Lightning's `isolate_rng` restores the RNG states only when its block exits normally, so the
    caller must catch exceptions inside this block (the round does) for the states to come back.

    Example:
        >>> layer = nn.Linear(2, 2)
        >>> with evaluation_mode(layer):
        ...     layer.training, torch.is_grad_enabled()
        (False, False)
        >>> layer.training
        True
    """
    modes = {m: m.training for m in module.modules()}
    module.eval()
    try:
        with torch.no_grad(), isolate_rng(include_cuda=torch.cuda.is_available()):
            yield
    finally:
        for m, was_training in modes.items():
            m.train(was_training)


def module_device(module: nn.Module) -> torch.device:
    """The device of the module's first parameter; CPU for a module without parameters."""
    param = next(module.parameters(), None)
    return param.device if param is not None else torch.device("cpu")
