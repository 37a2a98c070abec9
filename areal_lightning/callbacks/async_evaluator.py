"""The background evaluator of ``mode="async"``: a worker process evaluates weight snapshots.

The training process keeps a replica of the module in shared memory. Submitting a round copies
the training weights into it (between optimizer steps, so never torn) and tells the worker the
step; the worker, a process of its own with its own torch thread budget, runs the first half of
the round (`evaluate_local`: this rank's deal, no collective) and sends back the per-rank metric
states. The training thread runs the second half (`reduce_set`: the collectives) at a step every
rank agrees on. At most one round is in flight, so the one replica is never written while read.
The worker process starts when fit starts (`launch`, from a fork server that has the heavy
imports done: `worker_launch`), so that it is ready when training starts and sends it the replica.

Why a process and not a thread, and why a Pipe of its own and not `concurrent.futures`:
docs/async_evaluation.md (measured in benchmarks/RESULTS.md).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import importlib
import logging
import signal
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.reduction import ForkingPickler
from typing import Any

import torch
from torch import nn

from areal_lightning.callbacks.choices import DEFAULT_ASYNC_THREADS, DEFAULT_MAX_SNAPSHOT_MIB, check_async_options
from areal_lightning.callbacks.worker_launch import WorkerLaunch, prestart
from areal_lightning.eval_round import EvalBatch, EvalSet, EvaluateFn, LocalSetResult, evaluate_local, local_batches
from areal_lightning.eval_round.precision import EvalPrecision, eval_precision
from areal_lightning.eval_round.round import resolved_seed

log = logging.getLogger(__name__)

_MIB = 2**20
_POLL_SECS = 0.05  # how often a waiting training thread checks that the worker is still alive
_STOP_SECS = 10.0  # how long a closing worker may take to finish before it is terminated


@dataclass(frozen=True)
class Snapshot:
    """The weights of one round: which step they are from, what they took to copy."""

    step: int
    epoch: int
    causes: list[str]
    mib: float
    copy_secs: float
    submitted: float = 0.0
    """When the round was handed to the worker (`time.monotonic`, the same clock in every process here)."""


@dataclass(frozen=True)
class _Job:
    step: int
    epoch: int


@dataclass(frozen=True)
class _Started:
    """The worker has loaded the replica and waits for rounds."""


@dataclass(frozen=True)
class _Done:
    """A round's end: its results, or the worker's traceback (of the round, or of its start)."""

    results: list[LocalSetResult] | None
    error: str | None
    began: float | None = None
    """When the worker began the round (`time.monotonic`); None when it did not."""


def module_evaluate(module: Any, batches: Sequence[EvalBatch], ctx: Any) -> Any:
    """The `evaluate_fn` when none is given: the module's own ``evaluate`` (picklable, unlike a lambda)."""
    return module.evaluate(batches, ctx)


def _worker_main(conn: Connection, threads: int, modules: Sequence[str] = ()) -> None:
    # Ctrl-C reaches the whole process group; the training process decides and ends this one.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    torch.set_num_threads(threads)
    for name in modules:  # what the replica is made of, imported while training sets up
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    try:
        payload = conn.recv_bytes()  # waits for training to start (the worker starts when fit does)
        replica, sets, evaluate_fn, options, precision, device = ForkingPickler.loads(payload)
        shared = replica.state_dict()  # shared-memory tensors the training process writes
        if device != "cpu":
            replica = copy.deepcopy(replica).to(device)
    except BaseException:  # noqa: BLE001 - reported to the training process
        conn.send(_Done(None, traceback.format_exc()))
        return
    conn.send(_Started())
    while True:
        try:
            job = conn.recv()
        except (EOFError, OSError):
            return  # the training process is gone: never outlive it
        if job is None:
            return
        began = time.monotonic()
        try:
            if device != "cpu":
                replica.load_state_dict(shared)
            with eval_precision(replica, precision):
                results = [
                    evaluate_local(replica, s, evaluate_fn, global_step=job.step, epoch=job.epoch, batches=b, **options)
                    for s, b in sets
                ]
            conn.send(_Done(results, None, began))
        except BaseException:  # noqa: BLE001 - reported to the training process
            conn.send(_Done(None, traceback.format_exc(), began))


def copy_weights(module: nn.Module, replica: nn.Module) -> float:
    """Copies `module`'s weights (its state dict) into `replica`'s in place; returns the seconds it took."""
    start = time.perf_counter()
    with torch.no_grad():
        target = replica.state_dict()
        for name, tensor in module.state_dict().items():
            target[name].copy_(tensor)
    return time.perf_counter() - start


def snapshot_size(module: nn.Module, max_snapshot_mib: float | None) -> float:
    """The MiB of `module`'s weights (its state dict), which an async round copies.

    Raises:
        ValueError: they exceed `max_snapshot_mib` (None: no bound).
    """
    mib = float(sum(t.numel() * t.element_size() for t in module.state_dict().values())) / _MIB
    if max_snapshot_mib is not None and mib > max_snapshot_mib:
        raise ValueError(
            f"async evaluation needs a {mib:.1f} MiB snapshot of {type(module).__name__}'s weights, "
            f"more than max_snapshot_mib={max_snapshot_mib:g}; raise max_snapshot_mib "
            "(evaluator.execution.max_snapshot_mib) "
            "if the memory is there, or use mode='sync'"
        )
    return mib


