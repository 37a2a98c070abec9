"""The sandbox's pool: `Sandbox` (pre-started workers, a program each at a time), and
`run_program`, `grade_program`, `program_with_tests` on a shared one-worker `Sandbox`.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import re
import select
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

from areal_lightning.errors import ArgumentError
from areal_lightning.scoring.sandbox.isolation import NOBODY_UID, Isolation
from areal_lightning.scoring.sandbox.leftovers import PREFIX, mark_owner, remove_leftovers
from areal_lightning.scoring.sandbox.results import ProgramStatus, SandboxLimits, SandboxResult
from areal_lightning.scoring.sandbox.worker import WORKER_GRACE_S, read_message, write_message

WORKER_START_S = 60.0
"""How long a worker may take to start and answer (imports included) beyond a program's own limit."""
__all__ = ["Sandbox", "close_all", "grade_program", "program_with_tests", "run_program"]


def _clean_environment(base: str) -> dict[str, str]:
    """The workers' whole environment: nothing of the caller's (no API keys, no tokens)."""
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": base, "TMPDIR": base}


class SandboxDirectoryError(PermissionError):
    """The sandbox's directory is one its programs' user cannot enter (the message names why)."""


def closed_directory(path: str, uid: int) -> str | None:
    """The first directory on the way to `path` (itself included) that user `uid`, whose group is
    `uid` too (`isolation.drop_to`), cannot pass through; None if there is none.

    Example:
        >>> closed_directory("/", 65534) is None
        True
    """
    target = Path(path).resolve()
    for directory in [*reversed(target.parents), target]:
        st = directory.stat()
        # One class of permission bits applies: the owner's, else the group's, else everyone's.
        bit = stat.S_IXUSR if st.st_uid == uid else stat.S_IXGRP if st.st_gid == uid else stat.S_IXOTH
        if not st.st_mode & bit:
            return str(directory)
    return None


def hidden_homes() -> list[str]:
    """The directories covered for every program: the caller's home, root's and /home."""
    return sorted({str(Path.home()), "/root", "/home"})


_PACKAGE_ROOT = str(Path(__file__).resolve().parents[3])
_WORKER_MAIN = (
    "import sys; sys.path.insert(0, sys.argv.pop(1)); from areal_lightning.scoring.sandbox.worker import main; main()"
)
"""The worker imports this very package (a checkout on PYTHONPATH, not another install): with ``-I``
the interpreter would ignore PYTHONPATH."""


class _Worker:
    """One worker process and its pipes."""

    def __init__(self, base: str, sandbox_uid: int | None, disk_bytes: int) -> None:
        env = _clean_environment(base)
        if sandbox_uid is not None and os.geteuid() == 0:
            env["SANDBOX_UID"] = str(sandbox_uid)
        env["SANDBOX_DISK_BYTES"] = str(disk_bytes)
        self.process = subprocess.Popen(
            [sys.executable, "-I", "-c", _WORKER_MAIN, _PACKAGE_ROOT, base, *hidden_homes()],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            cwd=base,
            close_fds=True,
            start_new_session=True,  # its group can be killed whole
        )
        assert self.process.stdin is not None and self.process.stdout is not None
        self.write_fd, self.read_fd = self.process.stdin.fileno(), self.process.stdout.fileno()

    def kill(self) -> None:
        # SIGTERM first: a keeper (`processes.keep`) kills its worker and all it left, then exits.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(self.process.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=WORKER_GRACE_S)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()
        for pipe in (self.process.stdin, self.process.stdout):
            if pipe is not None:
                pipe.close()

    def close(self) -> None:
        assert self.process.stdin is not None
        try:
            self.process.stdin.close()  # end of input: the worker exits
            self.process.wait(timeout=WORKER_GRACE_S)
        except (OSError, subprocess.TimeoutExpired):
            pass
        self.kill()


