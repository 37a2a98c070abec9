"""Run an `areal-lightning` command in a process of its own, forked from a server that has imported
torch and Lightning once, instead of a fresh interpreter that pays those imports for each command
(about 5 s of CPU on a quiet 2-core box, 10-12 s on a loaded one; the docs pages run about twenty).

The server is multiprocessing's fork server of the test process, the one `ddp_utils.run_ddp` forks
its ranks from (the same preloaded modules, no torch op run before the fork). Each command's process
leads a session of its own (a timeout ends its whole group: ranks Lightning launched included), gets
the caller's environment, current directory and argv (argv[0] is the installed `areal-lightning`
script, so a multi-device run launches its other ranks as the user's command does), its stdout and
stderr in files, and calls the entry point, `areal_lightning.app.cli.main`. What only a fresh
interpreter shows (the console script, a command's own imports) is tested by the tests that run
the real command: tests/test_demo.py, tests/test_cli.py, tests/test_wheel.py.
"""

from __future__ import annotations

import atexit
import contextlib
import multiprocessing as mp
import os
import resource
import signal
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

from ddp_utils import _PRELOAD

SCRIPT = str(Path(sys.executable).parent / "areal-lightning")
KILL_GRACE_S = 5.0


class CliRun(subprocess.CompletedProcess):
    """A command's exit status and output, and `cpu_s`: the user and system CPU seconds it used
    (its own and its children's: the ranks it launched), for benchmarks/cli_server.py."""

    cpu_s: float


def _command(argv: list[str], cwd: str, env: dict[str, str], out: str, err: str, cpu: str) -> None:
    os.setsid()
    os.environ.clear()
    os.environ.update(env)
    tempfile.tempdir = None  # the server read TMPDIR once; the command reads its own, as a fresh process does
    os.chdir(cwd)
    for fd, path in ((1, out), (2, err)):
        os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    sys.argv = [SCRIPT, *argv]
    status = 1
    try:
        from areal_lightning.app.cli import main

        status = main(argv)
    except SystemExit as exit_:
        status = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
        if not isinstance(exit_.code, int | None):
            print(exit_.code, file=sys.stderr)
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
        os._exit(status)


def _cpu_s(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def _end_group(pid: int | None) -> None:
    if pid is not None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)


def run_cli(argv: list[str], timeout: float, cwd: Path, env: dict[str, str]) -> CliRun:
    """`areal-lightning ARGV` in `cwd` with `env`: its exit status and its text output.

    Raises:
        subprocess.TimeoutExpired: it ran past `timeout`; its process group was killed first.
    """
    mp.set_forkserver_preload(_PRELOAD)  # read when the server starts: the first use in a test process
    with tempfile.TemporaryDirectory(prefix="run_cli_") as tmp:
        out, err, cpu = (os.path.join(tmp, name) for name in ("stdout", "stderr", "cpu"))
        process = mp.get_context("forkserver").Process(target=_command, args=(argv, str(cwd), env, out, err, cpu))
        process.start()
        try:
            process.join(timeout)
            if process.is_alive():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(process.pid, signal.SIGTERM)
                process.join(KILL_GRACE_S)
                _end_group(process.pid)
                process.join()
                raise subprocess.TimeoutExpired(["areal-lightning", *argv], timeout, Path(out).read_text())
        finally:
            _end_group(process.pid)  # ranks or helpers the command left in its group
            if process.is_alive():
                process.kill()
                process.join()
        texts = [Path(p).read_text() if Path(p).is_file() else "" for p in (out, err, cpu)]
        done = CliRun(["areal-lightning", *argv], process.exitcode, texts[0], texts[1])
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
