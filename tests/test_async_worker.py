"""The async worker's life, driven through `AsyncEvaluator` without a Trainer: a tiny module, a real
spawned worker process and one eval set.

What a user of `mode="async"` notices: a worker round gives the numbers a sync round gives for the
same weights and step; the next round sees the new weights; a worker that dies becomes an error
naming its exit code and the next round gets a fresh worker; Ctrl-C (`close(cancel=True)`) ends a
running round at once and leaves no process; a plain close lets a running round finish; the
training's torch threads are lent to the worker while it starts and evaluates and given back
after; a snapshot over the bound and an `evaluate_fn` that does not pickle are refused before a
worker starts, with messages naming what to change.

A worker start imports torch (seconds), so the tests that only submit rounds share one worker.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from procs import run_in_group
from torch import nn

from areal_lightning.callbacks.async_evaluator import AsyncEvaluator
from areal_lightning.errors import ArgumentError
from areal_lightning.eval_round import (
    EvalBatch,
    EvalContext,
    EvalRoundError,
    EvalSet,
    LocalSetResult,
    evaluate_local,
    reduce_set,
)
from areal_lightning.eval_round.precision import EvalPrecision, eval_precision

WORKER_NAME = "areal-lightning-async-eval"
SEED = 11
SAMPLES = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]
WAIT_S = 60.0  # a worker start on a loaded 2-core box takes seconds; past this the test failed
HOLD_S = 3.0  # how long a held round sleeps before it finishes (shorter than the evaluator's 10 s join)
MIB = 2**20
UNPICKLABLE_STEP = 7

# A round that never comes back fails its test instead of hanging the suite.
pytestmark = pytest.mark.timeout(2 * WAIT_S)


class Weights(nn.Module):
    """A scalar `w` the test sets (it stands for the training step) and a layer that uses it."""

    def __init__(self, size: int = 0) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.zeros(()))
        self.layer = nn.Linear(2, 2)
        # Never filled: a forked test process must not run a parallel op (see `sync_local`).
        self.extra = nn.Parameter(torch.empty(size)) if size else None

    def set(self, value: float) -> None:
        with torch.no_grad():
            self.w.fill_(value)
            self.layer.weight.copy_(torch.arange(4, dtype=torch.float32).reshape(2, 2) / 7 + value)
            self.layer.bias.fill_(value / 3)


def weighted(module: Any, batches: Sequence[EvalBatch], ctx: EvalContext) -> dict[str, Any]:
    """Numbers that depend on the weights, the step, the epoch, the rank's deal, the seed and each sample's,
    the precision and the table rows; a round at `options["hold_step"]` writes the worker's pid and
    sleeps `HOLD_S` first, then writes `finished`."""
    hold = ctx.options.get("hold_step")
    if hold is not None and ctx.global_step == hold:
        folder = Path(ctx.options["folder"])
        (folder / "pid.tmp").write_text(str(os.getpid()))
        (folder / "pid.tmp").replace(folder / "pid")
        time.sleep(HOLD_S)
        (folder / "finished").write_text("")
    values = []
    for batch in batches:
        for index, sample, seed in zip(batch.indices, batch.samples, batch.seeds, strict=True):
            noise = torch.rand(2, generator=torch.Generator().manual_seed(seed))
            out = module.layer(noise * sample) * module.w
            values.append(out.sum().double())
            ctx.record_sample(index, sample=sample, seed=seed)
    if ctx.global_step == UNPICKLABLE_STEP:
        ctx.record_sample(0, how=lambda: None)  # a table row that cannot travel back from the worker
    return {
        "w": float(module.w),
        "value": torch.stack(values) if values else torch.zeros(0, dtype=torch.float64),
        "step": float(ctx.global_step),
        "epoch": float(ctx.epoch),
        "deal": float(ctx.rank * 10 + ctx.world_size),
        "seed": float(ctx.seed),  # the run's seed, which an evaluate_fn may draw its sampling from
        "bf16": float((torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.bfloat16),
    }


def _sample_cost(sample: float) -> float:
    """The later the cheaper: dealt by these costs, rank 1 of 2 gets samples 6, 5 and 0; dealt as
    if every sample cost the same (a worker dealing again without the cost function), 2, 3 and 6."""
    return 1.0 / sample


# Lambda cost and key functions: the deal is computed in the training process, so they never travel.
EVAL_SET = EvalSet("probe", SAMPLES, batch_size=2, cost_fn=lambda s: _sample_cost(s), key_fn=lambda s: f"{s:.1f}")
DEAL: dict[str, Any] = {"seed": SEED, "rank": 1, "world_size": 2, "max_table_rows": 4}


def sync_local(module: nn.Module, step: int, epoch: int) -> Any:
    """What a sync round computes on this rank's deal at these weights and step (bf16), before the
    reduction over ranks (rank 1's half cannot be reduced alone).

    On one torch thread: a test process forked from one that ran torch's thread pool (mutation
    testing forks so) can wait forever for that pool in its first parallel op.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with eval_precision(module, EvalPrecision.BF16):
            return view(evaluate_local(module, EVAL_SET, weighted, global_step=step, epoch=epoch, **DEAL))
    finally:
        torch.set_num_threads(threads)


