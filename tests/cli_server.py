"""Run an `areal-lightning` command in a process of its own, forked from a server that has imported
torch and Lightning once, instead of a fresh interpreter that pays those imports for each command
(about 5 s of CPU on a quiet 2-core box, 10-12 s on a loaded one; the docs pages run about twenty).

The server is multiprocessing's fork server of the test process, the one `ddp_utils.run_ddp` forks
its ranks from (the same preloaded modules, no torch op run before the fork). Each command's process
leads a session of its own (a timeout ends its whole group: ranks Lightning launched included), gets
the caller's environment, current directory and argv (argv[0] is the installed `areal-lightning`
script, so a multi-device run launches its other ranks as the user's command does), its stdout and
stderr in files, pipes or /dev/null (buffered as a fresh interpreter's would be), and calls the
entry point, `areal_lightning.app.cli.main`, or runs a test's wrapper script as `__main__`.
`run_cli` runs a command to its end; `start_cli` hands back a running one to signal, kill or read.
The example scripts run this way too (tests/test_examples.py). What only a fresh interpreter shows
(the console script, a command's own imports) is tested by the tests that run the real command:
tests/test_demo.py, tests/test_cli.py, tests/test_wheel.py.
"""

from __future__ import annotations

import atexit
import contextlib
import io
import multiprocessing as mp
import os
import resource
import runpy
import signal
import subprocess
import sys
import tempfile
import traceback
from multiprocessing import reduction
from pathlib import Path
from typing import IO, Any

from ddp_utils import _PRELOAD

SCRIPT = str(Path(sys.executable).parent / "areal-lightning")
KILL_GRACE_S = 5.0


class CliRun(subprocess.CompletedProcess):
    """A command's exit status and output, and `cpu_s`: the user and system CPU seconds it used
    (its own and its children's: the ranks it launched), for benchmarks/cli_server.py."""

    cpu_s: float


Output = int | IO[Any] | None
"""Where a started command's stdout or stderr goes, as `subprocess.Popen` takes it: `PIPE` (read it
from the `CliProcess`), `DEVNULL`, `STDOUT` (stderr only: with stdout), an open file, or None (a
file of the command's own, read by `run_cli`)."""


