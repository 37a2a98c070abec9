"""Async rounds of an `evaluate_fn` that waits on other machines (``async_in_thread``, as the server
engine's): they run in a thread of the training process on a copy of the weights, no worker
process starts, training goes on while a round waits, and the records are those of a worker's
rounds (or of sync rounds) at the same steps.

The "server" here is the gate file of test_async_eval: the round of step 4 waits until training
reached step 9, which it can only do if training is not waiting for the round.
"""

from __future__ import annotations

import multiprocessing
import threading
from pathlib import Path
from typing import Any

import pytest
from callback_helpers import QUIET_WARNINGS, CountingModule, make_trainer, metric_by_step, probe_weights
from test_async_eval import GateWriter, _gated_set, gated_probe

from areal_lightning.callbacks.evaluation_callback import EvaluationCallback
from areal_lightning.callbacks.runners import AsyncRunner
from areal_lightning.eval_round import EvalRoundError
from areal_lightning.tracking.history import eval_rows, event_rows, read_history

pytestmark = [pytest.mark.filterwarnings(w) for w in QUIET_WARNINGS]

WORKER_NAME = "areal-lightning-async-eval"


class WaitsOnServers:
    """An evaluate_fn that waits on something outside (the gate), and says so; it notes where it ran."""

    async_in_thread = True

    def __init__(self, fail_at: int | None = None) -> None:
        self.fail_at = fail_at
        self.seen: list[tuple[str, list[str]]] = []  # (thread, child processes) of each call, in this process

    def __call__(self, module: Any, batches: Any, ctx: Any) -> dict[str, Any]:
        children = [p.name for p in multiprocessing.active_children()]
        self.seen.append((threading.current_thread().name, children))
        if ctx.global_step == self.fail_at:
            raise ConnectionError(f"every server refused the round of step {ctx.global_step}")
        if "gate" in ctx.options:
            return gated_probe(module, batches, ctx)
        return probe_weights(module, batches, ctx)


def test_rounds_that_wait_on_servers_run_in_a_thread_while_training_goes_on(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    evaluate_fn = WaitsOnServers()
    callback = EvaluationCallback(
        _gated_set(gate, gate_step=4, open_at=9), evaluate_fn, schedule={"freq_steps": 4}, execution={"mode": "async"}
    )
    make_trainer(tmp_path, [GateWriter(gate), callback], 10).fit(CountingModule(epoch_len=5))
    rows = eval_rows(read_history(tmp_path))
    assert [(r["step"], r["trigger"], r["mode"]) for r in rows] == [(4, ["steps"], "async"), (10, ["end"], "async")]
    # Each round saw its snapshot's weights, although training changed the module meanwhile.
    assert metric_by_step(tmp_path, "w") == [(4, 4.0), (10, 10.0)]
    assert 5 <= rows[0]["lag_steps"] <= 6  # the round of step 4 waited until training reached step 9
    skipped = event_rows(read_history(tmp_path), "skipped")
    assert [(e["step"], e["running_step"]) for e in skipped] == [(8, 4)]
    assert skipped[0]["run_id"] == rows[0]["run_id"] == callback.run_id  # the event is the run's own
    # The sanity pass runs on the training thread; every round in the evaluating thread, in this
    # process (`seen` is this process's list), with no worker process started.
    rounds = evaluate_fn.seen[1:]
    assert len(rounds) == 2 and {thread for thread, _ in rounds} == {WORKER_NAME}
    assert all(WORKER_NAME not in children for _, children in evaluate_fn.seen)
    assert isinstance(callback.runner, AsyncRunner) and type(callback.runner.evaluator).__name__ == "ThreadEvaluator"


def test_thread_rounds_record_what_sync_rounds_record(tmp_path: Path) -> None:
    def fit(mode: str) -> list[tuple[int, float]]:
        root = tmp_path / mode
        callback = EvaluationCallback(
            {"probe": [1, 2, 3]},
            WaitsOnServers(),
            schedule={"freq_steps": 3, "eval_before_train": True},
            execution={"mode": mode, "on_busy": "wait"},
        )
        make_trainer(root, [callback], 7).fit(CountingModule(epoch_len=5))
        return metric_by_step(root, "w") + metric_by_step(root, "sample_value")

    assert fit("async") == fit("sync")


def test_a_failing_thread_round_is_an_error_with_its_traceback_and_the_next_round_runs(tmp_path: Path) -> None:
    callback = EvaluationCallback(
        {"probe": [1, 2, 3]},
        WaitsOnServers(fail_at=4),
        schedule={"freq_steps": 2},
        execution={"mode": "async", "on_busy": "wait"},
    )
    make_trainer(tmp_path, [callback], 8).fit(CountingModule(epoch_len=5))
    errors = event_rows(read_history(tmp_path), "error")
    assert [e["step"] for e in errors] == [4]
    assert "ConnectionError: every server refused the round of step 4" in errors[0]["message"]
    assert "in __call__" in errors[0]["message"]  # the thread's own traceback
    assert metric_by_step(tmp_path, "w") == [(2, 2.0), (6, 6.0), (8, 8.0)]


def test_on_error_raise_stops_training_with_the_thread_rounds_error(tmp_path: Path) -> None:
    callback = EvaluationCallback(
        {"probe": [1, 2, 3]},
        WaitsOnServers(fail_at=2),
        schedule={"freq_steps": 2},
        execution={"mode": "async", "on_busy": "wait"},
        rounds={"on_error": "raise"},
    )
    with pytest.raises(EvalRoundError, match="every server refused the round of step 2"):
        make_trainer(tmp_path, [callback], 8).fit(CountingModule(epoch_len=5))
