"""The operating-system side of the code sandbox: namespaces, mounts, capabilities, resource limits.

Linux system calls through `ctypes` (standard library only: the sandbox worker imports nothing
else). Each step is best effort: a step the kernel refuses is left out and the program runs with
the protections that did hold, which `Isolation` names. docs/code_evaluation.md says which
protection stops what, and what is done where a step is refused.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import platform
import resource
import sys
import sysconfig
from collections.abc import Iterable, Sequence

_libc = ctypes.CDLL(None, use_errno=True)

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
_MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 2, 4, 8
_MS_REC, _MS_PRIVATE = 0x4000, 1 << 18
_AT_FDCWD, _AT_RECURSIVE, _AT_EMPTY_PATH = -100, 0x8000, 0x1000
_MOUNT_ATTR_RDONLY = 1
_OPEN_TREE_CLONE = 1
_MOVE_MOUNT_F_EMPTY_PATH = 0x4
_SYS_OPEN_TREE, _SYS_MOVE_MOUNT, _SYS_MOUNT_SETATTR = 428, 429, 442  # the same number on every architecture
_SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41}
_MNT_DETACH = 2
OLD_ROOT = "/.old-root"
"""Where the machine's root stays in a worker's own root, detached by each program before it runs."""
SYSTEM_PATHS = ("/usr", "/lib", "/lib64", "/lib32", "/bin", "/etc/ld.so.cache", "/etc/localtime")
"""What a program sees read-only in its own root, beside the interpreter: shared libraries (which
`ctypes` and C extension modules load), the dynamic linker's cache, the time zone."""
DEVICES = ("/dev/null", "/dev/zero", "/dev/random", "/dev/urandom")
_PR_SET_DUMPABLE, _PR_SET_NO_NEW_PRIVS = 4, 38
_CAP_VERSION_3 = 0x20080522

NOBODY_UID = 65534
"""The unprivileged user a sandbox started by root runs as (``nobody`` on most systems)."""


class Isolation:
    """Names of the protections that held for one program (kept in `SandboxResult.isolation`)."""

    UID = "unprivileged_uid"
    """Root dropped to `NOBODY_UID`: root's files, sockets and processes are out of reach."""
    USER_NS = "user_namespace"
    """A user namespace: its capabilities count nowhere else; RLIMIT_NPROC counts this program only."""
    NET_NS = "network_namespace"
    """A network namespace with no interface up: no connection anywhere, 127.0.0.1 included."""
    PID_NS = "pid_namespace"
    """The program is process 1 of its own PID namespace: when it ends, every process it started dies."""
    READONLY_FS = "readonly_filesystem"
    """Every mount read-only in a mount namespace of its own, except the program's temporary directory."""
    HIDDEN_HOME = "hidden_home"
    """Home directories covered by an empty file system (the interpreter's own files re-exposed)."""
    PRIVATE_PROC = "private_proc"
    """/proc shows the program's own processes only."""
    NO_CAPABILITIES = "no_capabilities"
    """No capabilities, and no way to gain any (no_new_privs)."""
    OWN_TMPFS = "own_tmpfs"
    """The temporary directories are in a size-capped tmpfs of the worker's own, one per program."""
    OWN_ROOT = "own_root"
    """A root file system of its own: the interpreter, `SYSTEM_PATHS` and `DEVICES` read-only, its
    temporary directory, its /proc; nothing else of the machine (docs/code_evaluation.md)."""

    ALL = (UID, USER_NS, NET_NS, PID_NS, READONLY_FS, HIDDEN_HOME, PRIVATE_PROC, NO_CAPABILITIES, OWN_TMPFS, OWN_ROOT)
    OPTIONAL = (PID_NS,)
    """Those a `Sandbox` can be told to go without (`Sandbox(without=...)`), to run as on a kernel
    that refuses them (its tests do: what the fallback kills must be tested here too)."""


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def prctl(option: int, value: int) -> None:
    _check(_libc.prctl(option, value, 0, 0, 0), f"prctl({option})")