class _Fd:
    """A file descriptor of the caller that the forked command gets a copy of: multiprocessing sends
    it to the fork server with the process (`reduction.DupFd`), as it sends a `Connection`'s."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __reduce__(self) -> tuple[Any, ...]:
        return (_inherited_fd, (reduction.DupFd(self.fd),))


def _inherited_fd(dup: Any) -> int:
    return dup.detach()


def _stdio(fd: int, env: dict[str, str], *, stderr: bool) -> io.TextIOWrapper:
    """The stream a fresh interpreter makes for `fd` (its buffering read from `env`, not from the
    fork server's own stdio): block-buffered on a pipe or file, line-buffered on a terminal (stderr
    always), written through with PYTHONUNBUFFERED."""
    unbuffered = bool(env.get("PYTHONUNBUFFERED"))
    raw = io.FileIO(fd, "w", closefd=False)
    binary: IO[bytes] = raw if unbuffered else io.BufferedWriter(raw)
    return io.TextIOWrapper(
        binary,
        encoding="utf-8",
        errors="backslashreplace" if stderr else "strict",
        line_buffering=stderr or os.isatty(fd),
        write_through=unbuffered,
    )


def _command(
    argv: list[str],
    cwd: str,
    env: dict[str, str],
    out: int | str,
    err: int | str | None,
    cpu: str,
    started: int,
    script: str | None,
) -> None:
    """The forked command: `areal_lightning.app.cli.main(argv)`, or with `script` ``python SCRIPT
    ARGV`` (run as `__main__`, its directory first on sys.path). `out` and `err` are a file's path
    or a descriptor (an `_Fd` arrives as its int); `err` None: with stdout. `started` gets a byte
    once the command leads its group."""
    os.setsid()
    os.write(started, b"1")  # the caller may signal the group from now on
    os.close(started)
    os.environ.clear()
    os.environ.update(env)
    tempfile.tempdir = None  # the server read TMPDIR once; the command reads its own, as a fresh process does
    os.chdir(cwd)
    for fd, where in ((1, out), (2, err)):
        if where is None:
            os.dup2(1, 2)
            continue
        if isinstance(where, str):
            where = os.open(where, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(where, fd)
        os.close(where)
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    sys.stdout, sys.stderr = _stdio(1, env, stderr=False), _stdio(2, env, stderr=True)
    sys.argv = [script or SCRIPT, *argv]
    status = 1
    try:
        if script is not None:
            sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
            runpy.run_path(script, run_name="__main__")
            status = 0
        else:
            from areal_lightning.app.cli import main

            status = main(argv)
    except SystemExit as exit_:
        status = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
        if not isinstance(exit_.code, int | None):
            print(exit_.code, file=sys.stderr)
    except KeyboardInterrupt:
        # What an interpreter does with a KeyboardInterrupt nothing caught: the traceback, then it
        # ends itself by SIGINT (exit status -2; 130 in a shell).
        traceback.print_exc()
        status = -signal.SIGINT
    except BaseException:
        traceback.print_exc()
    finally:
        # What an interpreter does as it exits: its exit handlers (W&B's service teardown among
        # them) run before the process ends, so nothing the command started writes after it.
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
        with open(cpu, "w") as f:  # what the command cost, its ranks and helpers included
            f.write(repr(sum(_cpu_s(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))))
        if status < 0:
            signal.signal(-status, signal.SIG_DFL)
            os.kill(os.getpid(), -status)
        os._exit(status)


def _cpu_s(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def _end_group(pid: int | None) -> None:
    if pid is not None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)


class CliProcess:
    """An `areal-lightning` command started by `start_cli`, read as a `subprocess.Popen`: `pid` (its
    process group's id too: signal the group with ``os.killpg``), `poll`, `wait`, `returncode`
    (``-N`` for a command ended by signal N), and `stdout`/`stderr` where they were `PIPE`.
    `procs.kill_group` ends one as it ends a Popen's group. A context manager: leaving it (or
    `close`) ends the group and removes the command's files."""

    def __init__(
        self, argv: list[str], cwd: Path, env: dict[str, str], stdout: Output, stderr: Output, script: Path | None
    ) -> None:
        self.args = [str(script) if script else "areal-lightning", *argv]
        self._tmp = tempfile.TemporaryDirectory(prefix="run_cli_")
        self.out_path, self.err_path, self.cpu_path = (
            os.path.join(self._tmp.name, name) for name in ("stdout", "stderr", "cpu")
        )
        self.stdout: IO[str] | None = None
        self.stderr: IO[str] | None = None
        ours: list[int] = []  # the caller's copies of what the child gets, closed once it has them

        def target(where: Output, path: str, reader: str) -> _Fd | str:
            if where is None:
                return path
            if where == subprocess.PIPE:
                read, write = os.pipe()
                setattr(self, reader, open(read, encoding="utf-8", errors="replace"))  # noqa: SIM115
                ours.append(write)
                return _Fd(write)
            if where == subprocess.DEVNULL:
                fd = os.open(os.devnull, os.O_WRONLY)
                ours.append(fd)
                return _Fd(fd)
            assert not isinstance(where, int), f"unsupported output {where}"
            return _Fd(where.fileno())

        out = target(stdout, self.out_path, "stdout")
        err = None if stderr == subprocess.STDOUT else target(stderr, self.err_path, "stderr")
        started_r, started_w = os.pipe()
        ours.append(started_w)
        mp.set_forkserver_preload(_PRELOAD)  # read when the server starts: the first use in a test process
        self._process = mp.get_context("forkserver").Process(
            target=_command,
            args=(argv, str(cwd), env, out, err, self.cpu_path, _Fd(started_w), script and str(script)),
        )
        try:
            self._process.start()
        finally:
            for fd in ours:
                os.close(fd)
        with open(started_r, "rb") as started:
            started.read(1)  # after setsid (or the child is gone): its group can be signalled
        self.pid: int = self._process.pid  # type: ignore[assignment]

    @property
    def returncode(self) -> int | None:
        return self._process.exitcode

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """The exit status, once the command ended.

        Raises:
            subprocess.TimeoutExpired: it still runs after `timeout` seconds.
        """
        self._process.join(timeout)
        if self._process.exitcode is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        return self._process.exitcode

    def end(self) -> None:
        """SIGTERM to the group, SIGKILL after `KILL_GRACE_S`, and what is left of it killed."""
        if self._process.exitcode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, signal.SIGTERM)
            self._process.join(KILL_GRACE_S)
        _end_group(self.pid)  # ranks or helpers the command left in its group
        if self._process.is_alive():
            self._process.kill()
        self._process.join()

    def output(self, path: str) -> str:
        return Path(path).read_text() if Path(path).is_file() else ""

    def close(self) -> None:
        """`end`, then the pipes and the command's files closed and removed."""
        self.end()
        for stream in (self.stdout, self.stderr):
            if stream is not None:
                stream.close()
        self._tmp.cleanup()

    def __enter__(self) -> CliProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def start_cli(
    argv: list[str],
    cwd: Path | str,
    env: dict[str, str],
    *,
    stdout: Output = None,
    stderr: Output = None,
    script: Path | None = None,
) -> CliProcess:
    """`areal-lightning ARGV` (with `script`: ``python SCRIPT ARGV``, a test's wrapper of the command)
    started in `cwd` with `env`, forked from the fork server, in a session (process group) of its
    own; returns once its group exists. Use it as a context manager.

    Example: ``with start_cli(["fit", "-c", "run.yaml"], tmp, env, stderr=log) as fit: ...``
    """
    return CliProcess(list(argv), Path(cwd), env, stdout, stderr, script)


def run_cli(argv: list[str], timeout: float, cwd: Path, env: dict[str, str], *, script: Path | None = None) -> CliRun:
    """`areal-lightning ARGV` (or ``python SCRIPT ARGV``) in `cwd` with `env`: its exit status and
    its text output.

    Raises:
        subprocess.TimeoutExpired: it ran past `timeout`; its process group was killed first.
    """
    with start_cli(argv, cwd, env, script=script) as command:
        try:
            command.wait(timeout)
        except subprocess.TimeoutExpired:
            command.end()
            raise subprocess.TimeoutExpired(command.args, timeout, command.output(command.out_path)) from None
        command.end()  # ranks or helpers the command left in its group, before its output is read
        texts = [command.output(p) for p in (command.out_path, command.err_path, command.cpu_path)]
        done = CliRun(command.args, command.wait(), texts[0], texts[1])
        done.cpu_s = float(texts[2] or "nan")
        return done


def run_command(
    cmd: list[str], timeout: float, cwd: Path | str | None = None, env: dict[str, str] | None = None
) -> CliRun:
    """`procs.run_in_group`'s call for a ``python -m areal_lightning ARGS`` command (this
    interpreter's), run as `run_cli` runs it: the caller's directory and environment unless given."""
    if list(cmd[:3]) != [sys.executable, "-m", "areal_lightning"]:
        raise ValueError(f"not an areal-lightning command of this interpreter: {cmd[:3]}")
    return run_cli(list(cmd[3:]), timeout, Path(cwd or os.getcwd()), dict(os.environ if env is None else env))
