"""The sandbox's documented API: `run_program`, `grade_program`, `Sandbox`, `SandboxLimits`."""

from __future__ import annotations

import os
import re
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from areal_lightning.errors import ArgumentError
from areal_lightning.scoring import (
    ProgramStatus,
    Sandbox,
    SandboxLimits,
    grade_program,
    program_with_tests,
    run_program,
)
from areal_lightning.scoring.sandbox.isolation import NOBODY_UID

pytestmark = pytest.mark.process


@pytest.fixture(scope="module")
def sandbox() -> Iterator[Sandbox]:
    with Sandbox(workers=2, limits=SandboxLimits(wall_s=3.0, cpu_s=2)) as box:
        yield box


@pytest.mark.waits  # the sleep runs to the 3 s wall limit
def test_each_program_ends_with_its_status_in_order(sandbox: Sandbox) -> None:
    programs = {
        "print('hi')": ProgramStatus.PASSED,
        "assert 1 == 2, 'wrong'": ProgramStatus.FAILED,
        "raise SystemExit(0)": ProgramStatus.FAILED,  # an exit before the end is no pass
        "def f(:\n    pass": ProgramStatus.SYNTAX_ERROR,
        "import time\ntime.sleep(60)": ProgramStatus.TIMEOUT,
        "import ctypes\nctypes.string_at(0)": ProgramStatus.CRASHED,  # a segfault
        "x = [0] * 10**12": ProgramStatus.OUT_OF_MEMORY,
    }
    results = sandbox.run_many(list(programs))
    assert [r.status for r in results] == list(programs.values())
    assert results[0].output == "hi\n" and results[0].error is None and results[0].passed
    assert results[1].error == "AssertionError: wrong" and "line 1" in results[1].output
    assert results[3].error is not None and results[3].error.startswith("SyntaxError")
    assert results[5].signal == signal.SIGSEGV


def test_grade_program_runs_the_tests_after_the_program() -> None:
    tests = "def check(candidate):\n    assert candidate(2, 3) == 5\n"
    assert grade_program("def add(a, b):\n    return a + b", tests, "add").status is ProgramStatus.PASSED
    wrong = grade_program("def add(a, b):\n    return a - b", tests, "add")
    assert wrong.status is ProgramStatus.FAILED and wrong.error == "AssertionError"
    assert grade_program("def add(a, b):\n    return a + b", "assert add(1, 1) == 2").passed  # plain asserts
    assert run_program("print(40 + 2)").output == "42\n"


def test_program_with_tests_calls_check_only_with_an_entry_point() -> None:
    assert program_with_tests("P", "T", "f").endswith("T\n\ncheck(f)\n")
    assert "check(" not in program_with_tests("P", "assert f(1)")


def test_tests_that_define_check_without_an_entry_point_are_refused() -> None:
    # Without the refusal no test would run: a wrong program would pass.
    check = "import math\n\ndef check(candidate):\n    assert candidate(2, 3) == 5\n"
    with pytest.raises(ValueError, match=r"define `check\(candidate\)` but entry_point is None: give the name"):
        grade_program("def add(a, b):\n    return a - b", check, None)
    with pytest.raises(ValueError, match=r"entry_point is '': give the name .* plain asserts"):
        program_with_tests("def add(a, b):\n    return a - b", "async def check(c):\n    pass\n", "")
    plain = "def helper_check(x):\n    return x\nassert add(2, 3) == 5"  # MBPP's asserts keep working
    assert grade_program("def add(a, b):\n    return a - b", plain).status is ProgramStatus.FAILED


def test_limits_are_checked_and_name_the_field() -> None:
    with pytest.raises(ArgumentError, match=r"`SandboxLimits\(cpu_s=...\)` must be a positive integer, got 1.5"):
        SandboxLimits(cpu_s=1.5)  # type: ignore[arg-type]
    with pytest.raises(ArgumentError, match=r"`SandboxLimits\(wall_s=...\)` must be a positive number, got 0"):
        SandboxLimits(wall_s=0)
    with pytest.raises(ArgumentError, match=r"`Sandbox\(workers=...\)` must be a positive integer, got 0"):
        Sandbox(workers=0)
    without = r"`Sandbox\(without=...\)` must be a collection of names from \['pid_namespace'\], got \['own_root'\]"
    with pytest.raises(ArgumentError, match=without):
        Sandbox(without=["own_root"])
    with pytest.raises(ArgumentError, match=r"`Sandbox\(directory=...\)` must be an existing directory or None"):
        Sandbox(directory="/nonexistent/areal-sandbox")
    with pytest.raises(TypeError, match="program sources as strings, got bytes"):
        Sandbox().run_many([b"print(1)"])  # type: ignore[list-item]


