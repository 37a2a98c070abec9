"""The test suite's time, from the JUnit XML file pytest writes (``--junitxml``): the ten slowest
tests and the totals, printed at the end of ``make test`` so that CI's log shows where the time goes
and the next growth is seen when it happens. It reports; it never fails the run on time.

Usage (from the repository root)::

    python tools/test_times.py build/junit.xml [build/junit-vllm.xml ...] [--top 10]

A test's time is what pytest's JUnit report gives it: its setup, call and teardown (a module-scoped
fixture counts in the first test that uses it). "tests" is their sum over all workers; "wall" is the
session's own time as the report gives it (with ``-n 2``, about half the sum). Exit status 0, or 2
when a file is missing or is not a JUnit report.
"""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Report:
    """One JUnit file: each test's (seconds, id), the session's wall seconds, and the outcome counts."""

    path: Path
    tests: list[tuple[float, str]]
    wall_s: float
    skipped: int
    failed: int


def read_report(path: Path) -> Report:
    """The tests of a pytest JUnit XML file (one ``testsuite``, or several under ``testsuites``).

    Raises:
        ValueError: the file is not XML, or holds no ``testsuite``.
    """
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError as err:
        raise ValueError(f"{path}: not an XML file ({err})") from None
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    if not suites:
        raise ValueError(f"{path}: no <testsuite> element (expected pytest's --junitxml report)")
    tests, skipped, failed = [], 0, 0
    for case in (c for s in suites for c in s.iter("testcase")):
        module = case.get("classname", "").replace(".", "/")
        tests.append((float(case.get("time", 0.0)), f"{module}.py::{case.get('name', '?')}"))
        skipped += case.find("skipped") is not None
        failed += case.find("failure") is not None or case.find("error") is not None
    wall = sum(float(s.get("time", 0.0)) for s in suites)
    return Report(path, tests, wall, skipped, failed)


def summary(reports: list[Report], top: int = 10) -> str:
    """The `top` slowest tests of all the reports, slowest first, then one line of totals per report."""
    every = sorted((t for r in reports for t in r.tests), key=lambda t: -t[0])
    lines = [f"== the {min(top, len(every))} slowest tests (setup + call + teardown) =="]
    lines += [f"{seconds:8.1f} s  {name}" for seconds, name in every[:top]]
    for r in reports:
        total = sum(seconds for seconds, _ in r.tests)
        lines.append(
            f"{r.path}: {len(r.tests)} tests ({r.skipped} skipped, {r.failed} failed), "
            f"tests {total:.0f} s, wall {r.wall_s:.0f} s"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("reports", nargs="+", type=Path, help="pytest --junitxml files")
    parser.add_argument("--top", type=int, default=10, help="how many of the slowest tests (default 10)")
    args = parser.parse_args(argv)
    try:
        reports = [read_report(p) for p in args.reports]
    except (OSError, ValueError) as err:
        print(f"test_times: {err}", file=sys.stderr)
        return 2
    print(summary(reports, args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
