"""tools/box_speed.py, printed beside the time guard: the factor to divide a run's times by to compare
them with the reference day's, from the fastest of a few runs of a fixed workload."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "tools" / "box_speed.py"


def _tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("box_speed", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_factor_is_this_runs_time_over_the_reference_days() -> None:
    tool = _tool()
    slow = tool.describe(1.0, 0.9, label="after the suite", reference_s=0.5)
    assert "(after the suite)" in slow and "1.00 s wall, 0.90 s CPU" in slow
    assert "2.00x as slow" in slow and "divide this run's times by 2.00" in slow
    assert "0.50x as slow" in tool.describe(0.25, 0.25, reference_s=0.5)


def test_the_fastest_run_counts_and_the_workload_is_fixed(monkeypatch: pytest.MonkeyPatch) -> None:
    tool = _tool()
    assert tool.workload(5000) == tool.workload(5000) != tool.workload(5001)
    walls = iter([0.0, 3.0, 10.0, 11.0, 20.0, 22.0])  # runs of 3 s, 1 s and 2 s
    monkeypatch.setattr(tool.time, "perf_counter", lambda: next(walls))
    wall, cpu = tool.measure(repeats=3, rounds=10)
    assert wall == 1.0 and cpu >= 0.0


def test_the_command_prints_one_line_and_refuses_no_runs(capsys: pytest.CaptureFixture[str]) -> None:
    tool = _tool()
    assert tool.main(["--repeats", "1", "--label", "before"]) == 0
    (line,) = capsys.readouterr().out.splitlines()
    assert line.startswith("box speed (before): the reference workload took ")
    with pytest.raises(SystemExit) as exit_info:
        tool.main(["--repeats", "0"])
    assert exit_info.value.code == 2 and "--repeats must be at least 1, got 0" in capsys.readouterr().err
