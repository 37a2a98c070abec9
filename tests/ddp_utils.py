"""Run a function on several CPU processes joined by torch.distributed (gloo), for tests.

``run_ddp(fn, 2, *args)`` spawns one process per rank, calls ``fn(rank, world_size, *args)`` in
each, and returns the list of their return values (index = rank). A failure on any rank, a rank
that dies, or a run longer than ``timeout_s`` becomes an ``AssertionError`` in the test with the
failing rank and its traceback, instead of a hang. ``fn`` and ``args`` must be picklable
(``fn`` a module-level function), and so must the return values.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

DEFAULT_TIMEOUT_S: float = 120.0
"""Whole run, process start and imports included."""

# Ranks are forked from multiprocessing's fork server, which imports these once per test process:
# a spawned rank paid about 5 s of CPU importing torch and Lightning, and the suite starts about a
# hundred ranks. The server has run no torch op (no thread pool to break at the fork); each rank
# gets the test's environment and its rank before `fn`'s module is imported (`_worker`).
_PRELOAD = [
    "torch",
    "torch.distributed",
    "lightning",
    "torchmetrics",
    "areal_lightning.callbacks",
    "areal_lightning.eval_round",
]
# RUN_DDP_START_METHOD=spawn starts each rank from scratch (benchmarks/make_test_ab.sh compares the two).
_START_METHOD = os.environ.get("RUN_DDP_START_METHOD", "forkserver")

_KILL_GRACE_S: float = 5.0
_POLL_S: float = 0.2


def _worker(
    rank: int, world_size: int, payload: bytes, store_path: str, out_dir: str, timeout_s: float, env: dict[str, str]
) -> None:
    # Lead a process group of its own, so that a timeout ends whatever this rank started too.
    os.setpgid(0, 0)
    # The test's environment (the fork server has its own, from when it started) and the launcher's,
    # before unpickling `fn` imports its module.
    os.environ.clear()
    os.environ.update(
        env, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_WORLD_SIZE=str(world_size)
    )
    # A temporary directory in the run's: the rank ends with os._exit (no exit handlers remove W&B's
    # or multiprocessing's directories); run_ddp removes it with the run's.
    temp = os.path.join(out_dir, f"tmp{rank}")
    os.mkdir(temp, 0o711)  # a sandbox's programs run as another user and pass through it
    os.environ["TMPDIR"] = temp
    tempfile.tempdir = None
    # Rank-zero-only printing (Lightning's, torchmetrics') read LOCAL_RANK when imported: in the server.
    for module in list(sys.modules.values()):
        only = getattr(module, "__dict__", {}).get("rank_zero_only")
        if callable(only) and hasattr(only, "rank"):
            only.rank = rank
    torch.set_num_threads(1)  # two ranks on a small CPU box: avoid oversubscription
    fn, args = pickle.loads(payload)
    # The collective timeout turns a rank stuck in a collective into an error on that rank.
    dist.init_process_group(
        "gloo",
        init_method=f"file://{store_path}",
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=timeout_s),
    )
    try:
        result = fn(rank, world_size, *args)
    except BaseException:
        # Stamp the failure before tearing the group down: the teardown makes the peers fail too,
        # and the stamps let the report put the root cause first.
        with open(os.path.join(out_dir, f"rank{rank}.err"), "w") as f:
            f.write(f"{time.time()!r}\n{traceback.format_exc()}")
        dist.destroy_process_group()
        raise
    dist.barrier()  # no rank is inside a collective any more
    with open(os.path.join(out_dir, f"rank{rank}.pkl"), "wb") as f:
        pickle.dump(result, f)
    # Exit without tearing gloo down: its teardown, or the interpreter's finalisation with gloo
    # threads alive, aborted a rank once in many runs ("terminate called without an active
    # exception", exit code -6) after its work was done.
    os._exit(0)


def _signal_group(pid: int | None, sig: signal.Signals) -> None:
    """`sig` to the process group a rank leads (itself and anything it started)."""
    if pid is None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def _stop(context: mp.ProcessContext) -> list[int]:
    """Terminate (then kill) the process groups of this run's still running ranks; return those ranks."""
    alive = [rank for rank, p in enumerate(context.processes) if p.is_alive()]
    for rank in alive:
        context.processes[rank].terminate()
        _signal_group(context.processes[rank].pid, signal.SIGTERM)
    for rank in alive:
        process = context.processes[rank]
        process.join(_KILL_GRACE_S)
        if process.is_alive():
            process.kill()
            process.join()
    for process in context.processes:  # children a rank started outlive it unless its group goes too
        _signal_group(process.pid, signal.SIGKILL)
    for path in context.error_files:  # torch's file of a rank that raised (in the temporary directory)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    return alive


