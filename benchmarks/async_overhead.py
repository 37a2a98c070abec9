"""How much of the evaluation cost `mode="async"` hides from training.

One run trains the main job's GRPO module (no warm-up, a fixed step count) on the same evaluation
schedule (on_busy="wait": every due round is evaluated) as (a) no evaluation, (b) ``mode="sync"``,
(c) ``mode="async"``, and reports the wall time of each fit and the share of the evaluation cost
that async hides,

    hidden = 1 - (T_async - T_none) / (T_sync - T_none).

Threads are split fairly: every fit starts with the whole budget (``--threads``, default all
cores); sync evaluates on the training threads, and async lends ``--async-threads`` of them to its
worker process while a round is in flight (training gets them back in between). With
``--fixed-split`` a fourth fit shows the simpler split: training on ``threads - async_threads``
for the whole fit. The worker's start-up (a spawned process importing torch and Lightning), the
wait for rounds in flight and for the last round at the end of training count against async.
The configurations take turns in a shuffled order per repeat (the box is shared and noisy);
medians over repeats are reported. Target: >= 60 % on a 2-core CPU box, >= 90 % on a GPU.

    .venv/bin/python benchmarks/async_overhead.py [--steps 160] [--every 30] [--repeats 3] [--json]

With ``--threads 1`` the worker gets a core that training does not use (as a spare GPU would):
not a fair split, but the setting in which async evaluation is meant to hide nearly all its cost.
"""

from __future__ import annotations

if __name__ == "__main__":  # as `areal-lightning fit` does in async mode: the worker's imports start now
    from areal_lightning.callbacks.worker_launch import prestart

    prestart(["areal_lightning.rl.grpo.module", "areal_lightning.rl.rollout_eval"])

import argparse
import json
import logging
import os
import random
import sys
import tempfile
import time
import warnings
from pathlib import Path
from statistics import median
from typing import Any

import lightning as L
import torch

from areal_lightning.app.builders import build_eval_sets, build_module
from areal_lightning.app.config import load_config
from areal_lightning.callbacks.evaluation_callback import EvaluationCallback
from areal_lightning.eval_round import run_round

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from callback_helpers import make_trainer  # the tests' quiet CPU Trainer, reused

CONFIGS = ("none", "sync", "async")
FIXED = "async, fixed split"
TARGET_CPU, TARGET_GPU = 0.60, 0.90
SEED = 1


def _config(args: argparse.Namespace) -> Any:
    return load_config(
        None,
        [
            f"eval_sets.easy.size={args.eval_size}",
            "eval_sets.easy.digits=2",  # 8100 distinct problems: one digit has only 100
            f"eval_sets.hard.size={args.eval_size}",
            f"eval_sets.easy.n_samples={args.n_samples}",
            f"eval_sets.hard.n_samples={args.n_samples}",
            "eval_sets.hard.digits=2",
            "grpo.warmup_steps=0",
            f"seed={SEED}",
            f"trainer.accelerator={args.accelerator}",
        ],
    )


def _start_secs(output_dir: str) -> list[float]:
    """How long after falling due each async round began in the worker (history's `start_secs`)."""
    from areal_lightning.tracking.history import eval_rows, read_history

    rows = eval_rows(read_history(Path(output_dir)))
    return [r["start_secs"] for r in rows if r.get("start_secs") is not None and r["dataset"] == "easy"]


def _fit(kind: str, args: argparse.Namespace, tmp: str) -> float:
    cfg = _config(args)
    torch.set_num_threads(args.threads - args.async_threads if kind == FIXED else args.threads)
    L.seed_everything(SEED, verbose=False)
    module = build_module(cfg)
    callbacks: list[L.Callback] = []
    if kind != "none":
        callbacks.append(
            EvaluationCallback(
                build_eval_sets(cfg, module.task),
                schedule={"freq_steps": args.every, "eval_at_end": False},
                execution={
                    "mode": "sync" if kind == "sync" else "async",
                    "on_busy": "wait",
                    "async_threads": args.async_threads,
                },
                output_dir=f"{tmp}/{kind}",
                seed=SEED,
            )
        )
    trainer = make_trainer(f"{tmp}/{kind}", callbacks, args.steps, accelerator=args.accelerator)
    start = time.perf_counter()
    try:
        trainer.fit(module)
    finally:
        torch.set_num_threads(args.threads)
    return time.perf_counter() - start


def hidden_share(t_none: float, t_sync: float, t_async: float) -> float:
    """The share of sync's evaluation cost that async does not add to training time."""
    return 1.0 - (t_async - t_none) / (t_sync - t_none)


