"""The async worker's protocol: the project's own (a spawned process, a Pipe, three messages)
against the standard library's `concurrent.futures.ProcessPoolExecutor`, side by side in one run.

Both run the same worker on the same payload: a replica of a tiny module in shared memory, one
eval set dealt in the training process, `evaluate_local` per round. The pool version is a
prototype (`PoolEvaluator` below): ``ProcessPoolExecutor(max_workers=1, mp_context=spawn,
initializer=...)``, the payload unpickled by the initializer, a no-op future submitted at start so
that the worker starts beside training (as the evaluator's does) and says when it is ready.

Measured, as medians over repeats (the two take turns, in a shuffled order per repeat):

* start-up: from `start` until the worker has started (ready for a round), and until the result
  of the first round is back;
* per round: submit, evaluate, return, for a tiny module (the protocol's own cost);
* closing an idle worker: the evaluator's `close()` (terminate) and a graceful stop (ask, join),
  against `shutdown(wait=True)`;
* cancelling a running round (Ctrl-C, `on_error`): the evaluator's `close(cancel=True)` against
  `Future.cancel()` and `shutdown(wait=False, cancel_futures=True)`, and how long the pool's worker
  then stays alive (the round runs to its end, ``--hold`` seconds);
* the same in a training process that then exits (as after Ctrl-C): how long its exit takes
  (once, in a child process);
* a worker killed (SIGKILL) in a round: what each reports, and whether the next round runs.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/async_worker_protocol.py [--repeats 3] [--rounds 20] [--json]
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import copy
import dataclasses
import json
import os
import random
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures.process import BrokenProcessPool
from multiprocessing.reduction import ForkingPickler
from pathlib import Path
from statistics import median
from typing import Any

import torch
import torch.multiprocessing as tmp
from torch import nn

from areal_lightning.callbacks.async_evaluator import AsyncEvaluator
from areal_lightning.eval_round import EvalBatch, EvalContext, EvalSet, evaluate_local, local_batches
from areal_lightning.eval_round.round import resolved_seed

SEED = 1
SAMPLES = list(range(16))
WARM_ROUNDS = 3  # before the per-round timing: the worker's first rounds import and allocate


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(8, 8)


def tiny_round(module: Any, batches: Sequence[EvalBatch], ctx: EvalContext) -> dict[str, Any]:
    """A round that costs almost nothing: what is left is the protocol. `options["hold"]` (a file)
    makes the round write the worker's pid there and sleep `options["hold_s"]` first."""
    hold = ctx.options.get("hold")
    if hold and ctx.global_step < 0:
        Path(hold).write_text(str(os.getpid()))
        time.sleep(ctx.options["hold_s"])
    x = torch.ones(len(batches), 8)
    return {"out": float(module.layer(x).sum())}


# ---- the standard-library prototype --------------------------------------------------------------

_WORKER: dict[str, Any] = {}


