"""What an async evaluation tells a user without starting a worker: why a worker died (and the
missing main guard that usually causes exit code 1), which strategies are refused and why, and
the default `evaluate_fn` (the module's own `evaluate`)."""

from __future__ import annotations

from typing import Any

import pytest
from lightning.pytorch.strategies import DDPStrategy, FSDPStrategy, ModelParallelStrategy, SingleDeviceStrategy

from areal_lightning.callbacks.async_evaluator import _exit_message, module_evaluate
from areal_lightning.callbacks.parallelism import refuse_for_async as refuse_sharded


def test_a_killed_worker_is_named_with_its_exit_code() -> None:
    assert _exit_message(-9) == (
        "the worker process exited with code -9 (killed, out of memory, or os._exit) before it returned a result"
    )
    assert _exit_message(None).startswith("the worker process exited with code None ")


def test_exit_code_one_points_at_the_missing_main_guard() -> None:
    assert _exit_message(1) == (
        "the worker process exited with code 1 (killed, out of memory, or os._exit) before it returned a result"
        "; its traceback is on stderr. A script that starts training when imported (no "
        '`if __name__ == "__main__":` guard) does this: the worker process imports the '
        "script's module, as DataLoader workers do"
    )
    assert "__main__" not in _exit_message(2)


def test_a_worker_that_could_not_be_started_shows_why() -> None:
    assert _exit_message(None, "Traceback ...\nOSError: no fork server") == (
        "the worker process could not be started:\nTraceback ...\nOSError: no fork server"
    )


class MyFSDP(FSDPStrategy):
    """A user's subclass of a sharded strategy is sharded too."""


@pytest.mark.parametrize("strategy", [FSDPStrategy(), ModelParallelStrategy(), MyFSDP()])
def test_sharded_strategies_are_refused_naming_the_strategy_and_the_ways_out(strategy: Any) -> None:
    with pytest.raises(ValueError) as info:
        refuse_sharded(strategy)
    assert str(info.value) == (
        f"`EvaluationCallback(mode='async')` does not support {type(strategy).__name__}: its parameters are "
        "sharded over the ranks, and the worker needs whole weights to evaluate a snapshot. Use mode='sync' "
        "(every rank runs the same forwards) or an unsharded strategy (ddp)."
    )


@pytest.mark.parametrize("strategy", [DDPStrategy(), SingleDeviceStrategy("cpu"), object()])
def test_strategies_with_whole_weights_are_accepted(strategy: Any) -> None:
    assert refuse_sharded(strategy) is None


class Evaluates:
    def evaluate(self, batches: list[int], ctx: str) -> dict[str, Any]:
        return {"batches": batches, "ctx": ctx}


def test_the_default_evaluate_fn_is_the_modules_own_evaluate() -> None:
    assert module_evaluate(Evaluates(), [1, 2], "ctx") == {"batches": [1, 2], "ctx": "ctx"}
