"""The process side of the code sandbox: forking a program's process and killing its whole tree.

A program runs as process 1 of a PID namespace of its own where the kernel allows it (when process 1
ends, the kernel kills every process in the namespace); otherwise, or when `Sandbox` is told to go
without one, as a plain child of its worker. Either way the worker is a child subreaper: whatever
the program leaves behind is re-parented to the worker, which kills it (`kill_descendants`) before
it reports the program's status. Standard library only (`ctypes`).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import platform
import signal

from areal_lightning.scoring.sandbox.isolation import CLONE_NEWNS, CLONE_NEWPID, prctl

_PR_SET_PDEATHSIG, _PR_SET_CHILD_SUBREAPER = 1, 36
_SYS_CLONE = {"x86_64": 56, "aarch64": 220, "riscv64": 220}
_SIGCHLD = 17
_pylibc = ctypes.PyDLL(None, use_errno=True)  # holds the GIL across the call, as os.fork does


def make_subreaper() -> None:
    """Orphaned descendants of this process are re-parented to it (so that it can kill them)."""
    prctl(_PR_SET_CHILD_SUBREAPER, 1)


def die_with_parent() -> None:
    """This process gets SIGKILL when its parent ends."""
    prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def open_proc() -> int:
    """A descriptor of the machine's /proc, opened before the worker leaves the machine's root (its
    own root has no /proc of its own: `kill_descendants` reads the tree through this one)."""
    return os.open("/proc", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)


def fork_program(pid_namespace: bool) -> tuple[int, bool]:
    """Forks (as `os.fork`) the program's process: with `pid_namespace`, into a new PID and mount
    namespace where the child is process 1, `(pid, True)`; else, or where the kernel refuses,
    a plain fork, `(pid, False)` (0 in the child)."""
    number = _SYS_CLONE.get(platform.machine())
    if pid_namespace and number is not None:
        ctypes.pythonapi.PyOS_BeforeFork()
        pid = _pylibc.syscall(number, CLONE_NEWPID | CLONE_NEWNS | _SIGCHLD, 0, 0, 0, 0)
        if pid == 0:
            ctypes.pythonapi.PyOS_AfterFork_Child()
            return 0, True
        ctypes.pythonapi.PyOS_AfterFork_Parent()
        if pid > 0:
            return pid, True
    return os.fork(), False


def _read_at(proc_fd: int, path: str) -> str:
    fd = os.open(path, os.O_RDONLY, dir_fd=proc_fd)
    try:
        return os.read(fd, 1 << 16).decode()
    finally:
        os.close(fd)


def children(proc_fd: int, pid: int) -> list[int]:
    """The children of every thread of `pid` (a thread's children are listed under that thread)."""
    try:
        fd = os.open(f"{pid}/task", os.O_RDONLY | os.O_DIRECTORY, dir_fd=proc_fd)
        try:
            threads = os.listdir(fd)
        finally:
            os.close(fd)
    except OSError:  # it is gone
        return []
    found = []
    for tid in threads:
        with contextlib.suppress(OSError):
            found += [int(p) for p in _read_at(proc_fd, f"{pid}/task/{tid}/children").split()]
    return found


def kill_descendants(proc_fd: int, own_pid: int) -> int:
    """Kills every descendant of this process and reaps them, a whole tree at a time, until none is
    left (this process is a subreaper: a descendant whose parent dies becomes its child); returns
    how many it killed.

    The tree is killed from the top down, so that a process killed cannot fork again, and read again
    until it is empty: a child forked after a read is re-parented here when its parent dies. A
    grandchild's pid is signalled microseconds after its live parent listed it (it could only be
    another process's if the program's few processes cycled through every pid in between); a
    child's pid cannot be reused before this process reaps it."""
    killed: set[int] = set()
    while tree := children(proc_fd, own_pid):
        level = tree
        while level:
            for pid in level:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            killed.update(level)
            level = [c for pid in level for c in children(proc_fd, pid) if c not in killed]
        for pid in tree:  # its own children: once they are reaped, theirs are its children
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass
    return len(killed)


def keep(worker_pid: int, proc_fd: int) -> None:
    """The keeper's whole life (a sandbox started by root): waits for its worker to end (on SIGTERM
    it kills it), then kills every process the worker left and exits.

    It stays root while the worker and its programs run as another user: a program can kill its
    worker, never the keeper, whose subreaper inherits what the program started (without a PID
    namespace nothing else would kill that)."""

    def kill_worker(*_: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(worker_pid, signal.SIGKILL)

    make_subreaper()
    signal.signal(signal.SIGTERM, kill_worker)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(worker_pid, 0)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # its pid is free now
    kill_descendants(proc_fd, os.getpid())
    os._exit(0)