class Sandbox:
    """A pool of sandbox workers that run untrusted programs in parallel.

    Args:
        workers: programs run at once (worker processes, started on first use).
        limits: the default `SandboxLimits` of a program.
        sandbox_uid: the user a program runs as when this process is root (root's files, sockets
            and processes are then out of its reach); None keeps root (not advised).
        without: protections not to use (names from `Isolation.OPTIONAL`), as where the kernel
            refuses them: the fallback then holds (docs/code_evaluation.md). Not advised.
        directory: where the workers' directory is made (None: the system's temporary directory);
            `close` removes it, and nothing else of the sandbox is left there.

    Raises:
        ArgumentError: for a worker count that is not a positive integer, limits that are not
            `SandboxLimits`, a protection that cannot be left out or a directory that does not exist.

    Example:
        >>> with Sandbox(workers=2) as sandbox:  # doctest: +SKIP
        ...     [r.status.value for r in sandbox.run_many(["print(1)", "assert 1 == 2", "def f(:"])]
        ['passed', 'failed', 'syntax_error']
    """

    def __init__(
        self,
        workers: int = 1,
        limits: SandboxLimits | None = None,
        *,
        sandbox_uid: int | None = NOBODY_UID,
        without: Collection[str] = (),
        directory: str | os.PathLike[str] | None = None,
    ) -> None:
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ArgumentError("Sandbox", "workers", workers, "a positive integer")
        if limits is not None and not isinstance(limits, SandboxLimits):
            raise ArgumentError("Sandbox", "limits", limits, "a SandboxLimits or None")
        if isinstance(without, str) or not set(without) <= set(Isolation.OPTIONAL):
            raise ArgumentError("Sandbox", "without", without, f"a collection of names from {list(Isolation.OPTIONAL)}")
        if directory is not None and not os.path.isdir(directory):
            raise ArgumentError("Sandbox", "directory", directory, "an existing directory or None")
        self.workers, self.limits, self.sandbox_uid = workers, limits or SandboxLimits(), sandbox_uid
        self.without, self.directory = sorted(set(without)), None if directory is None else os.fspath(directory)
        self._pool: list[_Worker] = []
        self._base: str | None = None
        self._lock = threading.Lock()  # one batch at a time
        self._check_directory()

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:  # noqa: SIM105 - at interpreter shutdown module globals may already be None
            self.close()
        except Exception:  # noqa: BLE001
            pass

    def __getstate__(self) -> dict[str, Any]:
        # A copy (a spawned rank, a deepcopy of the task) starts its own workers.
        state = self.__dict__.copy()
        state.update(_pool=[], _base=None, _lock=None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def close(self) -> None:
        """Stops the workers and removes their directory (they start again on the next call)."""
        _STARTED.pop(self, None)
        pool, self._pool = self._pool, []
        for worker in pool:
            worker.close()
        base, self._base = self._base, None
        if base is not None:
            shutil.rmtree(base, ignore_errors=True)

    def run(self, source: str, limits: SandboxLimits | None = None) -> SandboxResult:
        """Runs one program; see `run_many`."""
        return self.run_many([source], limits)[0]

    def run_many(self, sources: Sequence[str], limits: SandboxLimits | None = None) -> list[SandboxResult]:
        """Runs each program in its own sandboxed processes, `workers` at a time; results in order.

        Whatever a program does, it ends with a `ProgramStatus` and leaves no process and no file
        behind; a worker that dies or stops answering is replaced and its program is ``crashed``
        or ``timeout``.

        Raises:
            TypeError: for a source that is not a string.
        """
        for source in sources:
            if not isinstance(source, str):
                raise TypeError(f"Sandbox.run_many takes program sources as strings, got {type(source).__name__}")
        job_limits = (limits or self.limits).as_job()
        with self._lock:
            jobs = [{"source": s, "limits": job_limits, "without": self.without} for s in sources]
            return self._run(jobs, job_limits["wall_s"])

    def _check_directory(self) -> None:
        """Refuses a directory that the programs' user cannot enter (when the workers start as root
        and run the programs as `sandbox_uid`): each program would end ``crashed``."""
        uid, where = self.sandbox_uid, self.directory or tempfile.gettempdir()
        closed = closed_directory(where, uid) if uid is not None and os.geteuid() == 0 else None
        if closed is not None:
            closed_st = os.stat(closed)
            raise SandboxDirectoryError(
                f"the sandbox's programs run as uid {uid}, who cannot enter {closed} (mode "
                f"{stat.S_IMODE(closed_st.st_mode):o}, owner uid {closed_st.st_uid}) on the way to their "
                f"directory in {where}: set TMPDIR (or the sandbox's directory) to a directory every user can "
                "enter, such as /tmp"
            )

    def _ensure_workers(self, n: int) -> None:
        if self._base is None:
            remove_leftovers(self.directory)  # those of sandboxes whose process was killed
            self._check_directory()  # TMPDIR may have changed since the sandbox was made
            base = tempfile.mkdtemp(prefix=PREFIX, dir=self.directory)
            self._base = base
            mark_owner(self._base)
            os.chmod(self._base, 0o711)  # workers' directories can be entered, not listed
            _STARTED[self] = os.getpid()
        while len(self._pool) < n:
            self._pool.append(_Worker(self._base, self.sandbox_uid, self.limits.max_disk_bytes))

    def _run(self, jobs: list[dict[str, Any]], wall_s: float) -> list[SandboxResult]:
        self._ensure_workers(min(self.workers, len(jobs)))
        out: list[SandboxResult | None] = [None] * len(jobs)
        pending = list(range(len(jobs)))[::-1]
        busy: dict[int, tuple[int, float]] = {}  # pool slot -> (job index, deadline)
        while pending or busy:
            for slot in range(len(self._pool)):
                if slot not in busy and pending:
                    index = pending.pop()
                    busy[slot] = (index, time.monotonic() + wall_s + WORKER_GRACE_S + WORKER_START_S)
                    with contextlib.suppress(OSError):  # a dead worker: its read end reports end of file below
                        write_message(self._pool[slot].write_fd, jobs[index])
            timeout = max(0.0, min(d for _, d in busy.values()) - time.monotonic())
            ready = select.select([self._pool[s].read_fd for s in busy], [], [], timeout)[0]
            for slot in list(busy):
                worker, (index, deadline) = self._pool[slot], busy[slot]
                if worker.read_fd in ready:
                    report = _read_report(worker)
                elif time.monotonic() >= deadline:
                    report = {"status": ProgramStatus.TIMEOUT.value, "worker_lost": True}
                else:
                    continue
                out[index] = SandboxResult.from_report(report)
                del busy[slot]
                if "worker_lost" in report or "abnormal" in report:
                    worker.kill()
                    assert self._base is not None
                    self._pool[slot] = _Worker(self._base, self.sandbox_uid, self.limits.max_disk_bytes)
        return [r for r in out if r is not None]


_STARTED: weakref.WeakKeyDictionary[Sandbox, int] = weakref.WeakKeyDictionary()
"""The sandboxes whose workers' directory exists, and the process that made it (a forked copy is
not its owner: its workers are the parent's)."""


def close_all() -> None:
    """Closes every sandbox of this process that has started workers: they stop and their
    directories go. The commands call it before they return, so that a process that ends without
    running finalizers (`os._exit`, as a forked one does) leaves nothing behind.

    Example:
        >>> box = Sandbox()
        >>> box.run("print(1)").passed, os.path.isdir(box._base)  # doctest: +SKIP
        (True, True)
        >>> close_all(); box._base is None  # doctest: +SKIP
        True
    """
    for sandbox, owner in list(_STARTED.items()):
        if owner == os.getpid():
            sandbox.close()


def _read_report(worker: _Worker) -> dict[str, Any]:
    try:
        report = read_message(worker.read_fd)
    except (OSError, ValueError):
        report = None
    if report is None:  # the worker died: its program is recorded, the worker replaced
        return {"status": ProgramStatus.CRASHED.value, "worker_lost": True}
    return dict(report)


@functools.cache
def _default_sandbox() -> Sandbox:
    sandbox = Sandbox()
    atexit.register(sandbox.close)
    return sandbox


def run_program(source: str, limits: SandboxLimits | None = None) -> SandboxResult:
    """Runs one untrusted Python program in the sandbox and returns how it ended.

    The program runs as ``__main__`` in processes of its own (a shared one-worker `Sandbox` of
    this process), in an empty temporary directory that is removed afterwards, with stdin empty.

    Args:
        source: the program's Python source.
        limits: its `SandboxLimits`; None: the defaults.

    Example:
        >>> result = run_program("print(sum(range(10)))")  # doctest: +SKIP
        >>> result.status.value, result.output  # doctest: +SKIP
        ('passed', '45\\n')
    """
    return _default_sandbox().run(source, limits)


_DEFINES_CHECK = re.compile(r"^(?:async[ \t]+)?def[ \t]+check[ \t]*\(", re.MULTILINE)
"""A top-level ``def check(`` (HumanEval's tests); one inside a string counts too, which refuses more, never less."""


def program_with_tests(program: str, tests: str, entry_point: str | None = None) -> str:
    """The program that grades `program`: the program, then `tests`, then ``check(entry_point)``
    when an entry point is given (HumanEval's tests define ``check(candidate)``).

    Raises:
        ValueError: for tests that define ``check`` without an entry point to call it with (no
            test would run: every program would pass).

    Example:
        >>> print(program_with_tests("def f(x):\\n    return x", "def check(c):\\n    assert c(1) == 1", "f"))
        def f(x):
            return x
        <BLANKLINE>
        def check(c):
            assert c(1) == 1
        <BLANKLINE>
        check(f)
        <BLANKLINE>
    """
    if not entry_point and _DEFINES_CHECK.search(tests):
        raise ValueError(
            f"program_with_tests: the tests define `check(candidate)` but entry_point is {entry_point!r}: "
            "give the name of the function `check` is called with (HumanEval's `entry_point`), or give "
            "tests of plain asserts (MBPP's `test_list`) with entry_point=None"
        )
    check = f"\ncheck({entry_point})\n" if entry_point else ""
    return f"{program}\n\n{tests}\n{check}"


def grade_program(
    program: str, tests: str, entry_point: str | None = None, limits: SandboxLimits | None = None
) -> SandboxResult:
    """Grades one program against one problem's tests in the sandbox: ``passed`` when every test passed.

    Args:
        program: the candidate program (a whole module: imports, the function, helpers).
        tests: the problem's test code: asserts (MBPP's ``test_list`` joined by lines) or a
            ``check(candidate)`` function (HumanEval's ``test``).
        entry_point: the function ``check`` is called with; None when `tests` are plain asserts.
        limits: the program's `SandboxLimits`; None: the defaults.

    Raises:
        ValueError: for tests that define ``check`` with no `entry_point` (`program_with_tests`).

    Example:
        >>> grade_program("def add(a, b):\\n    return a + b", "assert add(2, 3) == 5").status.value  # doctest: +SKIP
        'passed'
        >>> grade_program("def add(a, b):\\n    return a - b", "assert add(2, 3) == 5").status.value  # doctest: +SKIP
        'failed'
    """
    return run_program(program_with_tests(program, tests, entry_point), limits)