def test_a_run_with_its_own_limits(sandbox: Sandbox) -> None:
    tight = SandboxLimits(wall_s=3.0, cpu_s=2, max_output_bytes=10)
    result = sandbox.run("print('x' * 100)", tight)
    assert (result.output, result.truncated, result.status) == ("x" * 10, True, ProgramStatus.PASSED)
    assert sandbox.run("print('x' * 100)").output == "x" * 100 + "\n"


def test_its_directory_is_empty_private_and_gone_afterwards(sandbox: Sandbox) -> None:
    program = (
        "import os\nprint(sorted(os.listdir('.')), os.getcwd() == os.environ['HOME'] == os.environ['TMPDIR'])\n"
        "open('left-behind', 'w').write('x')\nos.mkdir('d')\nos.chmod('d', 0)"
    )
    first, second = sandbox.run_many([program, program])
    assert first.output == second.output == "['.output'] True\n"
    again = sandbox.run(program)  # the same worker's directory, emptied: nothing of the last program
    assert again.output == first.output


def test_a_dead_worker_is_replaced_and_its_program_recorded(sandbox: Sandbox) -> None:
    os.kill(sandbox._pool[0].process.pid, signal.SIGKILL)
    results = sandbox.run_many(["print(1)", "print(2)", "print(3)"])
    assert [r.status for r in results].count(ProgramStatus.CRASHED) == 1, results
    assert [r.output for r in results if r.passed] in (["2\n", "3\n"], ["1\n", "3\n"], ["1\n", "2\n"])
    assert all(w.process.poll() is None for w in sandbox._pool)
    assert sandbox.run_many(["print(4)"] * 2)[1].output == "4\n"


def test_close_stops_the_workers_and_removes_their_files() -> None:
    box = Sandbox(workers=2)
    box.run_many(["print(1)", "print(2)"])
    workers, base = list(box._pool), box._base
    assert base is not None and Path(base).is_dir()
    box.close()
    assert all(w.process.poll() is not None for w in workers)
    assert not Path(base).exists()
    assert box.run("print(5)").output == "5\n"  # started again on the next call
    box.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="the workers run programs as another user only when started as root")
def test_a_directory_the_programs_user_cannot_enter_is_refused_before_any_program_runs() -> None:
    # A TMPDIR of mode 0700 (a per-user or per-job temporary directory): every program used to
    # end `crashed` with a PermissionError, a pass rate of zero that said nothing of the programs.
    parent = Path(tempfile.mkdtemp(prefix="areal-sandbox-parent-"))
    try:
        parent.chmod(0o755)
        private = parent / "private"
        private.mkdir(mode=0o700)
        refused = rf"uid {NOBODY_UID}, who cannot enter {re.escape(str(private))} \(mode 700"
        with pytest.raises(PermissionError, match=refused):  # when it is made: a task refuses before training
            Sandbox(directory=private)
        private.chmod(0o711)  # the same place, passable: the programs run
        with Sandbox(directory=private) as box:
            private.chmod(0o700)  # closed after the sandbox was made: refused when its workers start
            with pytest.raises(PermissionError, match=refused):
                box.run("print(1)")
            assert os.listdir(private) == []  # nothing started, nothing left
            private.chmod(0o711)
            assert box.run("print(1)").status is ProgramStatus.PASSED
    finally:
        shutil.rmtree(parent, ignore_errors=True)


def test_nothing_is_left_in_the_temporary_directory() -> None:
    # A directory of its own (the shared /tmp changes as other jobs work): all the sandbox makes goes there.
    parent = Path(tempfile.mkdtemp(prefix="areal-sandbox-parent-"))
    try:
        parent.chmod(0o755)  # the workers' user passes through it
        writes = "import os, tempfile\nopen('x', 'w').write('y')\nos.mkdir('d')\ntempfile.mkstemp()\nprint(os.getcwd())"
        with Sandbox(workers=2, directory=parent) as box:
            results = box.run_many([writes, writes])
            assert [r.status for r in results] == [ProgramStatus.PASSED] * 2, results
            assert all(Path(r.output.strip()).is_relative_to(parent) for r in results), results
            assert box._base is not None and Path(box._base).parent == parent and os.listdir(parent) != []
        assert os.listdir(parent) == []
    finally:
        shutil.rmtree(parent, ignore_errors=True)