def unshare(flags: int) -> None:
    _check(_libc.unshare(flags), f"unshare({flags:#x})")


def _mount(source: bytes | None, target: bytes, fstype: bytes | None, flags: int, data: bytes | None = None) -> None:
    _check(_libc.mount(source, target, fstype, flags, data), f"mount({target.decode()})")


class _MountAttr(ctypes.Structure):
    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


def _set_readonly(path: str, readonly: bool, *, recursive: bool) -> None:
    attr = _MountAttr(_MOUNT_ATTR_RDONLY, 0, 0, 0) if readonly else _MountAttr(0, _MOUNT_ATTR_RDONLY, 0, 0)
    flags = _AT_RECURSIVE if recursive else 0
    _check(_libc.syscall(_SYS_MOUNT_SETATTR, _AT_FDCWD, path.encode(), flags, ctypes.byref(attr), 32), "mount_setattr")


def _clone_tree(path: str) -> int:
    """A detached copy of the mounts at `path` (an fd), to be attached elsewhere with `_attach`."""
    fd = _libc.syscall(_SYS_OPEN_TREE, _AT_FDCWD, path.encode(), _OPEN_TREE_CLONE | _AT_RECURSIVE)
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"open_tree({path}): {os.strerror(err)}")
    return int(fd)


def _attach(fd: int, path: str) -> None:
    result = _libc.syscall(_SYS_MOVE_MOUNT, fd, b"", _AT_FDCWD, path.encode(), _MOVE_MOUNT_F_EMPTY_PATH)
    os.close(fd)
    _check(result, f"move_mount({path})")


def _under(path: str, parent: str) -> bool:
    return path == parent or path.startswith(parent.rstrip("/") + "/")


def interpreter_paths() -> list[str]:
    """The directories a program needs to import modules: the interpreter's prefixes and `sys.path`."""
    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(os.path.realpath(sys.executable))}
    paths.update(p for p in sys.path if p and os.path.isdir(p))
    return sorted(os.path.realpath(p) for p in paths)


def hide_homes(homes: Iterable[str], keep: Sequence[str]) -> None:
    """Covers each home directory with an empty tmpfs, re-exposing the `keep` paths under it
    (a Python installed under a home directory stays importable)."""
    for home in sorted({os.path.realpath(h) for h in homes if os.path.isdir(h)}):
        inner = [p for p in keep if _under(p, home) and p != home]
        inner = [p for p in inner if not any(q != p and _under(p, q) for q in inner)]  # outermost only
        clones = [(p, _clone_tree(p)) for p in inner]
        _mount(b"tmpfs", home.encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV, b"mode=0755,size=64k")
        for path, fd in clones:
            os.makedirs(path, exist_ok=True)
            _attach(fd, path)


def seal_filesystem(writable: str, homes: Iterable[str]) -> list[str]:
    """In the current (new) mount namespace: home directories hidden, every mount read-only except
    `writable` and /proc. Returns the `Isolation` names that held."""
    held = []
    _mount(None, b"/", None, _MS_REC | _MS_PRIVATE)  # nothing we do here reaches the machine's mounts
    keep_writable = _clone_tree(writable)
    try:
        hide_homes(homes, [*interpreter_paths(), os.path.realpath(writable)])
        held.append(Isolation.HIDDEN_HOME)
    except OSError:
        pass
    try:
        _set_readonly("/", True, recursive=True)
        held.append(Isolation.READONLY_FS)
        # /proc stays writable: the id maps are written there, and a program sees only its own (`isolate_program`).
        _set_readonly("/proc", False, recursive=False)
    finally:
        _attach(keep_writable, writable)  # on top of the read-only tree: the one writable place
    return held