def _tracebacks(out_dir: str, fallback: str) -> str:
    """Every traceback the ranks stamped, earliest failure first (the likely root cause)."""
    stamped = []
    for path in Path(out_dir).glob("rank*.err"):
        stamp, _, trace = path.read_text().partition("\n")
        stamped.append((float(stamp), f"rank {path.stem[4:]} raised:\n{trace}"))
    return "\n".join(text for _, text in sorted(stamped)) or fallback


def run_ddp(fn: Callable[..., Any], world_size: int = 2, *args: Any, timeout_s: float = DEFAULT_TIMEOUT_S) -> list[Any]:
    """Call ``fn(rank, world_size, *args)`` on ``world_size`` gloo CPU processes.

    Args:
        fn: module-level (picklable) function.
        world_size: number of processes, >= 1.
        args: extra picklable positional arguments for ``fn``.
        timeout_s: limit for the whole run; also the collective timeout of the process group.

    Returns:
        The return value of ``fn`` on each rank, indexed by rank.

    Raises:
        AssertionError: if a rank raises (message: rank and traceback), exits abnormally, or the
            run exceeds ``timeout_s`` (all its processes are stopped first).
    """
    name = getattr(fn, "__qualname__", repr(fn))
    if world_size < 1:
        raise ValueError(f"`run_ddp(world_size=...)` must be >= 1, got {world_size}")
    try:
        payload = pickle.dumps((fn, args))
    except Exception as err:  # lambdas, closures, local functions
        raise AssertionError(f"run_ddp({name}): fn and args must be picklable (module-level fn): {err}") from err
    with tempfile.TemporaryDirectory(prefix="run_ddp_") as tmp:
        os.chmod(tmp, 0o711)  # the ranks' temporary directories are in it
        store_path = str(Path(tmp) / "store")  # FileStore rendezvous: no TCP port to race for
        mp.set_forkserver_preload(_PRELOAD)  # read when the server starts: the first run of a test process
        context = mp.start_processes(
            _worker,
            args=(world_size, payload, store_path, tmp, timeout_s, dict(os.environ)),
            nprocs=world_size,
            join=False,
            start_method=_START_METHOD,
        )
        deadline = time.monotonic() + timeout_s
        try:
            # The grace period lets the other ranks fail on their own, so that every traceback
            # (the root cause and e.g. a peer's "connection closed") reaches the report.
            while not context.join(timeout=_POLL_S, grace_period=_KILL_GRACE_S):
                if time.monotonic() > deadline:
                    still_running = _stop(context)
                    raise AssertionError(
                        f"run_ddp({name}): timed out after {timeout_s:.0f} s; ranks still running: {still_running}"
                    )
        except mp.ProcessRaisedException as err:
            _stop(context)
            raise AssertionError(f"run_ddp({name}): {_tracebacks(tmp, str(err))}") from None
        except mp.ProcessExitedException as err:
            _stop(context)
            raise AssertionError(
                f"run_ddp({name}): rank {err.error_index} exited with code {err.exit_code}\n"
                f"{_tracebacks(tmp, str(err))}"
            ) from None
        for process in context.processes:  # ranks that exited may have left helpers behind
            _signal_group(process.pid, signal.SIGKILL)
        results = []
        for rank in range(world_size):
            with open(Path(tmp) / f"rank{rank}.pkl", "rb") as f:
                results.append(pickle.load(f))
        return results
