"""How fast this box is right now: a fixed single-threaded workload, timed, against the time it took
when the project's figures were measured. `make test` and `make test-fast` print it beside the time
guard (tools/test_times.py), because this 2-core box's speed drifts by up to 2.5x from one day to
the next (benchmarks/RESULTS.md): a suite that took longer on a slow day did not grow, and only
times divided by the factor compare across days.

Usage (from the repository root; the standard library only)::

    python tools/box_speed.py [--label before] [--repeats 3]

The workload is pure Python (integer arithmetic, a dict, a sort) plus hashing: what the suite's
interpreters and C extensions do, on one core. It runs `--repeats` times; the fastest run counts (a
run slowed by another process on the box is not the box's speed). Wall and CPU seconds are both
printed: wall well above CPU means something else took the core, not that the box was slow.
Exit status 0, or 2 on a bad argument.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time

ROUNDS = 2_000_000
# The fastest of 3 runs of `workload(ROUNDS)`, nothing else running on the 2-core box, Python 3.11.
REFERENCE_S = 0.49
REFERENCE_WHEN = "2026-12-04 04:50 UTC (make test-fast: 138 s that hour)"


def workload(rounds: int = ROUNDS) -> int:
    """A fixed amount of single-threaded work; the returned number only keeps it from being skipped."""
    acc, table = 0, {}
    for i in range(rounds):
        acc = (acc * 31 + i) % 1_000_003
        table[i & 1023] = acc
    blob = repr(sorted(table.values())).encode() * 256
    return acc ^ int(hashlib.sha256(blob).hexdigest()[:8], 16)


def measure(repeats: int = 3, rounds: int = ROUNDS) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of the fastest of `repeats` runs of the workload."""
    best: tuple[float, float] | None = None
    for _ in range(repeats):
        wall, cpu = time.perf_counter(), time.process_time()
        workload(rounds)
        run = (time.perf_counter() - wall, time.process_time() - cpu)
        best = run if best is None or run[0] < best[0] else best
    assert best is not None
    return best


def describe(wall_s: float, cpu_s: float, label: str = "", reference_s: float = REFERENCE_S) -> str:
    """One line: the workload's time, and the factor to divide this run's times by to compare them
    with those measured on the reference day."""
    factor = wall_s / reference_s
    where = f" ({label})" if label else ""
    return (
        f"box speed{where}: the reference workload took {wall_s:.2f} s wall, {cpu_s:.2f} s CPU; "
        f"{reference_s:.2f} s on {REFERENCE_WHEN}: this box is {factor:.2f}x as slow "
        f"(divide this run's times by {factor:.2f} to compare them with that day's)"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--label", default="", help="a word printed with the line (before, after)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of the workload; the fastest counts (default 3)")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats must be at least 1, got {args.repeats}")
    print(describe(*measure(args.repeats), label=args.label), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
