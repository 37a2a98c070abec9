"""tools/test_times.py, the time guard of `make test`: from the JUnit file pytest writes, the slowest
tests slowest first, the count and the totals; a missing or foreign file is an error naming it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tools" / "test_times.py"
TESTS = """
import time, pytest

def test_slow():
    time.sleep(0.6)

def test_quick():
    pass

def test_middle():
    time.sleep(0.3)

@pytest.mark.skip(reason="not here")
def test_skipped():
    pass

def test_broken():
    assert False
"""


def _times(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=cwd, capture_output=True, text=True, timeout=60)


@pytest.mark.process
def test_the_slowest_tests_of_a_real_pytest_report_come_first_with_the_totals(tmp_path: Path) -> None:
    (tmp_path / "test_sample.py").write_text(TESTS)
    pytest_run = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist"]
    subprocess.run([*pytest_run, "--junitxml=junit.xml", "test_sample.py"], cwd=tmp_path, capture_output=True,
                   timeout=120, check=False)  # fmt: skip
    done = _times("junit.xml", "--top", "2", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "== the 2 slowest tests (setup + call + teardown) =="
    assert lines[1].endswith("s  test_sample.py::test_slow") and lines[2].endswith("s  test_sample.py::test_middle")
    assert float(lines[1].split()[0]) >= 0.6
    assert lines[3].startswith("junit.xml: 5 tests (1 skipped, 1 failed), tests ")
    assert len(lines) == 4


@pytest.mark.process
def test_a_missing_or_foreign_report_is_named(tmp_path: Path) -> None:
    (tmp_path / "notes.xml").write_text("<notes><note/></notes>")
    (tmp_path / "broken.xml").write_text("not xml")
    for name, reason in (("absent.xml", "No such file"), ("notes.xml", "no <testsuite>"), ("broken.xml", "not an XML")):
        done = _times(name, cwd=tmp_path)
        assert done.returncode == 2 and name in done.stderr and reason in done.stderr, done.stderr