def exposed_paths() -> list[str]:
    """The machine's paths in a program's own root: the interpreter's installation, the virtual
    environment's site-packages (not the project: an editable install's source stays out) and
    `SYSTEM_PATHS`, outermost only."""
    paths = {sys.base_prefix, sys.base_exec_prefix, sysconfig.get_path("purelib"), sysconfig.get_path("platlib")}
    paths.update(SYSTEM_PATHS)
    paths = {p for p in paths if os.path.lexists(p)}
    return sorted(p for p in paths if not any(q != p and _under(p, q) and not os.path.islink(q) for q in paths))


def _expose(root: str, path: str, *, readonly: bool) -> None:
    target = root + path
    os.makedirs(os.path.dirname(target), exist_ok=True)
    if os.path.islink(path) and not path.startswith("/dev/"):  # /bin -> usr/bin stays a link
        os.symlink(os.readlink(path), target)
        return
    if os.path.isdir(path):
        os.makedirs(target, exist_ok=True)
    else:
        open(target, "w").close()
    _attach(_clone_tree(os.path.realpath(path)), target)
    if readonly:
        _set_readonly(target, True, recursive=True)


def _hide_listings(root: str) -> None:
    """The directories made on the way to an exposed path (/root on the way to an interpreter
    under it) can be passed through, not listed: execute-only, for their owner too."""
    for parent, dirs, _ in os.walk(root):
        dirs[:] = [d for d in dirs if not os.path.ismount(os.path.join(parent, d))]
        if parent not in (root, root + "/dev"):
            os.chmod(parent, 0o111)


def enter_own_root(area: str, disk_bytes: int) -> None:
    """Builds a minimal root on a tmpfs mounted at `area` and pivots into it: `exposed_paths` and
    `DEVICES`, a /proc mount point, and at `area`'s own path a tmpfs of `disk_bytes` for the
    programs' directories. The machine's root stays at `OLD_ROOT` until each program detaches it."""
    machine = platform.machine()
    if machine not in _SYS_PIVOT_ROOT:
        raise OSError(0, f"pivot_root: unknown system call number on {machine}")
    _mount(None, b"/", None, _MS_REC | _MS_PRIVATE)
    _mount(b"tmpfs", area.encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV, b"mode=0755,size=1m")
    for path in exposed_paths():
        _expose(area, path, readonly=True)
    for device in DEVICES:
        _expose(area, device, readonly=False)
    for directory in ("/proc", OLD_ROOT, area):
        os.makedirs(area + directory, mode=0o755, exist_ok=True)
    _hide_listings(area)
    tmp = f"size={disk_bytes},mode=0700".encode()
    _mount(b"tmpfs", (area + area).encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV, tmp)
    _check(_libc.syscall(_SYS_PIVOT_ROOT[machine], area.encode(), (area + OLD_ROOT).encode()), "pivot_root")
    os.chdir("/")
    _set_readonly("/", True, recursive=False)


def leave_old_root() -> None:
    """Detaches the machine's root (`OLD_ROOT`) from this process's mount namespace."""
    _check(_libc.umount2(OLD_ROOT.encode(), _MNT_DETACH), "umount2")


def write_id_maps(uid: int, gid: int) -> None:
    """Maps the user namespace's `uid` and `gid` to themselves (the outside ids of this process)."""
    with open("/proc/self/setgroups", "w") as f:
        f.write("deny")
    with open("/proc/self/uid_map", "w") as f:
        f.write(f"{uid} {uid} 1")
    with open("/proc/self/gid_map", "w") as f:
        f.write(f"{gid} {gid} 1")


def drop_to(uid: int) -> None:
    """Root becomes `uid` (group likewise), keeping nothing of root; /proc/self stays its own."""
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
    prctl(_PR_SET_DUMPABLE, 1)  # setuid made /proc/self root's; the id maps are written there


