"""Torch threads for the main job's step on a shared CPU: 1 vs 2 intra-op threads, alone and beside
one busy process (what a second test worker, a second DDP rank or any other job is).

The test suite gives every process one thread (`tests/conftest.py`); this measures why. Each
configuration trains the same GRPO steps (`arithmetic_grpo.yaml`, warm-up off) in a process of its
own, interleaved in one run; "busy" is a process spinning on one core for the whole measurement.

Run: `.venv/bin/python benchmarks/threads_beside_load.py [--steps 20] [--repeats 2]` (about a minute).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
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


def _fit_secs(threads: int, steps: int) -> float:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(threads), str(steps), str(CONFIG)],
        capture_output=True,
        text=True,
        check=True,
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
            for threads in (1, 2):
                spinner = None
                if busy:
                    spinner = mp.get_context("spawn").Process(target=_spin, args=(time.monotonic() + 600,))
                    spinner.start()
                try:
                    secs = _fit_secs(threads, args.steps)
                finally:
                    if spinner is not None:
                        spinner.terminate()
                        spinner.join()
                results.setdefault(f"{threads} thread(s), {'beside a busy process' if busy else 'alone'}", []).append(
                    secs
                )
    print(f"{args.steps} GRPO steps of the main job (32 prompts x 16 samples), median of {args.repeats}:")
    medians = {name: statistics.median(v) for name, v in results.items()}
    for name, secs in medians.items():
        print(f"  {name:<40} {secs:6.2f} s  ({secs / args.steps * 1000:.0f} ms/step)")
    for where in ("alone", "beside a busy process"):
        ratio = medians[f"2 thread(s), {where}"] / medians[f"1 thread(s), {where}"]
        print(f"  2 threads / 1 thread, {where}: {ratio:.2f}x")


if __name__ == "__main__":
    main()
