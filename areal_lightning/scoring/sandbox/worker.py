"""The sandbox's worker process: runs one program at a time, each in processes of its own.

Started by `Sandbox` as ``python -I -m areal_lightning.scoring.sandbox.worker BASE_DIR`` with an
environment that holds nothing of the caller's. It reads jobs (length-prefixed JSON) on stdin and
answers each on stdout. Per job it forks the program's process (`processes.fork_program`),
which isolates itself (`isolation.isolate_program`) and runs the program; the worker
enforces the wall clock, kills whatever is left of the program, removes its temporary directory,
then reports its status. Forking an interpreter that is already running (and has the usual
modules imported) is what makes a program cost milliseconds rather than an interpreter start.
Standard library only.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import stat
import struct
import sys
import tempfile
import time
import traceback
import types
from typing import Any

from areal_lightning.scoring.sandbox import isolation as iso, processes as procs

PRELOADED = [
    "array",
    "bisect",
    "cmath",
    "collections",
    "copy",
    "dataclasses",
    "datetime",
    "decimal",
    "enum",
    "fractions",
    "functools",
    "hashlib",
    "heapq",
    "itertools",
    "json",
    "math",
    "numbers",
    "operator",
    "random",
    "re",
    "statistics",
    "string",
    "struct",
    "textwrap",
    "typing",
    "unicodedata",
]
"""Modules imported once in the worker, so that a program importing them pays nothing."""
WORKER_GRACE_S = 5.0
"""How long past a program's wall limit its worker may take to answer (set-up, teardown) before it is replaced."""
_HEADER = struct.Struct(">I")
_OUTPUT_NAME = ".output"
ERROR_CHARS = 300
"""Characters kept of a program's uncaught exception (`SandboxResult.error`)."""
_CHILD_FAILED = 70
_CPU_TICK_S = 0.1  # the kernel checks RLIMIT_CPU on its clock ticks; rusage may read a little below the limit


def read_message(fd: int) -> Any:
    """One length-prefixed JSON message from `fd`; None at end of file."""
    header = _read_exactly(fd, _HEADER.size)
    if header is None:
        return None
    body = _read_exactly(fd, _HEADER.unpack(header)[0])
    return None if body is None else json.loads(body)


def write_message(fd: int, message: Any) -> None:
    body = json.dumps(message).encode()
    data = _HEADER.pack(len(body)) + body
    while data:
        data = data[os.write(fd, data) :]


def _read_exactly(fd: int, n: int) -> bytes | None:
    chunks, got = [], 0
    while got < n:
        chunk = os.read(fd, n - got)
        if not chunk:
            return None
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


# ----------------------------------------------------------------------------- the program's process
def _close_all_but(*keep: int) -> None:
    low = 3
    for fd in sorted(keep):
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, 1 << 16)


def _run_program(job: dict[str, Any], paths: tuple[str, str], out_fd: int, result_w: int, held: list[str]) -> None:
    """Process 1 of the program's PID namespace: isolates itself, runs the program, writes its status line."""
    tempdir, area = paths
    os.setsid()  # a group of its own
    procs.die_with_parent()
    held = held + iso.isolate_program(tempdir, area, held)
    os.chdir(tempdir)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(out_fd, 1)
    os.dup2(out_fd, 2)
    _close_all_but(result_w)  # the worker's pipes stay out of the program's reach
    os.environ.clear()
    os.environ.update(HOME=tempdir, TMPDIR=tempdir, PATH="/usr/local/bin:/usr/bin:/bin", LANG="C.UTF-8")
    iso.set_limits(job["limits"])
    status, error = _execute(job["source"])
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    said = {"status": status, "error": error, "isolation": held}
    os.write(result_w, f"{job['nonce']} {json.dumps(said)}\n".encode())
    os._exit(0)


def _execute(source: str) -> tuple[str, str | None]:
    """Compiles and runs `source` as ``__main__``; its status as the program saw it, and its
    uncaught exception in one line."""
    try:
        code = compile(source, "<program>", "exec")
    except MemoryError:
        return "out_of_memory", "MemoryError"
    except (SyntaxError, ValueError, OverflowError, RecursionError) as err:
        with contextlib.suppress(Exception):
            traceback.print_exception(err, limit=0)
        return "syntax_error", _one_line(err)
    main = types.ModuleType("__main__")
    sys.modules["__main__"] = main
    sys.argv = ["<program>"]
    try:
        exec(code, main.__dict__)
    except MemoryError as err:
        _print_error(err)
        return "out_of_memory", _one_line(err)
    except BaseException as err:  # noqa: BLE001 - SystemExit included: a program that exits did not pass its tests
        _print_error(err)
        return "failed", _one_line(err)
    return "passed", None


