"""tools/cpu_census.py: every process's CPU time during a command, those killed by a signal
included (what `/usr/bin/time` and an exit hook miss), grouped by command line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.process  # each test runs the tool in a process of its own

SCRIPT = Path(__file__).resolve().parents[1] / "tools" / "cpu_census.py"
# A child that computes for ~2 s, then kills itself with SIGKILL: no exit hook of its own runs (an
# exit hook census misses it), and a killed process's last samples are all there is of it.
SPIN_THEN_KILL = (
    "import os, signal, time  # census-spinner\n"
    "end = time.process_time() + 2.0\n"
    "while time.process_time() < end: pass\n"
    "os.kill(os.getpid(), signal.SIGKILL)\n"
)


def test_a_killed_processs_cpu_is_counted_under_its_command_line(tmp_path: Path) -> None:
    out = tmp_path / "census.json"
    # The shell starts the child (a process the recorder did not start) and waits for it.
    command = ["sh", "-c", f'"{sys.executable}" -c "$0" & wait', SPIN_THEN_KILL]
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "record", str(out), "--", *command],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    processes = json.loads(out.read_text())["processes"].values()
    (spinner,) = [p for p in processes if "census-spinner" in p["cmd"] and "sh -c" not in p["cmd"]]
    assert 1.0 <= spinner["cpu"] <= 2.5, spinner  # the last second may fall after the last sample
    # The report's line for it: its CPU seconds and one process.
    line = next(line for line in done.stdout.splitlines() if "census-spinner" in line and "sh -c" not in line)
    assert float(line.split()[0]) == pytest.approx(spinner["cpu"], abs=0.05) and line.split()[2] == "1"


def test_record_without_a_command_says_so(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "record", str(tmp_path / "census.json"), "--"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2 and "give the command to run after --" in done.stderr
