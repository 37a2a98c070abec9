"""The result cache: a re-run on the same weights is answered without calling `evaluate_fn`,
marked ``cached: true``; anything that changes a result misses: the eval set, an option, the
precision, the seed, ``max_table_rows``, and the code and state of what `evaluate_fn` calls (an
edited ``__call__`` or helper, another attribute, partial argument or closure value). What
cannot be keyed safely is refused."""

from __future__ import annotations

import functools
import importlib.util
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
from callback_helpers import CountingModule, grouped, make_trainer

from areal_lightning.callbacks import EvaluationCallback
from areal_lightning.eval_round import EvalBatch, EvalContext, EvalSet
from areal_lightning.tracking.history import eval_rows, read_history

MAX_STEPS = 4
ROUNDS = 3  # steps 0, 2 and 4


CALLS: list[int] = []
"""Calls of the test's `evaluate_fn`s: a mutable global, which the cache key leaves out (an
instance's attributes are part of the key: a counter there would make every round a miss)."""


@pytest.fixture(autouse=True)
def _no_calls_yet() -> None:
    CALLS.clear()


class CountingEvaluate:
    """An `evaluate_fn` that reports the weight it saw (plus its `offset`)."""

    def __init__(self, offset: float = 0.0) -> None:
        self.offset = offset

    @property
    def count(self) -> int:
        return len(CALLS)

    def __call__(self, module: Any, batches: list[EvalBatch], ctx: EvalContext) -> dict[str, float]:
        if not ctx.sanity:  # the sanity pass is never cached: it runs at every fit
            CALLS.append(1)
        return {"w": float(module.w) + ctx.options.get("offset", 0.0) + self.offset}


def _fit(root: Path, fn: CountingEvaluate, eval_set: EvalSet, **kwargs: Any) -> list[dict[str, Any]]:
    torch.manual_seed(0)  # the same initial Linear weights in every fit
    cb = EvaluationCallback([eval_set], fn, **grouped(freq_steps=2, eval_before_train=True, cache=True, **kwargs))
    make_trainer(root, [cb], MAX_STEPS).fit(CountingModule())
    return eval_rows(read_history(root))


def test_rerun_on_the_same_weights_is_answered_from_the_cache(tmp_path: Path) -> None:
    fn, eval_set = CountingEvaluate(), EvalSet("easy", [0, 1, 2])
    first = _fit(tmp_path, fn, eval_set)
    assert fn.count == 3 and not any(r.get("cached") for r in first)  # steps 0, 2, 4
    second = _fit(tmp_path, fn, eval_set)[len(first) :]
    assert fn.count == 3  # deterministic training: the same weights at every round, nothing evaluated
    assert [r["cached"] for r in second] == [True, True, True]
    assert [r["metrics"] for r in second] == [r["metrics"] for r in first]
    assert (tmp_path / "eval_cache").is_dir()


def test_a_changed_eval_set_option_or_precision_misses(tmp_path: Path) -> None:
    fn = CountingEvaluate()
    _fit(tmp_path, fn, EvalSet("easy", [0, 1, 2]))
    assert fn.count == 3
    rows = _fit(tmp_path, fn, EvalSet("easy", [0, 1, 3]))  # one sample edited
    assert fn.count == 6 and not any(r.get("cached") for r in rows[3:])
    _fit(tmp_path, fn, EvalSet("easy", [0, 1, 2], options={"offset": 1.0}))
    assert fn.count == 9
    _fit(tmp_path, fn, EvalSet("easy", [0, 1, 2]), precision="bf16")
    assert fn.count == 12
    _fit(tmp_path, fn, EvalSet("easy", [0, 1, 2]))  # the first settings again: all cached
    assert fn.count == 12


def test_cache_off_evaluates_every_time(tmp_path: Path) -> None:
    fn = CountingEvaluate()
    for _ in range(2):
        torch.manual_seed(0)
        cb = EvaluationCallback([EvalSet("easy", [0])], fn, schedule={"freq_steps": 2, "eval_before_train": True})
        make_trainer(tmp_path, [cb], MAX_STEPS).fit(CountingModule())
    assert fn.count == 6 and not (tmp_path / "eval_cache").exists()