def _one_line(err: BaseException) -> str:
    text = f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
    return text.splitlines()[0][:ERROR_CHARS] if text else type(err).__name__


def _print_error(err: BaseException) -> None:
    """The program's traceback, without the worker's own frame (nothing when its output is full)."""
    with contextlib.suppress(Exception):
        traceback.print_exception(type(err), err, err.__traceback__.tb_next if err.__traceback__ else None, limit=-8)


# ----------------------------------------------------------------------------- the worker's side
def _wait_program(pid: int, result_r: int, limits: dict[str, Any]) -> tuple[bytes, int, Any, bool, bool]:
    """Waits for the program until its wall limit, reading its status line, then kills its whole
    tree and reaps it, whatever it did to its descriptors, signals or process state.

    Returns its status line, its wait status and usage, whether the wall clock ended it, and
    whether its exit was clean (it exited by itself, was never stopped and needed no kill)."""
    deadline = time.monotonic() + limits["wall_s"]
    pidfd = os.pidfd_open(pid)
    line, timed_out, channel = b"", False, [pidfd, result_r]
    while True:  # only the program's exit or the clock ends this wait, never the channel
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            timed_out = True
            break
        ready, _, _ = select.select(channel, [], [], remaining)
        if result_r in ready:
            chunk = os.read(result_r, 512)
            line += chunk
            if not chunk or len(line) > 4096:
                channel = [pidfd]  # closed (or flooded): the exit or the clock, nothing else
        elif pidfd in ready:
            break
    os.close(pidfd)
    clean = not timed_out
    while True:
        if not clean or timed_out:
            _kill_tree(pid)
        _, wait_status, usage = os.wait4(pid, 0)
        if os.WIFEXITED(wait_status) or os.WIFSIGNALED(wait_status):
            return line, wait_status, usage, timed_out, clean
        clean = False  # stopped (it made us its tracer): killed, then reaped


def _kill_tree(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)  # process 1 of its PID namespace: every process in it dies
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def _status(job: dict[str, Any], line: bytes, wait_status: int, usage: Any, timed_out: bool) -> dict[str, Any]:
    exit_code = os.waitstatus_to_exitcode(wait_status)
    code, sig = (exit_code, None) if exit_code >= 0 else (None, -exit_code)
    nonce, _, said_json = line.decode(errors="replace").partition("\n")[0].partition(" ")
    said: dict[str, Any] = {}
    if nonce == job["nonce"]:
        with contextlib.suppress(ValueError):
            said = json.loads(said_json)
    reported = said.get("status")
    cpu_used = usage.ru_utime + usage.ru_stime
    limit = "wall_s" if timed_out else None
    if not timed_out and (
        sig == signal.SIGXCPU or (sig == signal.SIGKILL and cpu_used >= job["limits"]["cpu_s"] - _CPU_TICK_S)
    ):
        limit = "cpu_s"
    if limit is not None:
        status = "timeout"
    elif reported is not None and code == 0:
        status = reported
    else:
        status = "crashed"  # a signal, or an exit before the program's end (os._exit)
    isolation = said.get("isolation", [])
    error = said.get("error") if status == reported else None
    return {"status": status, "exit_code": code, "signal": sig, "isolation": isolation, "limit": limit, "error": error}


