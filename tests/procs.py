"""Run a command in its own process group, and end the whole group when it runs too long.

`subprocess.run(..., timeout=...)` kills only the direct child: a `fit` that Lightning launched on
two devices leaves its second rank running (and holding the gloo port) after a timeout. Here the
child starts a new session, so its ranks and helpers share its process group, and a timeout
sends SIGTERM, then SIGKILL, to that group.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
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