def _pool_init(payload: bytes, threads: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    torch.set_num_threads(threads)
    replica, sets, evaluate_fn, options = ForkingPickler.loads(payload)
    _WORKER.update(replica=replica, sets=sets, evaluate_fn=evaluate_fn, options=options)


def _pool_ready() -> int:
    return os.getpid()


def _pool_round(step: int, epoch: int) -> list[Any]:
    w = _WORKER
    return [
        evaluate_local(w["replica"], s, w["evaluate_fn"], global_step=step, epoch=epoch, batches=b, **w["options"])
        for s, b in w["sets"]
    ]


class PoolEvaluator:
    """The same worker on `ProcessPoolExecutor(max_workers=1, mp_context=spawn)`."""

    def __init__(self, threads: int = 1) -> None:
        self.threads = threads
        self.executor: cf.ProcessPoolExecutor | None = None
        self.ready: cf.Future[int] | None = None
        self.future: cf.Future[list[Any]] | None = None

    def start(self, module: nn.Module, eval_sets: Sequence[EvalSet], evaluate_fn: Any) -> None:
        self.replica = copy.deepcopy(module).requires_grad_(False).share_memory()
        sets = [
            (dataclasses.replace(s, cost_fn=None, key_fn=repr), local_batches(s, resolved_seed(s, SEED), 0, 1))
            for s in eval_sets
        ]
        self.payload = (self.replica, sets, evaluate_fn, dict(seed=SEED, rank=0, world_size=1, max_table_rows=0))
        self._spawn()

    def _spawn(self) -> None:
        payload = bytes(ForkingPickler.dumps(self.payload))
        self.executor = cf.ProcessPoolExecutor(
            max_workers=1, mp_context=tmp.get_context("spawn"), initializer=_pool_init, initargs=(payload, self.threads)
        )
        self.ready = self.executor.submit(_pool_ready)  # starts the worker now; done once it has started

    def submit(self, module: nn.Module, step: int) -> None:
        with torch.no_grad():
            target = self.replica.state_dict()
            for name, tensor in module.state_dict().items():
                target[name].copy_(tensor)
        assert self.executor is not None
        self.future = self.executor.submit(_pool_round, step, 0)

    def collect(self) -> list[Any]:
        assert self.future is not None
        return self.future.result()

    def close(self) -> None:
        assert self.executor is not None
        self.executor.shutdown(wait=True)


# ---- measurements --------------------------------------------------------------------------------


def _eval_set(hold: Path | None = None, hold_s: float = 0.0) -> EvalSet:
    options = {"hold": str(hold), "hold_s": hold_s} if hold else {}
    return EvalSet("tiny", SAMPLES, batch_size=4, options=options)


def _wait_file(path: Path, timeout: float = 120.0) -> int:
    deadline = time.monotonic() + timeout
    while not (path.exists() and path.read_text()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {path}")
        time.sleep(0.005)
    return int(path.read_text())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not yet reaped) is not running
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def _start_ours(module: nn.Module, eval_set: EvalSet) -> AsyncEvaluator:
    evaluator = AsyncEvaluator(device="cpu", threads=1, max_snapshot_mib=None)
    evaluator.start(module, [eval_set], tiny_round, seed=SEED, rank=0, world_size=1, max_table_rows=0)
    return evaluator


def _wait_started(evaluator: AsyncEvaluator) -> None:
    while evaluator._starting:  # what training's `poll_start` sees each step
        evaluator.poll_start()
        time.sleep(0.001)


def measure_ours(args: argparse.Namespace, tmpdir: Path) -> dict[str, Any]:
    module, out = Tiny(), {}
    t0 = time.perf_counter()
    evaluator = _start_ours(module, _eval_set())
    _wait_started(evaluator)
    out["started_s"] = time.perf_counter() - t0
    evaluator.submit(module, 0, 0, ["steps"])
    evaluator.collect([_eval_set()])
    out["first_round_s"] = time.perf_counter() - t0
    for step in range(1, WARM_ROUNDS + 1):
        evaluator.submit(module, step, 0, ["steps"])
        evaluator.collect([_eval_set()])
    t0 = time.perf_counter()
    for step in range(1, args.rounds + 1):
        evaluator.submit(module, step, 0, ["steps"])
        evaluator.collect([_eval_set()])
    out["round_ms"] = (time.perf_counter() - t0) / args.rounds * 1e3
    t0 = time.perf_counter()
    evaluator.close()  # idle: terminated
    out["close_idle_s"] = time.perf_counter() - t0

    # A graceful stop of an idle worker, for comparison: ask it to return, join it.
    evaluator = _start_ours(module, _eval_set())
    _wait_started(evaluator)
    t0 = time.perf_counter()
    evaluator._stop_worker(cancel=False)
    out["close_idle_graceful_s"] = time.perf_counter() - t0

    hold = tmpdir / f"ours-{random.random()}"
    eval_set = _eval_set(hold, args.hold)
    evaluator = _start_ours(module, eval_set)
    evaluator.submit(module, -1, 0, ["steps"])
    pid = _wait_file(hold)
    t0 = time.perf_counter()
    evaluator.close(cancel=True)
    out["cancel_running_s"] = time.perf_counter() - t0
    out["worker_alive_after_cancel_s"] = 0.0 if not _alive(pid) else float("nan")

    hold = tmpdir / f"ours-kill-{random.random()}"
    eval_set = _eval_set(hold, args.hold)
    evaluator = _start_ours(module, eval_set)
    evaluator.submit(module, -1, 0, ["steps"])
    os.kill(_wait_file(hold), signal.SIGKILL)
    _, local = evaluator.collect([eval_set])
    out["dead_worker_report"] = local[0].report.error.splitlines()[-1]
    evaluator.submit(module, 1, 0, ["steps"])  # a fresh worker takes the next round
    _, local = evaluator.collect([eval_set])
    out["next_round_after_death"] = "runs (a new worker)" if local[0].report.error is None else "fails"
    evaluator.close()
    return out


def measure_pool(args: argparse.Namespace, tmpdir: Path) -> dict[str, Any]:
    module, out = Tiny(), {}
    t0 = time.perf_counter()
    pool = PoolEvaluator()
    pool.start(module, [_eval_set()], tiny_round)
    assert pool.ready is not None
    pool.ready.result()
    out["started_s"] = time.perf_counter() - t0
    pool.submit(module, 0)
    pool.collect()
    out["first_round_s"] = time.perf_counter() - t0
    for step in range(1, WARM_ROUNDS + 1):
        pool.submit(module, step)
        pool.collect()
    t0 = time.perf_counter()
    for step in range(1, args.rounds + 1):
        pool.submit(module, step)
        pool.collect()
    out["round_ms"] = (time.perf_counter() - t0) / args.rounds * 1e3
    t0 = time.perf_counter()
    pool.close()  # shutdown(wait=True): the only public way to end an idle worker
    out["close_idle_s"] = time.perf_counter() - t0
    out["close_idle_graceful_s"] = out["close_idle_s"]

    hold = tmpdir / f"pool-{random.random()}"
    pool = PoolEvaluator()
    pool.start(module, [_eval_set(hold, args.hold)], tiny_round)
    pool.submit(module, -1)
    pid = _wait_file(hold)
    t0 = time.perf_counter()
    assert pool.future is not None and pool.executor is not None
    out["future_cancel_returned"] = pool.future.cancel()  # False: it is running
    pool.executor.shutdown(wait=False, cancel_futures=True)
    out["cancel_running_s"] = time.perf_counter() - t0
    while _alive(pid):  # the round runs to its end in a worker nobody can stop (publicly)
        time.sleep(0.01)
    out["worker_alive_after_cancel_s"] = time.perf_counter() - t0 - out["cancel_running_s"]

    hold = tmpdir / f"pool-kill-{random.random()}"
    pool = PoolEvaluator()
    pool.start(module, [_eval_set(hold, args.hold)], tiny_round)
    pool.submit(module, -1)
    os.kill(_wait_file(hold), signal.SIGKILL)
    try:
        pool.collect()
        out["dead_worker_report"] = "no error"
    except BrokenProcessPool as err:
        out["dead_worker_report"] = f"{type(err).__name__}: {err}"
    try:
        pool.submit(module, 1)
        pool.collect()
        out["next_round_after_death"] = "runs"
    except BrokenProcessPool as err:
        out["next_round_after_death"] = f"{type(err).__name__}: a new executor (a new start-up) is needed"
    assert pool.executor is not None
    pool.executor.shutdown(wait=True)
    return out


def exit_probe(kind: str, hold_s: float, tmpdir: Path) -> None:
    """A training process that cancels a running round on Ctrl-C and exits (run as a child)."""
    module, hold = Tiny(), tmpdir / f"exit-{kind}"
    if kind == "ours":
        evaluator = _start_ours(module, _eval_set(hold, hold_s))
        evaluator.submit(module, -1, 0, ["steps"])
        _wait_file(hold)
        evaluator.close(cancel=True)
    else:
        pool = PoolEvaluator()
        pool.start(module, [_eval_set(hold, hold_s)], tiny_round)
        pool.submit(module, -1)
        _wait_file(hold)
        assert pool.executor is not None
        pool.executor.shutdown(wait=False, cancel_futures=True)
    print(time.time(), flush=True)  # then the interpreter exits (concurrent.futures joins at exit)


def measure_exit(kind: str, hold_s: float, tmpdir: Path) -> float:
    """Seconds from the cancel to the end of that training process."""
    import subprocess

    proc = subprocess.run(
        [sys.executable, __file__, "--exit-probe", kind, "--hold", str(hold_s), "--tmpdir", str(tmpdir)],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    return time.time() - float(proc.stdout.split()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=20, help="rounds per repeat for the per-round cost")
    parser.add_argument("--hold", type=float, default=5.0, help="seconds a round to cancel still had to run")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--exit-probe", choices=["ours", "pool"], help=argparse.SUPPRESS)
    parser.add_argument("--tmpdir", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.exit_probe:
        exit_probe(args.exit_probe, args.hold, args.tmpdir)
        return

    runs: dict[str, list[dict[str, Any]]] = {"ours": [], "pool": []}
    with tempfile.TemporaryDirectory() as tmpdir:
        for repeat in range(args.repeats):
            order = ["ours", "pool"]
            random.Random(repeat).shuffle(order)
            for kind in order:
                measure = measure_ours if kind == "ours" else measure_pool
                runs[kind].append(measure(args, Path(tmpdir)))
                print(f"repeat {repeat} {kind}: {runs[kind][-1]}", file=sys.stderr, flush=True)
        exits = {kind: measure_exit(kind, args.hold, Path(tmpdir)) for kind in ("ours", "pool")}

    numeric = ["started_s", "first_round_s", "round_ms", "close_idle_s", "close_idle_graceful_s", "cancel_running_s"]
    numeric.append("worker_alive_after_cancel_s")
    summary = {
        kind: {
            **{k: median(r[k] for r in rs) for k in numeric},
            **{k: v for k, v in rs[-1].items() if k not in numeric},
        }
        for kind, rs in runs.items()
    }
    for kind, secs in exits.items():
        summary[kind]["exit_after_cancel_s"] = secs
    summary["python"] = {"version": sys.version.split()[0]}
    summary["pool"]["terminate_workers_available"] = hasattr(cf.ProcessPoolExecutor, "terminate_workers")
    if args.json:
        print(json.dumps({"summary": summary, "runs": runs}))
        return
    print(f"python {sys.version.split()[0]}, {args.repeats} repeats, medians; load average {os.getloadavg()[0]:.1f}")
    print(f"{'':34} {'own protocol':>16} {'ProcessPoolExecutor':>22}")
    labels = {
        "started_s": "start-up until ready (s)",
        "first_round_s": "start-up until 1st result (s)",
        "round_ms": "per round, tiny module (ms)",
        "close_idle_s": "close an idle worker (s)",
        "close_idle_graceful_s": "  graceful stop (ask, join) (s)",
        "cancel_running_s": "cancel a running round (s)",
        "worker_alive_after_cancel_s": "  worker alive after it (s)",
        "exit_after_cancel_s": "  training process exits after (s)",
    }
    for key, label in labels.items():
        print(f"{label:34} {summary['ours'][key]:16.3f} {summary['pool'][key]:22.3f}")
    for key in ("dead_worker_report", "next_round_after_death"):
        print(f"{key}:\n  own:  {summary['ours'][key]}\n  pool: {summary['pool'][key]}")
    print(f"pool future.cancel() on a running round: {summary['pool']['future_cancel_returned']}")
    print(f"ProcessPoolExecutor.terminate_workers exists: {summary['pool']['terminate_workers_available']}")


if __name__ == "__main__":
    main()