def _misses(tmp_path: Path, first: Callable[..., Any], second: Callable[..., Any], **second_kwargs: Any) -> list[bool]:
    """`cached` of the second fit's records, after a first fit on the same weights with `first`."""
    eval_set = EvalSet("easy", [0, 1, 2])
    _fit(tmp_path, first, eval_set)  # type: ignore[arg-type]
    again = _fit(tmp_path, first, eval_set)[ROUNDS:]
    assert [r.get("cached") for r in again] == [True] * ROUNDS  # the same settings hit: a miss below has teeth
    return [bool(r.get("cached")) for r in _fit(tmp_path, second, eval_set, **second_kwargs)[2 * ROUNDS :]]


def test_another_seed_or_max_table_rows_misses(tmp_path: Path) -> None:
    fn = CountingEvaluate()
    assert _misses(tmp_path / "seed", fn, fn, seed=7) == [False] * ROUNDS
    assert _misses(tmp_path / "rows", fn, fn, max_table_rows=3) == [False] * ROUNDS


def test_another_attribute_of_a_callable_instance_misses(tmp_path: Path) -> None:
    assert _misses(tmp_path, CountingEvaluate(), CountingEvaluate(offset=1.0)) == [False] * ROUNDS


def _evaluate_with(module: Any, batches: list[EvalBatch], ctx: EvalContext, *, scale: float) -> dict:
    CALLS.append(1)
    return {"w": float(module.w) * scale}


def test_another_partial_argument_or_closure_value_misses(tmp_path: Path) -> None:
    one = functools.partial(_evaluate_with, scale=1.0)
    two = functools.partial(_evaluate_with, scale=2.0)
    assert _misses(tmp_path / "partial", one, two) == [False] * ROUNDS

    def make(scale: float) -> Callable[..., dict]:
        def evaluate(module: Any, batches: list[EvalBatch], ctx: EvalContext) -> dict:
            CALLS.append(1)
            return {"w": float(module.w) * scale}

        return evaluate

    assert _misses(tmp_path / "closure", make(1.0), make(2.0)) == [False] * ROUNDS


USER_MODULE = """
HELPER_SCALE = {scale}
CALLS = []


def helper(w):
    return w * {helper_factor}


class Evaluate:
    def __call__(self, module, batches, ctx):
        CALLS.append(1)
        return {{"w": helper(float(module.w)) {op} HELPER_SCALE}}
"""


def _user_module(path: Path, **code: Any) -> ModuleType:
    """The user's file `user_evaluate.py`, written with `code` and imported afresh (as a new process would)."""
    path.write_text(USER_MODULE.format(**{"scale": 1.0, "helper_factor": 1, "op": "+", **code}))
    spec = importlib.util.spec_from_file_location("user_evaluate", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["user_evaluate"] = module
    # No .pyc: a file rewritten within the same second at the same size would load the old one's.
    dont_write, sys.dont_write_bytecode = sys.dont_write_bytecode, True
    try:
        spec.loader.exec_module(module)
    finally:
        sys.dont_write_bytecode = dont_write
    return module


@pytest.mark.parametrize(
    "edit", [{"op": "*"}, {"helper_factor": 2}, {"scale": 2.0}], ids=["__call__", "helper", "constant"]
)
def test_an_edited_call_or_helper_or_constant_of_the_users_file_misses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, edit: dict[str, Any]
) -> None:
    monkeypatch.delitem(sys.modules, "user_evaluate", raising=False)
    before = _user_module(tmp_path / "user_evaluate.py").Evaluate()
    after = _user_module(tmp_path / "user_evaluate.py", **edit).Evaluate()
    assert type(before).__qualname__ == type(after).__qualname__  # the same name: only the code tells them apart
    assert _misses(tmp_path / "run", before, after) == [False] * ROUNDS


class HoldsALock(CountingEvaluate):
    def __init__(self) -> None:
        super().__init__()
        self.lock = threading.Lock()


def test_an_evaluate_fn_the_cache_cannot_key_is_refused_with_the_way_out() -> None:
    with pytest.raises(ValueError, match=r"rounds=\{'cache': True\}\)` cannot key evaluate_fn: evaluate_fn.lock "
                       r"holds a _thread.lock.*pass cache=False"):  # fmt: skip
        EvaluationCallback([EvalSet("easy", [0])], HoldsALock(), rounds={"cache": True})
    EvaluationCallback([EvalSet("easy", [0])], HoldsALock())  # without the cache nothing needs a key