def view(local: LocalSetResult) -> dict[str, Any]:
    """Everything of one rank's result that the reduction reads, as plain values."""
    return {
        "dataset": local.dataset,
        "report": local.report,
        "updates": {k: v.tolist() for k, v in local.updates.items()},
        "metrics": sorted(local.metrics),
        "outcomes": local.outcomes,
        "sampling": local.sampling,
    }


def _wait(condition: Any, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"{what} did not happen within {WAIT_S} s"
        time.sleep(0.01)


def _wait_started(evaluator: AsyncEvaluator, threads: int) -> None:
    """Polls as training does each step until the worker has started: training has `threads` again."""

    def started() -> bool:
        evaluator.poll_start()
        return torch.get_num_threads() == threads

    _wait(started, "the worker start")


def _workers(others: Sequence[Any] = ()) -> list[Any]:
    """The live async workers, but `others` (the shared worker of the other tests)."""
    return [p for p in multiprocessing.active_children() if p.name == WORKER_NAME and p not in others]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _read_pid(folder: Path) -> int:
    _wait((folder / "pid").exists, "the held round")
    return int((folder / "pid").read_text())


@pytest.fixture
def threads() -> Iterator[int]:
    """The training's torch threads for the test (4), restored after it."""
    before = torch.get_num_threads()
    torch.set_num_threads(4)
    yield 4
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def shared() -> Iterator[tuple[AsyncEvaluator, Weights]]:
    """One started worker (bf16, rank 1 of 2) for the tests that only submit rounds to it."""
    before = torch.get_num_threads()
    torch.set_num_threads(3)
    evaluator, module = AsyncEvaluator(threads=1), Weights()
    evaluator.start(module, [EVAL_SET], weighted, precision=EvalPrecision.BF16, **DEAL)
    try:
        _wait_started(evaluator, 3)
        torch.set_num_threads(before)
        yield evaluator, module
    finally:
        torch.set_num_threads(before)
        evaluator.close(cancel=True)


def _round(evaluator: AsyncEvaluator, module: nn.Module, step: int, epoch: int = 0) -> dict[str, Any]:
    evaluator.submit(module, step, epoch, ["steps"])
    _, local = evaluator.collect([EVAL_SET])
    return view(local[0])


@pytest.mark.process
def test_a_worker_round_reports_what_a_sync_round_reports_for_the_same_weights(
    shared: tuple[AsyncEvaluator, Weights], caplog: pytest.LogCaptureFixture
) -> None:
    evaluator, module = shared
    assert all(p.requires_grad for p in module.parameters())  # the replica is a copy: training still trains
    module.set(1.5)
    caplog.set_level(logging.DEBUG, logger="areal_lightning.callbacks.async_evaluator")
    before = time.perf_counter()
    snapshot = evaluator.submit(module, 3, 2, ["steps", "epochs"])
    took = time.perf_counter() - before
    assert (snapshot.step, snapshot.epoch, snapshot.causes) == (3, 2, ["steps", "epochs"])
    assert 0 <= snapshot.copy_secs <= took  # the copy is part of the submit
    [logged] = [r.getMessage() for r in caplog.records if r.name.endswith("async_evaluator")]
    assert logged == f"async round for step 3 submitted: 0.00 MiB snapshot copied in {snapshot.copy_secs:.4f} s"
    assert snapshot.mib == evaluator.snapshot_mib == sum(p.numel() * 4 for p in module.parameters()) / MIB
    module.set(99.0)  # training moves on while the round runs: the worker has its own copy
    returned, local = evaluator.collect([EVAL_SET])
    assert returned == snapshot and evaluator.in_flight is None
    module.set(1.5)
    result = view(local[0])
    assert result == sync_local(module, 3, 2)
    assert result["report"].error is None and result["report"].num_prompts == 3  # rank 1's deal of 7
    updates = result["updates"]
    assert updates["w"] == [1.5] * 3 and updates["step"] == [3.0] * 3 and updates["epoch"] == [2.0] * 3
    assert updates["deal"] == [12.0] * 3 and updates["bf16"] == [1.0] * 3 and updates["seed"] == [SEED] * 3
    assert [row["index"] for row in result["report"].table_rows] == [0]  # of 6, 5, 0: below max_table_rows=4


@pytest.mark.process
def test_each_round_sees_the_weights_submitted_with_it(shared: tuple[AsyncEvaluator, Weights]) -> None:
    evaluator, module = shared
    seen = []
    for step in (4, 5):
        module.set(float(step))
        seen.append(_round(evaluator, module, step))
        assert seen[-1] == sync_local(module, step, 0)
    assert [r["updates"]["w"][0] for r in seen] == [4.0, 5.0]


@pytest.mark.process
def test_a_worker_on_another_device_evaluates_its_own_copy_loaded_with_each_rounds_weights() -> None:
    """A worker on another device than training's (`async_device="cuda:1"` beside a CPU or
    `cuda:0` run) cannot read the shared snapshot in place: it evaluates its own copy, loaded from
    the snapshot before each round. "cpu:0" is not the string "cpu", so it takes that path here."""
    evaluator, module = AsyncEvaluator(device="cpu:0", threads=1), Weights()
    evaluator.start(module, [EVAL_SET], weighted, precision=EvalPrecision.BF16, **DEAL)
    try:
        for step in (4, 5):  # the first round waits for the worker to start
            module.set(float(step))
            assert _round(evaluator, module, step) == sync_local(module, step, 0)
    finally:
        evaluator.close(cancel=True)


def on_meta(module: Any, batches: Sequence[EvalBatch], ctx: EvalContext) -> dict[str, Any]:
    """1.0 when the module evaluates on the meta device, else 0.0 (meta tensors hold no values to read)."""
    return {"on_meta": float(module.w.is_meta)}


@pytest.mark.process
def test_a_worker_on_another_device_evaluates_on_that_device() -> None:
    """The device a worker is given is where its copy evaluates. `meta` stands in for a GPU here:
    a module moved there says so, and a CPU device string would not tell a copy left on the CPU.
    A user cannot pass `meta` (the options' check refuses it): the test sets it after that check."""
    evaluator, module = AsyncEvaluator(device="cpu:0", threads=1), Weights()
    evaluator.device = "meta"
    evaluator.start(module, [EVAL_SET], on_meta, **DEAL)
    try:
        result = _round(evaluator, module, 1)
        assert result["report"].error is None and result["updates"]["on_meta"] == [1.0] * 3  # rank 1 of 2: 3 prompts
    finally:
        evaluator.close(cancel=True)


@pytest.mark.process
def test_a_round_whose_result_does_not_pickle_is_an_error_with_the_workers_traceback(
    shared: tuple[AsyncEvaluator, Weights],
) -> None:
    evaluator, module = shared
    evaluator.submit(module, UNPICKLABLE_STEP, 0, ["steps"])
    with pytest.raises(AssertionError, match=r"^one round in flight at most$"):
        evaluator.submit(module, UNPICKLABLE_STEP + 1, 0, ["steps"])
    snapshot, local = evaluator.collect([EVAL_SET])
    assert snapshot.step == UNPICKLABLE_STEP and len(local) == 1
    error = str(local[0].report.error)
    assert error.startswith(f"async evaluation worker failed on the weights of step {UNPICKLABLE_STEP}:\nTraceback")
    assert "conn.send" in error and "pickle" in error
    with pytest.raises(AssertionError, match=r"^no round in flight$"):
        evaluator.collect([EVAL_SET])
    module.set(8.0)  # the worker goes on with the next round
    assert _round(evaluator, module, 8) == sync_local(module, 8, 0)


@pytest.mark.process
def test_training_lends_the_worker_its_threads_for_a_round_and_gets_them_back(
    shared: tuple[AsyncEvaluator, Weights], threads: int
) -> None:
    evaluator, module = shared
    assert not evaluator.ready()  # no round in flight
    evaluator.submit(module, 6, 0, ["steps"])
    assert torch.get_num_threads() == threads - 1  # the worker evaluates on one of them
    _wait(evaluator.ready, "the round")
    assert torch.get_num_threads() == threads  # back as soon as the result is there
    evaluator.collect([EVAL_SET])
    assert torch.get_num_threads() == threads
    evaluator.poll_start()  # the worker started long ago: nothing to take back
    assert torch.get_num_threads() == threads


@pytest.mark.process
def test_a_worker_killed_in_a_round_is_an_error_naming_its_exit_code_and_the_next_round_gets_a_new_worker(
    tmp_path: Path, threads: int
) -> None:
    others = _workers()
    eval_set = EvalSet("probe", SAMPLES, options={"hold_step": 1, "folder": str(tmp_path)})
    evaluator, module = AsyncEvaluator(threads=1), Weights()
    evaluator.start(module, [eval_set], weighted, seed=SEED, rank=0, world_size=1, max_table_rows=0)
    try:
        evaluator.submit(module, 1, 0, ["steps"])
        pid = _read_pid(tmp_path)
        os.kill(pid, signal.SIGKILL)
        _wait(evaluator.ready, "the dead worker's report")
        snapshot, local = evaluator.collect([eval_set])
        assert snapshot.step == 1
        with pytest.raises(EvalRoundError) as info:
            reduce_set(local[0], eval_set)
        assert str(info.value) == (
            "evaluation of eval set 'probe' failed: async evaluation worker failed on the weights of step 1:\n"
            "the worker process exited with code -9 (killed, out of memory, or os._exit) before it returned a result"
        )
        assert not _alive(pid) and _workers(others) == []
        module.set(2.0)
        evaluator.submit(module, 2, 0, ["steps"])
        _, local = evaluator.collect([eval_set])
        assert reduce_set(local[0], eval_set).metrics["w"] == 2.0
        assert [p.pid for p in _workers(others)] != [pid] and len(_workers(others)) == 1
        # The first round was submitted while the worker started: lent once, given back in full.
        assert torch.get_num_threads() == threads
    finally:
        evaluator.close(cancel=True)
    assert _workers(others) == []


@pytest.mark.process
def test_cancel_ends_a_running_round_at_once_and_gives_the_threads_back(tmp_path: Path, threads: int) -> None:
    others = _workers()
    eval_set = EvalSet("probe", SAMPLES, options={"hold_step": 1, "folder": str(tmp_path)})
    # The worker asks for all of training's threads: training keeps one.
    evaluator, module = AsyncEvaluator(threads=threads), Weights()
    evaluator.start(module, [eval_set], weighted, seed=SEED, rank=0, world_size=1, max_table_rows=0)
    try:
        assert torch.get_num_threads() == 1  # lent while the worker imports torch
        _wait_started(evaluator, threads)
        evaluator.submit(module, 1, 0, ["steps"])
        assert torch.get_num_threads() == 1
        pid = _read_pid(tmp_path)
        assert not evaluator.ready()  # the round sleeps HOLD_S: not done, and asking does not wait
        [worker] = _workers(others)
    finally:
        evaluator.close(cancel=True)  # what Ctrl-C and on_error do
    assert worker.exitcode == -signal.SIGTERM  # terminated, not asked to finish
    assert not (tmp_path / "finished").exists()  # the round never finished (it had HOLD_S to go)
    assert not _alive(pid) and _workers(others) == []
    assert torch.get_num_threads() == threads
    assert evaluator.in_flight is None
    evaluator.close(cancel=True)  # again: nothing left to do


@pytest.mark.process
@pytest.mark.waits  # the held round
def test_close_lets_a_running_round_finish_and_ends_an_idle_worker_at_once(tmp_path: Path) -> None:
    others = _workers()
    eval_set = EvalSet("probe", SAMPLES, options={"hold_step": 1, "folder": str(tmp_path)})
    evaluator, module = AsyncEvaluator(threads=1), Weights()
    evaluator.start(module, [eval_set], weighted, seed=SEED, rank=0, world_size=1, max_table_rows=0)
    try:
        evaluator.submit(module, 1, 0, ["steps"])
        _read_pid(tmp_path)
        [busy] = _workers(others)
    finally:
        evaluator.close()  # the end of fit
    assert (tmp_path / "finished").exists()  # the round was let finish
    assert busy.exitcode is not None and _workers(others) == []

    evaluator.submit(module, 2, 0, ["steps"])  # a new worker takes the next round
    _, local = evaluator.collect([eval_set])
    assert reduce_set(local[0], eval_set).metrics["step"] == 2.0
    [idle] = _workers(others)
    closer = threading.Thread(target=evaluator.close)
    closer.start()
    closer.join(WAIT_S)
    assert not closer.is_alive()
    assert idle.exitcode == -signal.SIGTERM  # idle: terminated, not waited for
    assert _workers(others) == []


def test_a_snapshot_over_the_bound_is_refused_naming_its_size_before_a_worker_starts(threads: int) -> None:
    others = _workers()
    module = Weights(size=3 * MIB // 8 - 7)  # 1.5 MiB of float32 with w and the layer (7 numbers)
    size = sum(p.numel() * 4 for p in module.parameters()) / MIB
    assert size == 1.5
    with pytest.raises(ValueError) as info:
        AsyncEvaluator(max_snapshot_mib=1.4).start(
            module, [EVAL_SET], weighted, seed=0, rank=0, world_size=1, max_table_rows=0
        )
    assert str(info.value) == (
        "async evaluation needs a 1.5 MiB snapshot of Weights's weights, more than max_snapshot_mib=1.4; raise "
        "max_snapshot_mib (evaluator.execution.max_snapshot_mib) if the memory is there, or use mode='sync'"
    )
    # At the bound it is accepted: the next check (pickling) is the one that fails here.
    small = Weights()
    at_bound = sum(p.numel() * 4 for p in small.parameters()) / MIB
    with pytest.raises(ValueError, match="must pickle"):
        AsyncEvaluator(max_snapshot_mib=at_bound).start(
            small, [EVAL_SET], lambda m, b, c: {}, seed=0, rank=0, world_size=1, max_table_rows=0
        )
    assert _workers(others) == [] and torch.get_num_threads() == threads


def test_an_evaluate_fn_that_does_not_pickle_is_refused_naming_the_fix(threads: int) -> None:
    others = _workers()
    evaluator = AsyncEvaluator(max_snapshot_mib=None)
    with pytest.raises(ValueError) as info:
        evaluator.start(Weights(), [EVAL_SET], lambda m, b, c: {}, seed=0, rank=0, world_size=1, max_table_rows=0)
    message = str(info.value)
    assert message.startswith(
        "mode='async' evaluates in a worker process, so the module, evaluate_fn and the eval sets' samples must "
        "pickle, and they do not: AttributeError: Can't pickle local object "
    )
    assert "<lambda>" in message
    assert message.endswith(". Define evaluate_fn at module level, or use mode='sync'")
    assert _workers(others) == [] and torch.get_num_threads() == threads  # nothing started, nothing lent
    evaluator.close()  # nothing to end
    assert torch.get_num_threads() == threads


class NoWeights(nn.Module):
    """A module without parameters or buffers (its `evaluate_fn` needs no weights)."""


@pytest.mark.process
def test_a_module_without_weights_is_evaluated_on_the_cpu(threads: int) -> None:
    others = _workers()
    with pytest.raises(ValueError, match="must pickle"):  # the device is decided before pickling
        AsyncEvaluator().start(
            NoWeights(), [EVAL_SET], lambda m, b, c: {}, seed=0, rank=0, world_size=1, max_table_rows=0
        )
    evaluator = AsyncEvaluator(threads=1)
    evaluator.start(NoWeights(), [EVAL_SET], weighted, seed=0, rank=0, world_size=1, max_table_rows=0)
    try:
        assert evaluator.snapshot_mib == 0.0
        assert torch.get_num_threads() == threads - 1  # a CPU worker: training lends it a thread
    finally:
        evaluator.close(cancel=True)
    assert torch.get_num_threads() == threads and _workers(others) == []


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"device": "gpu"},
            "`EvaluationCallback(async_device=...)` must be a device string (cpu, cuda:1) or None, got 'gpu'",
        ),
        ({"threads": 0}, "`EvaluationCallback(async_threads=...)` must be a positive integer, got 0"),
        (
            {"max_snapshot_mib": 0},
            "`EvaluationCallback(max_snapshot_mib=...)` must be a positive number of MiB or None, got 0",
        ),
    ],
)
def test_bad_arguments_are_refused_naming_them(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ArgumentError) as info:
        AsyncEvaluator(**kwargs)
    assert str(info.value) == message


