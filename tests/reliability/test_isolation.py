"""A round leaves no trace on training: no grad inside, each submodule's own train flag and every
global RNG (torch, Python, NumPy) as they were, also when `evaluate_fn` raises."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from torch import nn

from areal_lightning.eval_round import EvalRoundError, EvalSet, run_round


class _Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(3, 3), nn.Dropout(0.5))
        self.frozen = nn.Linear(3, 3)  # the user keeps it in eval() during training (e.g. a reward head)


def _rng_states() -> tuple:
    return random.getstate(), np.random.get_state(), torch.get_rng_state()


def _same_rng(a: tuple, b: tuple) -> bool:
    (py_a, np_a, torch_a), (py_b, np_b, torch_b) = a, b
    return (
        py_a == py_b
        and all(np.array_equal(x, y) for x, y in zip(np_a[1:3], np_b[1:3], strict=True))
        and np_a[3:] == np_b[3:]
        and torch.equal(torch_a, torch_b)
    )


@pytest.mark.parametrize("raises", [False, True])
def test_round_runs_without_grad_in_eval_mode_and_restores_flags_and_every_rng(raises: bool) -> None:
    model = _Model().train()
    model.frozen.eval()
    seen: dict[str, object] = {}

    def evaluate_fn(module, batches, ctx):
        seen["grad"] = torch.is_grad_enabled()
        seen["training"] = {name: m.training for name, m in module.named_modules()}
        out = module.body(torch.ones(2, 3))
        seen["requires_grad"] = out.requires_grad
        random.random(), np.random.rand(), torch.rand(1)  # user code may draw from any global RNG
        if raises:
            raise RuntimeError("boom")
        return {"score": 1.0}

    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    before = _rng_states()
    sets = [EvalSet("easy", [0, 1, 2])]
    if raises:
        with pytest.raises(EvalRoundError, match="boom"):
            run_round(model, sets, evaluate_fn, seed=0, global_step=0, epoch=0)
    else:
        run_round(model, sets, evaluate_fn, seed=0, global_step=0, epoch=0)
    assert seen["grad"] is False and seen["requires_grad"] is False
    assert set(seen["training"].values()) == {False}  # every submodule in eval(), dropout off
    assert model.training and model.body.training and model.body[1].training
    assert not model.frozen.training  # a submodule the user had in eval() stays there
    assert _same_rng(_rng_states(), before)
    assert torch.is_grad_enabled()


def test_the_rng_check_itself_can_fail() -> None:
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    before = _rng_states()
    for draw in (random.random, np.random.rand, lambda: torch.rand(1)):
        draw()
        assert not _same_rng(_rng_states(), before)
        random.seed(1), np.random.seed(2), torch.manual_seed(3)