def run_job(job: dict[str, Any], area: str, held: list[str], proc_fd: int) -> dict[str, Any]:
    """Runs one program (``job["source"]`` under ``job["limits"]``) and returns its report; the
    report has ``abnormal`` (why) when this worker must not run another program. Every process of
    the program is dead before it returns (`proc_fd`: the machine's /proc, `procs.open_proc`)."""
    limits = job["limits"]
    job["nonce"] = os.urandom(16).hex()
    tempdir = tempfile.mkdtemp(prefix="p", dir=area)  # fresh for each program, removed afterwards
    out_fd = os.open(os.path.join(tempdir, _OUTPUT_NAME), os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    result_r, result_w = os.pipe()
    started = time.monotonic()
    try:
        pid, in_pid_ns = procs.fork_program(iso.Isolation.PID_NS not in job.get("without", ()))
        if pid == 0:
            try:
                os.close(result_r)
                _run_program(
                    job, (tempdir, area), out_fd, result_w, held + ([iso.Isolation.PID_NS] if in_pid_ns else [])
                )
            finally:
                os._exit(_CHILD_FAILED)
        os.close(result_w)
        line, wait_status, usage, timed_out, clean = _wait_program(pid, result_r, limits)
        report = _status(job, line, wait_status, usage, timed_out)
        report["wall_s"] = time.monotonic() - started
        left_behind = procs.kill_descendants(proc_fd, os.getpid())  # without a PID namespace, what it left
        output = os.pread(out_fd, limits["max_output_bytes"] + 1, 0)
    finally:
        os.close(result_r)
        os.close(out_fd)
        _remove(tempdir)
    abnormal = [
        *(["it did not exit cleanly"] if not clean or report["status"] == "crashed" else []),
        *([f"{left_behind} of its processes outlived it"] if left_behind else []),
        *([f"it left {sorted(os.listdir(area))[:3]} in the shared directory"] if os.listdir(area) else []),
    ]
    if abnormal:
        report["abnormal"] = "; ".join(abnormal)
    if not in_pid_ns:
        report["isolation"] = [name for name in report["isolation"] if name != iso.Isolation.PID_NS]
    report["truncated"] = len(output) > limits["max_output_bytes"]
    report["output"] = output[: limits["max_output_bytes"]].decode(errors="replace")
    return report


def _remove(path: str) -> None:
    def make_writable(func: Any, name: str, _exc: Any) -> None:
        parent = os.path.dirname(name)
        with contextlib.suppress(OSError):
            os.chmod(parent, stat.S_IRWXU)
            os.chmod(name, stat.S_IRWXU)
        with contextlib.suppress(OSError):
            func(name)

    shutil.rmtree(path, onerror=make_writable)
    if os.path.exists(path):
        shutil.rmtree(path, ignore_errors=True)


def main() -> None:
    """The worker's loop: isolate itself once, then a job in, a report out, until stdin closes."""
    base, homes = sys.argv[1], sys.argv[2:]
    sandbox_uid = int(os.environ.get("SANDBOX_UID", "-1"))
    proto_in, proto_out = os.dup(0), os.dup(1)
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    area = tempfile.mkdtemp(prefix="w", dir=base)
    os.chmod(area, 0o711)  # programs' directories can be entered, not listed
    proc_fd = procs.open_proc()  # before the worker's own root, which has none
    keeper = os.getpid() if os.geteuid() == 0 and sandbox_uid >= 0 else None
    if keeper is not None and (worker := os.fork()) != 0:
        os.close(proto_in)  # the pool sees the end of the worker, not of its keeper
        os.close(proto_out)
        procs.keep(worker, proc_fd)
    procs.make_subreaper()  # not inherited by a fork: set by the keeper and the worker each
    disk_bytes = int(os.environ.get("SANDBOX_DISK_BYTES", str(64 << 20)))
    held = iso.isolate_worker(area, homes, sandbox_uid if sandbox_uid >= 0 else None, disk_bytes)
    if keeper is not None:  # after the uid drop, which clears it
        procs.die_with_parent()
        if os.getppid() != keeper:
            return  # it died before
    for name in PRELOADED:
        __import__(name)
    while (job := read_message(proto_in)) is not None:
        try:
            report = run_job(job, area, held, proc_fd)
        except Exception as err:  # noqa: BLE001 - the caller records it and replaces this worker
            procs.kill_descendants(proc_fd, os.getpid())
            error = f"{type(err).__name__}: {err}"
            report = {"status": "crashed", "error": error, "isolation": [], "abnormal": error}
        write_message(proto_out, report)
        if "abnormal" in report:
            break  # whatever it saw may reach the next program: the pool starts a fresh worker
    if iso.Isolation.OWN_TMPFS not in held:
        _remove(area)


if __name__ == "__main__":
    main()