def isolate_worker(area: str, homes: Sequence[str], sandbox_uid: int | None, disk_bytes: int) -> list[str]:
    """Run once by a sandbox worker before its first program: drops root, enters new user, mount and
    network namespaces, hides home directories, makes every mount read-only except `area` (where
    the programs' temporary directories go) and /proc, and mounts a tmpfs of `disk_bytes` on `area`.
    Returns the `Isolation` names that held."""
    held: list[str] = []
    if os.geteuid() == 0:
        # As root the mounts are prepared first (root can reach every home directory), then root is dropped.
        try:
            unshare(CLONE_NEWNS)
            held += seal_filesystem(area, homes)
        except OSError:
            pass
        if sandbox_uid is not None:
            os.chown(area, sandbox_uid, sandbox_uid)
            drop_to(sandbox_uid)
            held.append(Isolation.UID)
    uid, gid = os.getuid(), os.getgid()
    try:
        unshare(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWNET)
        held += [Isolation.USER_NS, Isolation.NET_NS]
        write_id_maps(uid, gid)
    except OSError:
        with contextlib.suppress(OSError):
            unshare(CLONE_NEWNET)  # root that kept its uid
            held.append(Isolation.NET_NS)
    if Isolation.READONLY_FS not in held:  # a user without root seals it here, in its user namespace
        with contextlib.suppress(OSError):
            held += seal_filesystem(area, homes)
    try:
        enter_own_root(area, disk_bytes)
        held += [Isolation.OWN_ROOT, Isolation.OWN_TMPFS]
    except OSError:  # the sealed machine's root, and a tmpfs for the programs where it holds
        with contextlib.suppress(OSError):
            tmp = f"size={disk_bytes},mode=0700".encode()
            _mount(b"tmpfs", area.encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV, tmp)
            held.append(Isolation.OWN_TMPFS)
    return held


def isolate_program(tempdir: str, area: str, held: Sequence[str]) -> list[str]:
    """Run by the program's own process before the program: leaves only `tempdir` writable of the
    worker's `area`, mounts its own /proc (in a PID namespace of its own), detaches the machine's
    root, drops every capability. Returns the `Isolation` names that held.

    Raises:
        OSError: where its mounts would be its worker's (no mount namespace of its own) under
            `Isolation.OWN_ROOT`, or where it cannot detach the machine's root: it does not run.
    """
    out = []
    own_mounts = Isolation.PID_NS in held  # forked into new PID and mount namespaces
    if not own_mounts:
        try:
            unshare(CLONE_NEWNS)  # a plain fork: what it detaches below must stay its worker's
            own_mounts = True
        except OSError:
            if Isolation.OWN_ROOT in held:
                raise
    if own_mounts and (Isolation.READONLY_FS in held or Isolation.OWN_ROOT in held):
        with contextlib.suppress(OSError):
            keep = _clone_tree(tempdir)
            _set_readonly(area, True, recursive=True)
            _attach(keep, tempdir)
    if Isolation.PID_NS in held:
        with contextlib.suppress(OSError):
            _mount(b"proc", b"/proc", b"proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
            out.append(Isolation.PRIVATE_PROC)
    if Isolation.OWN_ROOT in held:
        leave_old_root()  # refused: the program does not run (``crashed``) rather than see the machine
    prctl(_PR_SET_NO_NEW_PRIVS, 1)
    header = (ctypes.c_uint32 * 2)(_CAP_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()
    if _libc.capset(header, data) == 0:
        out.append(Isolation.NO_CAPABILITIES)
    return out


def set_limits(limits: dict[str, int]) -> None:
    """Resource limits of this process and its children; soft equals hard, so none can be raised
    again (past its CPU seconds the kernel sends SIGKILL: process 1 of a PID namespace ignores SIGXCPU)."""
    for name, key in (
        (resource.RLIMIT_CPU, "cpu_s"),
        (resource.RLIMIT_AS, "memory_bytes"),
        (resource.RLIMIT_NPROC, "max_processes"),
        (resource.RLIMIT_FSIZE, "max_file_bytes"),
        (resource.RLIMIT_NOFILE, "max_open_files"),
    ):
        resource.setrlimit(name, (limits[key], limits[key]))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
