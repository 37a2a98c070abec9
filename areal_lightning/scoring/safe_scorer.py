"""Scorers that cannot hang the run: a reward function run in worker processes with a per-call time limit.

A reward function that hangs (math-verify on an adversarial expression, a regex that backtracks
forever) must not stop training or evaluation. math-verify's own timeout uses ``SIGALRM``, which
Python allows on the main thread only: under an async evaluation thread, a DataLoader worker or
any callback thread it silently does nothing. `SafeScorer` instead runs the scorer in worker
processes (``forkserver`` where the platform has it, else ``spawn``: never ``fork`` from a
process that may hold threads and CUDA state) and waits for each answer with a deadline; a
worker past its deadline is killed and replaced. That works from any thread.

A sample that timed out, that the scorer could not parse (it returned None) or whose scorer
raised scores `SafeScorer.wrong_reward` and is counted in `metrics.ScoringMetric` (``timeouts``,
``parse_failures``, ``errors``: float64 sum states, exact across ranks). A scorer that fails
`max_consecutive_failures` times in a row raises `ScorerFailingError`: reported as an error of
the round, never a silent reward and never a hang.
"""

from __future__ import annotations

import contextlib
import logging
import math
import multiprocessing as mp
import threading
import time
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection, wait
from typing import Any

from areal_lightning.errors import ArgumentError
from areal_lightning.scoring.score import DEFAULT_TIMEOUT_S, Score, ScoreStatus

log = logging.getLogger(__name__)

DEFAULT_MAX_CONSECUTIVE_FAILURES = 64
"""Failures in a row (timeouts or errors, not parse failures) after which the scorer counts as broken."""
_JOIN_S = 5.0  # how long a killed or closing worker may take to exit
START_TIMEOUT_S = 300.0
"""How long a new worker may take to start (import the scorer's module) before the scorer is broken."""
_READY = "ready"


class ScorerFailingError(RuntimeError):
    """The scorer failed (timed out or raised) too many times in a row: it is broken, not unlucky."""


def _worker_loop(conn: Connection, fn: Callable[[str, str], float | None]) -> None:
    """A worker: score `(completion, answer)` pairs until told to stop (None) or killed."""
    conn.send(_READY)  # the scorer's module is imported: the time limit starts counting from here
    while True:
        try:
            task = conn.recv()
        except EOFError:
            return
        if task is None:
            return
        completion, answer = task
        try:
            value = fn(completion, answer)
            conn.send(("ok", None if value is None else float(value)))
        except Exception as err:  # noqa: BLE001 - the parent counts it; the worker lives on
            conn.send(("error", f"{type(err).__name__}: {err}"))


def _start_method() -> str:
    # forkserver forks from a clean server process: fast to replace a killed worker, and safe
    # where `fork` is not (a parent with threads, CUDA or an open process group).
    return "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"


class _Worker:
    def __init__(self, ctx: Any, fn: Callable[[str, str], float | None]) -> None:
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_worker_loop, args=(child, fn), daemon=True, name="areal-scorer")
        self.process.start()
        child.close()
        self.ready = False
        self.dead = False

    def wait_ready(self) -> None:
        """Waits for the worker's start-up (imports), which does not count against a call's time limit."""
        if self.ready:
            return
        if not self.conn.poll(START_TIMEOUT_S):
            self.kill()
            raise ScorerFailingError(f"a scorer worker did not start within {START_TIMEOUT_S:g} s")
        try:
            message = self.conn.recv()
        except EOFError:
            message = None
        if message != _READY:
            raise ScorerFailingError(
                f"a scorer worker died while starting (exit code {self.process.exitcode}); "
                "is the scorer a module-level function its module can be imported for?"
            )
        self.ready = True

    def kill(self) -> None:
        self.process.kill()
        self.process.join(_JOIN_S)
        self.conn.close()

    def close(self) -> None:
        with contextlib.suppress(BrokenPipeError, OSError):
            self.conn.send(None)
        self.process.join(_JOIN_S)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(_JOIN_S)
        self.conn.close()


