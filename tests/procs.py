"""Run a command in its own process group, and end the whole group when it runs too long.

`subprocess.run(..., timeout=...)` kills only the direct child: a `fit` that Lightning launched on
two devices leaves its second rank running (and holding the gloo port) after a timeout. Here the
child starts a new session, so its ranks and helpers share its process group, and a timeout
sends SIGTERM, then SIGKILL, to that group.
"""

from __future__ import annotations

import contextlib
import os
import pty
import re
import shlex
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

KILL_GRACE_S: float = 5.0
"""Seconds between SIGTERM and SIGKILL to the group of a command that ran too long."""


def kill_group(proc: subprocess.Popen, grace_s: float = KILL_GRACE_S) -> None:
    """SIGTERM to `proc`'s process group, SIGKILL after `grace_s`; then reaps `proc`."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break  # the whole group is gone already
        try:
            proc.wait(timeout=wait_s)
            if sig is signal.SIGTERM:
                # The leader is gone; ranks it launched may still be alive in the group.
                os.killpg(proc.pid, signal.SIGKILL)
            break
        except subprocess.TimeoutExpired:
            continue
        except ProcessLookupError:
            break
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace_s)


def run_in_group(cmd: Sequence[str], timeout: float, **kwargs: Any) -> subprocess.CompletedProcess:
    """Like ``subprocess.run(cmd, timeout=timeout, **kwargs)`` (text output captured unless told
    otherwise), but a timeout ends the command's whole process group before raising.

    Raises:
        subprocess.TimeoutExpired: the command ran past `timeout`; its group was killed first.
    """
    kwargs.setdefault("capture_output", True)
    kwargs.setdefault("text", True)
    check = kwargs.pop("check", False)
    capture = kwargs.pop("capture_output")
    if capture:
        kwargs.setdefault("stdout", subprocess.PIPE)
        kwargs.setdefault("stderr", subprocess.PIPE)
    proc = subprocess.Popen(list(cmd), start_new_session=True, **kwargs)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        out, err = proc.communicate()
        raise subprocess.TimeoutExpired(list(cmd), timeout, output=out, stderr=err) from None
    except BaseException:  # KeyboardInterrupt in the test runner: leave nothing behind
        kill_group(proc)
        raise
    finally:
        # A leader that exited normally may still have left ranks in its group.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
    done = subprocess.CompletedProcess(list(cmd), proc.returncode, out, err)
    if check:
        done.check_returncode()
    return done


def evaluate_command(config: os.PathLike[str] | str, ckpt: os.PathLike[str] | str, *args: str) -> list[str]:
    """``python -m areal_lightning evaluate -c CONFIG --ckpt CKPT ARGS`` with this interpreter."""
    return [sys.executable, "-m", "areal_lightning", "evaluate", "-c", str(config), "--ckpt", str(ckpt), *args]


def on_a_terminal(argv: list[str], timeout: float, cwd: Path) -> tuple[int, str]:
    """Runs `argv` with stdout and stderr on a pseudo-terminal (as a shell would), in its own process
    group that a timeout ends as a whole; returns (exit status, what the terminal showed)."""
    controller, terminal = pty.openpty()
    proc = subprocess.Popen(
        argv, cwd=cwd, stdin=subprocess.DEVNULL, stdout=terminal, stderr=terminal, start_new_session=True
    )
    os.close(terminal)
    shown: list[bytes] = []

    def read() -> None:
        with contextlib.suppress(OSError):  # EIO once the command and its children closed the terminal
            while chunk := os.read(controller, 65536):
                shown.append(chunk)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        status = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        raise AssertionError(
            f"`{shlex.join(argv)}` ran past {timeout} s:\n" + b"".join(shown).decode(errors="replace")[-3000:]
        ) from None
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 9)  # nothing the command started outlives the test
        reader.join(timeout=10)
        os.close(controller)
    return status, b"".join(shown).decode(errors="replace")


ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def round_lines_glued(shown: str, marker: str = "evaluation at step") -> list[str]:
    """The terminal lines where a round's line does not start the line: glued after a progress
    bar's last characters (ANSI codes removed; a carriage return starts a line too)."""
    lines = re.split(r"[\r\n]", ANSI.sub("", shown))
    return [line for line in lines if marker in line and not line.startswith(marker)]
