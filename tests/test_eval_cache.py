"""The result cache: a re-run on the same weights is answered without calling `evaluate_fn`,
marked ``cached: true``; a changed eval set, option or precision misses."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from callback_helpers import CountingModule, grouped, make_trainer

from areal_lightning.callbacks import EvaluationCallback
from areal_lightning.eval_round import EvalBatch, EvalContext, EvalSet
from areal_lightning.tracking.history import eval_rows, read_history

MAX_STEPS = 4


class CountingEvaluate:
    """An `evaluate_fn` that counts its calls and reports the weight it saw."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, module: Any, batches: list[EvalBatch], ctx: EvalContext) -> dict[str, float]:
        self.calls += 1
        return {"w": float(module.w) + ctx.options.get("offset", 0.0)}


def _fit(root: Path, fn: CountingEvaluate, eval_set: EvalSet, **kwargs: Any) -> list[dict[str, Any]]:
    torch.manual_seed(0)  # the same initial Linear weights in every fit
    cb = EvaluationCallback([eval_set], fn, **grouped(freq_steps=2, eval_before_train=True, cache=True, **kwargs))
    make_trainer(root, [cb], MAX_STEPS).fit(CountingModule())
    return eval_rows(read_history(root))


def test_rerun_on_the_same_weights_is_answered_from_the_cache(tmp_path: Path) -> None:
    fn, eval_set = CountingEvaluate(), EvalSet("easy", [0, 1, 2])
    first = _fit(tmp_path, fn, eval_set)
    assert fn.calls == 3 and not any(r.get("cached") for r in first)  # steps 0, 2, 4
    second = _fit(tmp_path, fn, eval_set)[len(first) :]
    assert fn.calls == 3  # deterministic training: the same weights at every round, nothing evaluated
    assert [r["cached"] for r in second] == [True, True, True]
    assert [r["metrics"] for r in second] == [r["metrics"] for r in first]
    assert (tmp_path / "eval_cache").is_dir()


def test_a_changed_eval_set_option_or_precision_misses(tmp_path: Path) -> None:
    fn = CountingEvaluate()
    _fit(tmp_path, fn, EvalSet("easy", [0, 1, 2]))
    assert fn.calls == 3
    rows = _fit(tmp_path, fn, EvalSet("easy", [0, 1, 3]))  # one sample edited
    assert fn.calls == 6 and not any(r.get("cached") for r in rows[3:])
    _fit(tmp_path, fn, EvalSet("easy", [0, 1, 2], options={"offset": 1.0}))
    assert fn.calls == 9
    _fit(tmp_path, fn, EvalSet("easy", [0, 1, 2]), precision="bf16")
    assert fn.calls == 12
    _fit(tmp_path, fn, EvalSet("easy", [0, 1, 2]))  # the first settings again: all cached
    assert fn.calls == 12


def test_cache_off_evaluates_every_time(tmp_path: Path) -> None:
    fn = CountingEvaluate()
    for _ in range(2):
        torch.manual_seed(0)
        cb = EvaluationCallback([EvalSet("easy", [0])], fn, schedule={"freq_steps": 2, "eval_before_train": True})
        make_trainer(tmp_path, [cb], MAX_STEPS).fit(CountingModule())
    assert fn.calls == 6 and not (tmp_path / "eval_cache").exists()