def _exit_message(code: int | None, start_error: str | None = None) -> str:
    if start_error is not None:
        return f"the worker process could not be started:\n{start_error}"
    message = (
        f"the worker process exited with code {code} (killed, out of memory, or os._exit) before it returned a result"
    )
    if code == 1:
        # What an exception while the worker starts looks like; its traceback is on stderr.
        message += (
            "; its traceback is on stderr. A script that starts training when imported (no "
            '`if __name__ == "__main__":` guard) does this: the worker process imports the '
            "script's module, as DataLoader workers do"
        )
    return message


class AsyncEvaluator:
    """Owns the replica and the worker process of one fit; at most one round in flight.

    Args:
        device: where the worker evaluates; None: the training device (cpu on a CPU run).
        threads: torch intra-op threads of the worker process.
        max_snapshot_mib: refuse to start when the replica would take more MiB; None: no bound.

    Raises:
        ArgumentError: for an unsupported argument value.

    Example:
        >>> AsyncEvaluator(device="cpu", threads=1, max_snapshot_mib=64.0).in_flight is None
        True
    """

    def __init__(
        self,
        device: str | None = None,
        threads: int = DEFAULT_ASYNC_THREADS,
        max_snapshot_mib: float | None = DEFAULT_MAX_SNAPSHOT_MIB,
    ) -> None:
        check_async_options(device, threads, max_snapshot_mib)
        self.device, self.threads, self.max_snapshot_mib = device, threads, max_snapshot_mib
        self.in_flight: Snapshot | None = None
        self._replica: nn.Module | None = None
        self._payload: tuple[Any, ...] = ()
        self._device = "cpu"
        self._worker: WorkerLaunch | None = None
        self._done: _Done | None = None
        self._lent_threads: int | None = None  # training's torch threads before the worker took some
        self._starting = False  # the worker has its payload and has not said it started
        self.snapshot_mib = 0.0
        self.start_secs: float | None = None
        """How long after its submission the worker began the last collected round (it was
        starting, or loading the replica); None when it never began it."""

    # ---- lifetime ------------------------------------------------------------------------------

    def launch(self, modules: Sequence[str] = ()) -> None:
        """Starts the worker process now, without waiting for it (call it when fit starts): it is
        ready when `start` sends it the replica. `modules` (those the module's classes come from)
        are imported in it meanwhile, and by the fork server if this starts it. Idempotent."""
        if self._worker is None:
            prestart(modules)
            self._worker = WorkerLaunch(_worker_main, (self.threads, list(modules)), "areal-lightning-async-eval")

    def start(
        self,
        module: nn.Module,
        eval_sets: Sequence[EvalSet],
        evaluate_fn: EvaluateFn,
        *,
        seed: int,
        rank: int,
        world_size: int,
        max_table_rows: int,
        precision: EvalPrecision = EvalPrecision.FP32,
    ) -> None:
        """Builds the shared replica, checks its size and starts the worker.

        Raises:
            ValueError: the snapshot exceeds `max_snapshot_mib`, or something the worker needs does
                not pickle (a lambda `evaluate_fn`, a module holding an open file, ...).
        """
        state = module.state_dict()
        self.snapshot_mib = snapshot_size(module, self.max_snapshot_mib)
        device = self.device or str(next(iter(state.values())).device if state else "cpu")
        self._device = device
        self._replica = copy.deepcopy(module).cpu().requires_grad_(False).share_memory()
        # The worker gets this rank's deal, computed here: the eval sets' cost and key functions
        # (often lambdas) never travel.
        sets = [
            (
                dataclasses.replace(s, cost_fn=None, key_fn=repr),
                local_batches(s, resolved_seed(s, seed), rank, world_size),
            )
            for s in eval_sets
        ]
        options = dict(seed=seed, rank=rank, world_size=world_size, max_table_rows=max_table_rows)
        self._payload = (self._replica, sets, evaluate_fn, options, precision, device)
        self._spawn()

    def _spawn(self) -> None:
        try:
            # Pickled anew for each worker: a shared tensor's file descriptor is received once.
            payload = bytes(ForkingPickler.dumps(self._payload))
        except Exception as err:
            raise ValueError(
                f"mode='async' evaluates in a worker process, so the module, evaluate_fn and the eval sets' samples "
                f"must pickle, and they do not: {type(err).__name__}: {err}. Define evaluate_fn at module level, or "
                "use mode='sync'"
            ) from err
        self.launch()
        assert self._worker is not None
        self._worker.send_bytes(payload)
        self._starting = True
        self._lend_threads()  # the worker loads the replica (and, spawned, imports torch: seconds of a core)

    def close(self, cancel: bool = False) -> None:
        """Ends the worker: lets a round in flight finish (or terminates it with `cancel`); idempotent.

        An idle worker is terminated at once: it holds nothing to lose, and waiting for an
        interpreter with torch loaded to shut down would add about a second to the end of fit.
        """
        busy = self.in_flight is not None and self._done is None
        self.in_flight, self._done = None, None
        self._take_threads_back()
        self._stop_worker(cancel or not busy)

    def _stop_worker(self, cancel: bool) -> None:
        worker, self._worker, self._starting = self._worker, None, False
        if worker is not None:
            worker.stop(ask=not cancel, grace=_STOP_SECS)

    # ---- the CPU thread budget -------------------------------------------------------------------

    def _lend_threads(self) -> None:
        """While the worker evaluates on the CPU, training leaves it the worker's threads.

        The training's torch threads and the worker's together stay within the training's own
        budget (oversubscribed OpenMP threads wait for each other); between rounds training gets
        all of them back.
        """
        if self._device != "cpu" or self._lent_threads is not None:
            return
        self._lent_threads = torch.get_num_threads()
        torch.set_num_threads(max(1, self._lent_threads - self.threads))

    def _take_threads_back(self) -> None:
        if self._lent_threads is not None:
            torch.set_num_threads(self._lent_threads)
            self._lent_threads = None

    # ---- rounds ---------------------------------------------------------------------------------

    def submit(self, module: nn.Module, step: int, epoch: int, causes: Sequence[str]) -> Snapshot:
        """Copies the module's weights into the replica and hands the round to the worker.

        Call it between optimizer steps, with no round in flight.
        """
        assert self.in_flight is None and self._replica is not None, "one round in flight at most"
        if self._worker is None or not self._worker.alive():
            self._stop_worker(cancel=True)
            self._spawn()  # the worker died with an earlier round: a fresh one takes this round
        self._lend_threads()
        copy_secs = copy_weights(module, self._replica)
        self.in_flight = Snapshot(
            step, epoch, [str(c) for c in causes], self.snapshot_mib, copy_secs, submitted=time.monotonic()
        )
        assert self._worker is not None
        self._worker.send_bytes(bytes(ForkingPickler.dumps(_Job(step, epoch))))
        log.debug(
            "async round for step %d submitted: %.2f MiB snapshot copied in %.4f s", step, self.snapshot_mib, copy_secs
        )
        return self.in_flight

    def poll_start(self) -> None:
        """Gives training its threads back once the worker has started; never blocks (each step).

        A worker that failed to start is stopped here, and training gets its threads back; the next
        round spawns a new worker, whose error (with its traceback) that round then records.
        """
        if self._starting and self.in_flight is None and self._receive(block=False) is not None:
            self._take_threads_back()  # the worker failed to start and was stopped

    def ready(self) -> bool:
        """The round in flight has finished on this rank (or its worker died); never blocks."""
        if self.in_flight is None:
            return False
        if self._done is None:
            self._done = self._receive(block=False)
        if self._done is not None:
            self._take_threads_back()  # while the ranks agree to merge, training has its threads again
        return self._done is not None

    def collect(self, eval_sets: Sequence[EvalSet]) -> tuple[Snapshot, list[LocalSetResult]]:
        """Waits for the round in flight and returns it; a failed worker becomes an error result
        per eval set (with the worker's traceback), so the reduction raises it on every rank."""
        snapshot = self.in_flight
        assert snapshot is not None, "no round in flight"
        done = self._done or self._receive(block=True)
        self._take_threads_back()
        self.in_flight, self._done = None, None
        assert done is not None
        self.start_secs = None if done.began is None else max(0.0, done.began - snapshot.submitted)
        if done.results is not None:
            return snapshot, done.results
        message = f"async evaluation worker failed on the weights of step {snapshot.step}:\n{done.error}"
        return snapshot, [LocalSetResult.failed(s.name, message) for s in eval_sets]

    def _receive(self, block: bool) -> _Done | None:
        worker = self._worker
        if worker is None:
            return _Done(None, "the worker process was stopped before it returned a result")
        while True:
            closed = False
            if not worker.starting and worker.conn.poll(_POLL_SECS if block else 0):
                try:
                    message: _Started | _Done = worker.conn.recv()
                except (EOFError, OSError):
                    closed = True  # the worker's end is closed: it exited
                else:
                    if isinstance(message, _Done):
                        if self._starting:  # it failed to start and is ending: the next round gets a new one
                            self._stop_worker(cancel=True)
                        return message
                    self._starting = False
                    if self.in_flight is None:
                        self._take_threads_back()
                    continue  # a round in flight keeps the threads lent
            if closed or not worker.alive():
                worker.join(_STOP_SECS)
                message_text = _exit_message(worker.exitcode(), worker.error)
                self._stop_worker(cancel=True)
                return _Done(None, message_text)
            if not block:
                return None
            if worker.starting:
                time.sleep(_POLL_SECS)  # the fork server is still importing
