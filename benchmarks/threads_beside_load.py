"""Torch threads for the main job's step on a shared CPU: 1 vs 2 intra-op threads, alone and beside
one busy process (what a second test worker, a second DDP rank or any other job is), and 2 threads
with OpenMP's passive waiting (``OMP_WAIT_POLICY=PASSIVE``: a thread waiting for work sleeps at
once instead of spinning on a core first).

The test suite gives every process one thread (`tests/conftest.py`); this measures why. Each
configuration trains the same GRPO steps (`arithmetic_grpo.yaml`, warm-up off) in a process of its
own, interleaved in one run; "busy" is a process spinning on one core for the whole measurement.

Run: `.venv/bin/python benchmarks/threads_beside_load.py [--steps 20] [--repeats 2]` (about a minute).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

CONFIG = Path(__file__).resolve().parents[1] / "areal_lightning" / "app" / "configs" / "arithmetic_grpo.yaml"

CHILD = """
import json, sys, time
import lightning as L, torch
torch.set_num_threads(int(sys.argv[1]))
from areal_lightning.app.config import load_config
from areal_lightning.rl.grpo.module import GRPOModule
from areal_lightning.app.builders import build_module
cfg = load_config(sys.argv[3], ["grpo.warmup_steps=0", "output_dir=/tmp/threads-bench"])
L.seed_everything(1, verbose=False)
module = build_module(cfg)
trainer = L.Trainer(max_steps=int(sys.argv[2]), accelerator="cpu", logger=False, enable_checkpointing=False,
                    enable_progress_bar=False, enable_model_summary=False)
start = time.perf_counter()
trainer.fit(module)
print(json.dumps({"secs": time.perf_counter() - start}))
"""


def _spin(stop: float) -> None:
    while time.monotonic() < stop:
        pass


CONFIGS = {"1 thread": (1, None), "2 threads": (2, None), "2 threads, passive": (2, "PASSIVE")}
"""Name: (torch threads, OMP_WAIT_POLICY or None for libgomp's default)."""


def _fit_secs(threads: int, wait_policy: str | None, steps: int) -> float:
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if wait_policy is not None:
        env["OMP_WAIT_POLICY"] = wait_policy  # read when libgomp loads, before torch runs anything
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(threads), str(steps), str(CONFIG)],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    ).stdout
    return float(json.loads(out.strip().splitlines()[-1])["secs"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    results: dict[str, list[float]] = {}
    for _ in range(args.repeats):
        for busy in (False, True):
            for config, (threads, wait_policy) in CONFIGS.items():
                spinner = None
                if busy:
                    spinner = mp.get_context("spawn").Process(target=_spin, args=(time.monotonic() + 600,))
                    spinner.start()
                try:
                    secs = _fit_secs(threads, wait_policy, args.steps)
                finally:
                    if spinner is not None:
                        spinner.terminate()
                        spinner.join()
                results.setdefault(f"{config}, {'beside a busy process' if busy else 'alone'}", []).append(secs)
    print(f"{args.steps} GRPO steps of the main job (32 prompts x 16 samples), median of {args.repeats}:")
    medians = {name: statistics.median(v) for name, v in results.items()}
    for name, secs in medians.items():
        print(f"  {name:<44} {secs:6.2f} s  ({secs / args.steps * 1000:.0f} ms/step)")
    for where in ("alone", "beside a busy process"):
        one = medians[f"1 thread, {where}"]
        for config in ("2 threads", "2 threads, passive"):
            print(f"  {config} / 1 thread, {where}: {medians[f'{config}, {where}'] / one:.2f}x")


if __name__ == "__main__":
    main()
