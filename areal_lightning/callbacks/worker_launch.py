"""Starting the async evaluation worker so that it is ready when the first round falls due.

The worker is forked from multiprocessing's fork server, which has torch, Lightning and torchmetrics
imported (`prestart`: ``areal-lightning fit`` calls it as soon as it has read an async config), and
started when fit starts (`WorkerLaunch`, from the callback's ``setup``), from a thread of its own:
neither training nor the first round's submission waits for it; messages sent meanwhile are queued
and sent in order once the worker runs. Without a fork server (Windows) the worker is spawned. The
fork server is one per process: other users of ``forkserver`` fork from it too, and one some other
code started first is used as it is. Why: docs/async_evaluation.md ("Ready when the first round
falls due").
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.util
import os
import shutil
import tempfile
import threading
import traceback
from collections.abc import Callable, Sequence
from multiprocessing import forkserver
from multiprocessing.connection import Connection
from typing import Any

PRELOAD: tuple[str, ...] = ("torch", "lightning", "torchmetrics", "areal_lightning.callbacks.async_evaluator")
"""What the fork server imports before it forks a worker (the worker's own module included)."""

_JOIN_SECS = 10.0  # how long stopping waits for a start still in progress (the fork server importing)


def start_method() -> str:
    """``forkserver`` where the platform has it, else ``spawn`` (never ``fork``: training has threads)."""
    return "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"


def prestart(modules: Sequence[str] = ()) -> None:
    """Starts the fork server now, importing `PRELOAD` and `modules`, and returns at once.

    Call it as early as the process knows it will evaluate asynchronously: the imports then run
    beside whatever it does next. A no-op where the server already runs (its imports are what it
    was started with) and where there is no fork server.

    Example:
        >>> prestart(["areal_lightning.rl.grpo.module"])  # doctest: +SKIP
    """
    if start_method() != "forkserver":
        return
    multiprocessing.set_forkserver_preload([*PRELOAD, *modules])  # read only when the server starts
    forkserver.ensure_running()


def _in_directory(conn: Connection, temp: str, target: Callable[..., None], *args: Any) -> None:
    """The worker's body: `target(conn, *args)` with `temp` as its temporary directory (and its
    children's), which the training process removes once the worker has ended."""
    os.environ["TMPDIR"] = temp
    tempfile.tempdir = None
    target(conn, *args)


class WorkerLaunch:
    """A worker process being started from a thread, and a pipe whose messages wait for it.

    ``target(conn, *args)`` runs in the worker, `conn` its end of the pipe. `send_bytes` never
    waits for the start: what is sent before the worker runs is queued and sent, in order, once
    it does. The worker's temporary directory is one of its own, removed by `stop`: a worker is
    terminated, not asked to clean up, and what it made there (a vLLM engine's sockets and files,
    a sandbox's directories) goes with it.
    """

    def __init__(self, target: Callable[..., None], args: Sequence[Any], name: str) -> None:
        ctx: Any = multiprocessing.get_context(start_method())  # a start method's context has `Process`
        self.conn, child = ctx.Pipe()
        self.temp = tempfile.mkdtemp(prefix="areal-worker-")
        os.chmod(self.temp, 0o711)  # a sandbox's programs run as another user and pass through it
        # Removed by `stop`, or as this process exits after multiprocessing ended its daemonic worker.
        self._remove_temp = multiprocessing.util.Finalize(
            None, shutil.rmtree, args=(self.temp,), kwargs={"ignore_errors": True}, exitpriority=-1
        )
        self.process = ctx.Process(target=_in_directory, args=(child, self.temp, target, *args), daemon=True, name=name)
        self.error: str | None = None
        """The traceback of a start that failed."""
        self._lock = threading.Lock()
        self._outbox: list[bytes] = []
        self._started = False
        self._stopped = False
        self._thread = threading.Thread(target=self._start, args=(child,), daemon=True, name=f"{name}-start")
        self._thread.start()

    def _start(self, child: Connection) -> None:
        try:
            self.process.start()
        except BaseException:  # noqa: BLE001 - reported as the worker's failure by `alive`
            self.error = traceback.format_exc()
        finally:
            child.close()
        with self._lock:
            self._started = True
            if self.error is None and self._stopped:
                self.process.terminate()  # stopped while it was starting: nobody waits for it
                return
            try:
                for data in self._outbox:
                    self.conn.send_bytes(data)
            except OSError:
                pass  # the worker died at once: `alive` says so, with its exit code
            self._outbox.clear()

    def send_bytes(self, data: bytes) -> None:
        """Sends `data` to the worker, or queues it while the worker is starting."""
        with self._lock:
            if not self._started:
                self._outbox.append(data)
                return
            if self.error is None:
                with contextlib.suppress(OSError):  # the worker died: `alive` says so, with its exit code
                    self.conn.send_bytes(data)

    @property
    def starting(self) -> bool:
        """The process is being started (the fork server may still be importing)."""
        return not self._started

    def alive(self) -> bool:
        """Starting, or started and not exited."""
        return not self._started or (self.error is None and self.process.is_alive())

    def exitcode(self) -> int | None:
        """The worker's exit code once it exited; None while it runs, or when it never started."""
        return self.process.exitcode if self._started and self.error is None else None

    def join(self, timeout: float) -> None:
        if self._started and self.error is None:
            self.process.join(timeout)

    def stop(self, ask: bool, grace: float) -> None:
        """Ends the worker: with `ask`, sends None and waits up to `grace` seconds for it to return;
        then terminates and, failing that, kills it. A start still in progress is waited for (up
        to a bound) or, past it, left to terminate the worker itself."""
        self._thread.join(_JOIN_SECS)
        with self._lock:
            self._stopped = True
            started = self._started and self.error is None
        if started:
            process = self.process
            if ask and process.is_alive():
                with contextlib.suppress(OSError):
                    self.conn.send(None)
                process.join(grace)
            if process.is_alive():
                process.terminate()
                process.join(grace)
            if process.is_alive():
                process.kill()
                process.join()
        self.conn.close()
        self._remove_temp()