class NotRebuilt(nn.Module):
    """Pickles in the training process, fails to unpickle in the worker (as a module holding an open
    handle, or one whose class the worker cannot import, does)."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.zeros(()))
        self.home = os.getpid()

    def __setstate__(self, state: dict[str, Any]) -> None:
        if state["home"] != os.getpid():
            raise RuntimeError("this module cannot be rebuilt in another process")
        super().__setstate__(state)


@pytest.mark.process
def test_a_worker_that_cannot_load_the_module_is_an_error_with_its_traceback_for_each_round(threads: int) -> None:
    others = _workers()
    evaluator = AsyncEvaluator(threads=1)
    evaluator.start(NotRebuilt(), [EVAL_SET], weighted, seed=0, rank=0, world_size=1, max_table_rows=0)
    try:
        _wait_started(evaluator, threads)  # training polls each step: a failed start gives the threads back
        for step in (1, 2):  # each round is given to a new worker, which fails the same way
            evaluator.submit(NotRebuilt(), step, 0, ["steps"])
            snapshot, local = evaluator.collect([EVAL_SET])
            error = str(local[0].report.error)
            assert snapshot.step == step
            assert error.startswith(f"async evaluation worker failed on the weights of step {step}:\nTraceback")
            assert error.endswith("RuntimeError: this module cannot be rebuilt in another process\n")
            assert torch.get_num_threads() == threads
    finally:
        evaluator.close(cancel=True)
    assert _workers(others) == []


EXITS_WITHOUT_CLOSE = """
import multiprocessing, sys, time
import torch
sys.path.insert(0, {tests!r})
from test_async_worker import EVAL_SET, Weights, weighted
from areal_lightning.callbacks.async_evaluator import AsyncEvaluator

if __name__ == "__main__":
    torch.set_num_threads(2)
    evaluator = AsyncEvaluator(threads=1)
    evaluator.start(Weights(), [EVAL_SET], weighted, seed=0, rank=0, world_size=1, max_table_rows=0)
    deadline = time.monotonic() + {wait}
    while torch.get_num_threads() != 2:  # until the worker has started and waits for rounds
        assert time.monotonic() < deadline, "the worker never started"
        evaluator.poll_start()
        time.sleep(0.01)
    [worker] = multiprocessing.active_children()
    print(worker.pid, flush=True)
    # A training process that ends without closing the evaluator (a crash past every handler).
"""


@pytest.mark.process
def test_a_training_process_that_exits_without_closing_leaves_no_worker_and_does_not_hang(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(EXITS_WITHOUT_CLOSE.format(tests=str(Path(__file__).parent), wait=WAIT_S))
    proc = run_in_group([sys.executable, str(script)], timeout=1.5 * WAIT_S)  # a hang fails here
    assert proc.returncode == 0, proc.stderr
    pid = int(proc.stdout.split()[-1])
    _wait(lambda: not _alive(pid), "the worker's end")
