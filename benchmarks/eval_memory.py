"""Peak memory of evaluation rounds against the eval set's size.

Each size runs in a fresh process: the main job's module (tiny policy), an arithmetic eval set of N
prompts (one sample each, so that 100,000 prompts take a minute), its fingerprint (as the ranks'
check does), then ``--rounds`` rounds of the default `rollout_evaluate` whose per-prompt outcomes
are paired (`PairedRounds`, as a fit's paired deltas keep the previous and the best round). The
process's peak resident memory is reported against the smallest size's, side by side in one run.
Target: 100,000 prompts within 10 % of 1,000.

    .venv/bin/python benchmarks/eval_memory.py [--sizes 1000 10000 100000] [--rounds 2] [--json]

Run it on another checkout with ``PYTHONPATH=<checkout>`` to compare.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from typing import Any

_MB = 1024  # ru_maxrss is in KiB on Linux


def child(size: int, rounds: int) -> dict[str, Any]:
    import torch

    from areal_lightning.app.builders import build_eval_sets, build_module
    from areal_lightning.app.config import load_config
    from areal_lightning.eval_round import run_round
    from areal_lightning.eval_round.fingerprint import eval_set_fingerprint
    from areal_lightning.metrics.paired import PairedRounds
    from areal_lightning.rl.rollout_eval import rollout_evaluate

    torch.set_num_threads(1)
    # Three-digit operands: 810,000 distinct problems, enough for every size (an eval set counts each once).
    overrides = [f"eval_sets.easy.size={size}", "eval_sets.easy.digits=3", "eval_sets.easy.n_samples=1"]
    cfg = load_config(None, [*overrides, "grpo.warmup_steps=0"])
    module = build_module(cfg)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / _MB
    start = time.perf_counter()
    (easy,) = [s for s in build_eval_sets(cfg, module.task) if s.name == "easy"]
    eval_set_fingerprint(easy)
    pairs = PairedRounds()
    for step in range(rounds):
        (result,) = run_round(module, [easy], rollout_evaluate, seed=1, global_step=step, epoch=0, max_table_rows=50)
        pairs.update("easy", result.outcomes, result.outcome_names, result.metrics)
        del result
    return {
        "size": size,
        "before_mb": before,
        "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / _MB,
        "secs": time.perf_counter() - start,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000, 100000])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(child(args.child, args.rounds)))
        return
    rows = []
    for size in args.sizes:
        out = subprocess.run(
            [sys.executable, __file__, "--child", str(size), "--rounds", str(args.rounds)],
            capture_output=True,
            text=True,
            check=True,
        )
        rows.append(json.loads(out.stdout.splitlines()[-1]))
    base = rows[0]["peak_mb"]
    for row in rows:
        row["peak_vs_smallest"] = row["peak_mb"] / base
    if args.json:
        print(json.dumps({"rows": rows, "load": os.getloadavg()[0]}))
        return
    print(f"load average {os.getloadavg()[0]:.1f}; {args.rounds} rounds, one sample a prompt")
    print("prompts  rss before rounds (MB)  peak rss (MB)  peak / smallest  rounds s")
    for r in rows:
        print(
            f"{r['size']:>7}  {r['before_mb']:>22.1f}  {r['peak_mb']:>13.1f}  {r['peak_vs_smallest']:>15.3f}  "
            f"{r['secs']:>8.1f}"
        )


if __name__ == "__main__":
    main()
