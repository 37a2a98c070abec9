"""The CPU a documented `areal-lightning` command costs the docs tests, run as before (a fresh
interpreter: `python -m areal_lightning ...`) and from tests/cli_server.py's fork server (torch and
Lightning imported once), side by side, alternately. CPU seconds (user + system, the command's ranks
included), not wall time: the box this runs on is shared.

Run: `.venv/bin/python benchmarks/cli_server.py [--repeats 2] [--devices 1]` (about 2 minutes).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
CONFIG = ROOT / "areal_lightning" / "app" / "configs" / "arithmetic_grpo.yaml"
# The README's fit as tests/test_docs_run.py shortens it (its FAST overrides).
FIT = ["trainer.max_steps=4", "grpo.warmup_steps=2", "evaluator.freq_steps=2", "eval_sets.easy.size=16",
       "eval_sets.hard.size=16", "logger.wandb.mode=disabled"]  # fmt: skip


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def fresh(argv: list[str], cwd: Path, env: dict[str, str]) -> float:
    before = _children_cpu_s()
    done = subprocess.run([sys.executable, "-m", "areal_lightning", *argv], cwd=cwd, env=env, capture_output=True)
    assert done.returncode == 0, done.stderr[-2000:]
    return _children_cpu_s() - before


def forked(argv: list[str], cwd: Path, env: dict[str, str]) -> float:
    from cli_server import run_cli

    done = run_cli(argv, 600, cwd, env)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.cpu_s


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--devices", type=int, default=1)
    args = parser.parse_args()
    env = dict(os.environ, OMP_NUM_THREADS="1", WANDB_SILENT="true")
    ddp = [f"trainer.devices={args.devices}", "trainer.strategy=ddp"] if args.devices > 1 else []
    costs: dict[str, list[float]] = {"fresh": [], "forked": []}
    with tempfile.TemporaryDirectory() as tmp:
        forked(["example", "arithmetic_grpo", "-o", str(Path(tmp) / "warm.yaml")], Path(tmp), env)  # the server's start
        for i in range(args.repeats):
            for name, run in (("fresh", fresh), ("forked", forked)):
                argv = ["fit", "-c", str(CONFIG), *FIT, *ddp, f"output_dir={tmp}/{name}{i}"]
                costs[name].append(run(argv, Path(tmp), env))
                print(f"{name} {i}: {costs[name][-1]:.1f} CPU s", flush=True)
    a, b = statistics.median(costs["fresh"]), statistics.median(costs["forked"])
    print(f"median CPU s of a {args.devices}-device fit: fresh {a:.1f}, forked {b:.1f}, forked/fresh {b / a:.2f}")


if __name__ == "__main__":
    main()