class SafeScorer:
    """Runs ``fn(completion, answer) -> reward | None`` in worker processes with a per-call time limit.

    Args:
        fn: a picklable (module-level) function; None means "no answer found" (a parse failure).
        timeout_s: seconds one call may take; past it the worker is killed and replaced and the
            sample scores `wrong_reward` with status ``timeout``.
        workers: processes scoring in parallel.
        wrong_reward: the reward of a sample that timed out, failed to parse or whose scorer raised.
        max_consecutive_failures: timeouts or errors in a row after which `score_many` raises
            `ScorerFailingError`; None: never.

    Raises:
        ArgumentError: for a timeout that is not a positive number, a worker count or a failure
            limit that is not a positive integer.

    Example:
        >>> from areal_lightning.tasks.math_answers import numeric_equal  # doctest: +SKIP
        >>> with SafeScorer(numeric_equal, timeout_s=2.0) as scorer:  # doctest: +SKIP
        ...     [s.reward for s in scorer.score_many(["#### 5", "#### 6"], ["5", "5"])]
        [1.0, 0.0]
    """

    def __init__(
        self,
        fn: Callable[[str, str], float | None],
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        workers: int = 1,
        wrong_reward: float = 0.0,
        max_consecutive_failures: int | None = DEFAULT_MAX_CONSECUTIVE_FAILURES,
    ) -> None:
        if not callable(fn):
            raise ArgumentError("SafeScorer", "fn", fn, "a picklable function (completion, answer) -> reward or None")
        if (
            isinstance(timeout_s, bool)
            or not isinstance(timeout_s, (int, float))
            or not math.isfinite(timeout_s)
            or timeout_s <= 0
        ):
            raise ArgumentError("SafeScorer", "timeout_s", timeout_s, "a positive number of seconds")
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ArgumentError("SafeScorer", "workers", workers, "a positive integer")
        limit = max_consecutive_failures
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
            raise ArgumentError("SafeScorer", "max_consecutive_failures", limit, "a positive integer or None")
        self.fn, self.timeout_s, self.workers = fn, float(timeout_s), workers
        self.wrong_reward, self.max_consecutive_failures = float(wrong_reward), limit
        self.consecutive_failures = 0
        self._ctx = mp.get_context(_start_method())
        self._pool: list[_Worker] = []
        self._lock = threading.Lock()  # one batch at a time: callers on several threads queue here

    def __enter__(self) -> SafeScorer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        # Not contextlib.suppress: at interpreter shutdown module globals may already be None.
        try:  # noqa: SIM105
            self.close()
        except Exception:  # noqa: BLE001 - the daemon workers die with the interpreter anyway
            pass

    def __getstate__(self) -> dict[str, Any]:
        # A copy (a spawned rank, a deepcopy of the task) starts its own workers.
        state = self.__dict__.copy()
        state.update(_pool=[], _lock=None, _ctx=None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
        self._ctx = mp.get_context(_start_method())

    def close(self) -> None:
        """Stops the workers (they start again on the next call)."""
        pool, self._pool = self._pool, []
        for worker in pool:
            worker.close()

    def score(self, completion: str, answer: str) -> Score:
        """One sample's `Score`."""
        return self.score_many([completion], [answer])[0]

    def score_many(self, completions: Sequence[str], answers: Sequence[str]) -> list[Score]:
        """Each completion's `Score` against its answer, scored in parallel, in order.

        Raises:
            ValueError: for sequences of different lengths.
            ScorerFailingError: after `max_consecutive_failures` timeouts or errors in a row.
        """
        if len(completions) != len(answers):
            raise ValueError(f"SafeScorer.score_many got {len(completions)} completions for {len(answers)} answers")
        with self._lock:
            scores = self._run(list(zip(completions, answers, strict=True)))
        for score in scores:
            failed = score.status in (ScoreStatus.TIMEOUT, ScoreStatus.ERROR)
            self.consecutive_failures = self.consecutive_failures + 1 if failed else 0
            if self.max_consecutive_failures is not None and self.consecutive_failures >= self.max_consecutive_failures:
                raise ScorerFailingError(
                    f"scorer {getattr(self.fn, '__qualname__', self.fn)!r} failed {self.consecutive_failures} times "
                    f"in a row (last: {score.status.value}); it is broken, not unlucky: fix it or raise its "
                    f"timeout_s (now {self.timeout_s:g} s)"
                )
        return scores

    def _run(self, tasks: list[tuple[str, str]]) -> list[Score]:
        while len(self._pool) < min(self.workers, len(tasks)):
            self._pool.append(_Worker(self._ctx, self.fn))
        out: list[Score | None] = [None] * len(tasks)
        pending = list(range(len(tasks)))[::-1]  # popped from the end: in order
        busy: dict[int, tuple[int, float]] = {}  # pool slot -> (task index, deadline)
        while pending or busy:
            for slot in range(len(self._pool)):
                if slot not in busy and pending:
                    self._pool[slot].wait_ready()
                    index = pending.pop()
                    self._pool[slot].conn.send(tasks[index])
                    busy[slot] = (index, time.monotonic() + self.timeout_s)
            next_deadline = min(deadline for _, deadline in busy.values())
            ready = wait([self._pool[s].conn for s in busy], timeout=max(0.0, next_deadline - time.monotonic()))
            for slot in list(busy):
                worker = self._pool[slot]
                index, deadline = busy[slot]
                if worker.conn in ready:
                    score = self._receive(worker, tasks[index])
                elif time.monotonic() >= deadline:
                    score = Score(self.wrong_reward, ScoreStatus.TIMEOUT)
                else:
                    continue
                out[index] = score
                del busy[slot]
                if score.status is ScoreStatus.TIMEOUT or worker.dead:
                    worker.kill()  # a hung worker cannot be interrupted, a dead one cannot answer: replace it
                    self._pool[slot] = _Worker(self._ctx, self.fn)
        return [s for s in out if s is not None]

    def _receive(self, worker: _Worker, task: tuple[str, str]) -> Score:
        try:
            kind, value = worker.conn.recv()
        except (EOFError, OSError):  # the worker died (os._exit, a segfault in a C extension)
            worker.dead = True
            log.warning("scorer worker died while scoring %r (exit code %s)", task[0][:80], worker.process.exitcode)
            return Score(self.wrong_reward, ScoreStatus.ERROR)
        if kind == "error":
            log.warning("scorer raised on %r: %s", task[0][:80], value)
            return Score(self.wrong_reward, ScoreStatus.ERROR)
        if value is None:
            return Score(self.wrong_reward, ScoreStatus.PARSE_FAILURE)
        return Score(value, ScoreStatus.OK)