def thread_scaling(args: argparse.Namespace, steps: int = 20) -> dict[str, float]:
    """Training step and eval round wall time on 1 thread and on the whole budget, and the largest
    hidden share a fair split allows: while the worker has its thread, training runs on the
    others, so each round costs training ``E_async * (1 - t_all / t_fewer)``, against ``E_all`` in
    sync mode (E: a round's time, t: a step's time)."""
    cfg = _config(args)
    out: dict[str, float] = {}
    for threads in (args.threads - args.async_threads, args.threads):
        torch.set_num_threads(threads)
        L.seed_everything(SEED, verbose=False)
        module = build_module(cfg)
        with tempfile.TemporaryDirectory() as tmp:
            start = time.perf_counter()
            make_trainer(tmp, [], steps, accelerator=args.accelerator).fit(module)
            out[f"step_secs_{threads}"] = (time.perf_counter() - start) / steps
        torch.set_num_threads(args.async_threads if threads != args.threads else threads)
        start = time.perf_counter()
        run_round(module, build_eval_sets(cfg, module.task), type(module).evaluate, seed=SEED, global_step=0, epoch=0)
        out[f"round_secs_{'worker' if threads != args.threads else threads}"] = time.perf_counter() - start
    torch.set_num_threads(args.threads)
    fewer, full = args.threads - args.async_threads, args.threads
    if fewer >= 1:
        lost = out["round_secs_worker"] * (1 - out[f"step_secs_{full}"] / out[f"step_secs_{fewer}"])
        out["hidden_bound"] = 1 - lost / out[f"round_secs_{full}"]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=160, help="optimizer steps per fit")
    parser.add_argument("--every", type=int, default=30, help="evaluate every N steps")
    parser.add_argument("--eval-size", type=int, default=1000, help="prompts per eval set (easy and hard)")
    parser.add_argument("--n-samples", type=int, default=16, help="completions per prompt")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 2, help="total torch thread budget")
    parser.add_argument("--async-threads", type=int, default=1, help="of which the async worker gets")
    parser.add_argument(
        "--fixed-split", action="store_true", help="also: async with training on fewer threads throughout"
    )
    parser.add_argument("--accelerator", default="cpu")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    logging.getLogger("lightning").setLevel(logging.ERROR)
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    if args.threads > args.async_threads:
        scaling = thread_scaling(args)
        print(
            "thread scaling: "
            + ", ".join(f"{k} {v:.3f}" for k, v in scaling.items())
            + " (hidden_bound: the most a fair split can hide, steady state)",
            flush=True,
        )
    kinds = CONFIGS + ((FIXED,) if args.fixed_split else ())
    asyncs = [k for k in kinds if k.startswith("async")]
    times: dict[str, list[float]] = {k: [] for k in kinds}
    shares: dict[str, list[float]] = {k: [] for k in asyncs}
    rng = random.Random(0)
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            order = list(kinds)
            rng.shuffle(order)
            this = {k: _fit(k, args, f"{tmp}/{repeat}") for k in order}
            starts = _start_secs(f"{tmp}/{repeat}/async")
            for k, v in this.items():
                times[k].append(v)
            for k in asyncs:
                shares[k].append(hidden_share(this["none"], this["sync"], this[k]))
            print(
                f"repeat {repeat} (load {os.getloadavg()[0]:.1f}): "
                + ", ".join(f"{k} {this[k]:.2f} s" for k in kinds)
                + "; hidden "
                + ", ".join(f"{k} {shares[k][-1]:.0%}" for k in asyncs)
                + "; async rounds began "
                + ", ".join(f"{x:.2f}" for x in starts)
                + " s after falling due",
                flush=True,
            )
    med = {k: median(v) for k, v in times.items()}
    share = {k: hidden_share(med["none"], med["sync"], med[k]) for k in asyncs}
    target = TARGET_GPU if args.accelerator != "cpu" else TARGET_CPU
    out: dict[str, Any] = {
        "median_secs": med,
        "hidden_share_of_medians": share,
        "hidden_share_per_repeat": shares,
        "target": target,
        "args": vars(args),
    }
    if args.json:
        print(json.dumps(out))
        return
    print("median wall time: " + ", ".join(f"{k} {v:.2f} s" for k, v in med.items()))
    for k in asyncs:
        print(
            f"evaluation cost hidden by {k}: {share[k]:.0%} of medians (target {target:.0%}); per repeat: "
            + ", ".join(f"{s:.0%}" for s in shares[k])
        )


if __name__ == "__main__":
    main()
