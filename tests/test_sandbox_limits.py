"""The sandbox's limits and results as data, without running a program: the defaults are those
docs/code_evaluation.md documents, every limit is checked, and a worker's report becomes the same
`SandboxResult` whatever it leaves out. (`test_sandbox.py` runs programs under them.)"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from areal_lightning.errors import ArgumentError
from areal_lightning.scoring import ProgramStatus, Sandbox, SandboxLimits
from areal_lightning.scoring.sandbox.results import SandboxResult

DOCS = Path(__file__).resolve().parent.parent / "docs" / "code_evaluation.md"
UNITS = {"s": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}


def _documented_defaults() -> dict[str, float]:
    """The default column of the table of limits in docs/code_evaluation.md, in the field's units."""
    out = {}
    table = DOCS.read_text(encoding="utf-8").split("**Limits** (`SandboxLimits`", 1)[1].split("\n\n")[1]
    for name, default in re.findall(r"^\| `(\w+)` \| ([^|]+) \|", table, re.MULTILINE):
        number, _, unit = default.strip().partition(" ")
        out[name] = float(number) * UNITS.get(unit, 1)
    return out


def test_the_defaults_are_the_documented_ones() -> None:
    documented = _documented_defaults()
    job = SandboxLimits().as_job()
    assert set(documented) == set(job)  # the table lists every field
    assert job == {name: pytest.approx(value) for name, value in documented.items()}
    assert [type(v) for v in job.values()] == [float] + [int] * 7


@pytest.mark.parametrize(
    "field",
    [
        "cpu_s",
        "memory_bytes",
        "max_processes",
        "max_file_bytes",
        "max_open_files",
        "max_output_bytes",
        "max_disk_bytes",
    ],
)
def test_each_integer_limit_refuses_zero_a_fraction_and_a_bool(field: str) -> None:
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ArgumentError, match=rf"`SandboxLimits\({field}=...\)` must be a positive integer, got "):
            SandboxLimits(**{field: bad})
    assert getattr(SandboxLimits(**{field: 1}), field) == 1


def test_the_wall_clock_takes_a_fraction_but_not_zero_a_string_or_a_bool() -> None:
    assert SandboxLimits(wall_s=0.25).wall_s == 0.25
    for bad in (0, -0.5, "2", False):
        with pytest.raises(ArgumentError, match=r"`SandboxLimits\(wall_s=...\)` must be a positive number, got "):
            SandboxLimits(wall_s=bad)  # type: ignore[arg-type]


def test_a_report_becomes_its_result_and_what_it_leaves_out_has_its_default() -> None:
    full = {
        "status": "timeout",
        "output": "tick\n",
        "truncated": 1,
        "exit_code": None,
        "signal": 9,
        "wall_s": 2,
        "error": None,
        "limit": "wall_s",
        "isolation": ["own_root", "pid_namespace"],
    }
    result = SandboxResult.from_report(full)
    assert result == SandboxResult(
        ProgramStatus.TIMEOUT, "tick\n", True, None, 9, 2.0, None, "wall_s", ("own_root", "pid_namespace")
    )
    assert isinstance(result.wall_s, float) and result.truncated is True and not result.passed
    bare = SandboxResult.from_report({"status": "passed", "output": None})
    assert bare == SandboxResult(ProgramStatus.PASSED)
    assert (bare.output, bare.truncated, bare.wall_s, bare.isolation, bare.passed) == ("", False, 0.0, (), True)
    assert SandboxResult.from_report({"status": "failed", "error": "AssertionError", "exit_code": 1}) == SandboxResult(
        ProgramStatus.FAILED, error="AssertionError", exit_code=1
    )


def test_a_sandboxs_arguments_are_refused_naming_each_and_the_defaults_are_one_worker() -> None:
    # Nothing starts here: a Sandbox starts its workers on its first program.
    box = Sandbox()
    assert (box.workers, box.limits, box.directory) == (1, SandboxLimits(), None)
    for workers in (True, 1.5):
        with pytest.raises(ArgumentError) as raised:
            Sandbox(workers=workers)  # type: ignore[arg-type]
        assert str(raised.value) == f"`Sandbox(workers=...)` must be a positive integer, got {workers!r}"
    with pytest.raises(ArgumentError) as raised:
        Sandbox(limits={"wall_s": 1})  # type: ignore[arg-type]
    assert str(raised.value) == "`Sandbox(limits=...)` must be a SandboxLimits or None, got {'wall_s': 1}"
    with pytest.raises(ArgumentError) as raised:
        Sandbox(directory="/nonexistent/areal-sandbox")
    assert str(raised.value) == (
        "`Sandbox(directory=...)` must be an existing directory or None, got '/nonexistent/areal-sandbox'"
    )
