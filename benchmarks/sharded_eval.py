"""Sharded evaluation: the eval round on 1 vs 2 CPU processes, wall time and CPU seconds per rank.

Trains a checkpoint for one step (after the default format warm-up), then, interleaved and
repeated so that a busy spell on a shared box hits every variant alike:

1. ``areal-lightning evaluate`` of that checkpoint on one 2-digit eval set: 1 process on 1 thread,
   1 process on 2 threads (what one process makes of the second core), and
   ``trainer.devices=2 trainer.strategy=ddp`` (1 thread per process, as Lightning sets it). The
   eval round's wall time is ``eval_secs`` of the eval history (rank 0; it waits for the slowest
   rank at the reduction); the whole command's wall time includes imports, launch and loading.
2. The same round in-process on 1 and 2 gloo ranks (``tests/ddp_utils.run_ddp``), one thread per
   rank, timed per rank: CPU seconds (``time.process_time``: user + system of that process), wall
   seconds, the rank's own ``evaluate_fn`` and the reduction after the slowest rank's
   ``evaluate_fn`` returned. CPU seconds do not count time spent waiting for a core, so
   ``1-rank CPU / largest 2-rank CPU`` is the speed-up two free cores give.
3. The cost balance (max rank cost / mean rank cost; target <= 1.05) of the deal on eval sets
   with very uneven (lognormal) prompt lengths, from ``benchmarks/shard_balance.py``.

    .venv/bin/python benchmarks/sharded_eval.py [--size 5000] [--n-samples 16] [--repeats 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import mean
from typing import Any

import yaml

# a sibling script (benchmarks/ is sys.path[0])
from shard_balance import TARGET, measure

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from callback_helpers import make_trainer  # the tests' quiet CPU Trainer, reused
from ddp_utils import run_ddp  # the tests' gloo launcher, reused
from procs import evaluate_command

EVAL_SET = "bench"
BALANCE_SAMPLES = 1000
BALANCE_BATCH_SIZE = 16
BALANCE_DATA_SEEDS = 10
RUN_TIMEOUT_S = 600


def write_config(root: Path, size: int, n_samples: int, batch_size: int) -> Path:
    config = {
        "seed": 1,
        "trainer": {"enable_progress_bar": False},
        "eval_sets": {
            EVAL_SET: {"digits": 2, "size": size, "n_samples": n_samples, "batch_size": batch_size, "temperature": 1.0}
        },
    }
    path = root / "bench.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def make_checkpoint(config: Path, root: Path) -> Path:
    """A checkpoint of the default tiny policy after its format warm-up and one GRPO step, so that
    completions end at EOS as a trained policy's do (generation stops early when every row ended)."""
    import torch

    from areal_lightning.app.builders import build_module
    from areal_lightning.app.config import load_config

    torch.set_num_threads(1)
    module = build_module(load_config(config))
    trainer = make_trainer(root, [], 1)
    trainer.fit(module)
    path = root / "bench.ckpt"
    trainer.save_checkpoint(path)
    return path


COMMANDS = {"1 proc, 1 thread": (1, 1), "1 proc, 2 threads": (1, 2), "2 procs (ddp), 1 thread each": (2, 1)}
ONE, TWO = "1 proc, 1 thread", "2 procs (ddp), 1 thread each"


def evaluate(config: Path, ckpt: Path, out: Path, devices: int, threads: int) -> dict[str, Any]:
    """Runs the evaluate command; returns its wall time and its eval-history record."""
    command = evaluate_command(config, ckpt, "--trust-checkpoint", f"output_dir={out}")
    if devices > 1:
        command += [f"trainer.devices={devices}", "trainer.strategy=ddp"]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=RUN_TIMEOUT_S, check=False)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"evaluate on {devices} process(es) failed:\n{done.stderr[-3000:]}")
    from areal_lightning.tracking.history import read_history

    record = read_history(out)[-1]
    return {"wall_secs": wall, "eval_secs": record["eval_secs"], "record": record}


def round_on_rank(rank: int, world_size: int, config: str, ckpt: str) -> dict[str, float]:
    """This rank's round, timed: CPU and wall seconds, its `evaluate_fn`, and when that returned."""
    import torch

    from areal_lightning.app.builders import build_eval_sets, build_module
    from areal_lightning.app.checkpoints import (
        STATE_DICT_KEY,
        load_checkpoint,
        load_weights,
    )
    from areal_lightning.app.config import load_config
    from areal_lightning.eval_round import check_eval_sets_consistent, run_round
    from areal_lightning.rl.rollout_eval import rollout_evaluate

    torch.set_num_threads(1)
    cfg = load_config(config)
    module = build_module(cfg)
    load_weights(module, load_checkpoint(ckpt, trust=True)[STATE_DICT_KEY], ckpt)
    eval_sets = build_eval_sets(cfg, module.task)
    check_eval_sets_consistent(eval_sets)  # also lines the ranks up before the clocks start
    stamps: dict[str, float] = {}

    def timed(module: Any, batches: Any, ctx: Any) -> Any:
        begin = time.perf_counter()
        out = rollout_evaluate(module, batches, ctx)
        stamps["evaluate_fn_secs"], stamps["evaluate_fn_end"] = time.perf_counter() - begin, time.perf_counter()
        return out

    cpu, wall = time.process_time(), time.perf_counter()
    run_round(module, eval_sets, timed, seed=cfg.seed, global_step=0, epoch=0)
    # perf_counter is CLOCK_MONOTONIC on Linux: the ranks' stamps compare across processes
    return {
        "cpu_secs": time.process_time() - cpu,
        "wall_secs": time.perf_counter() - wall,
        "round_end": time.perf_counter(),
        **stamps,
    }


def in_process(config: Path, ckpt: Path, world_size: int) -> dict[str, Any]:
    ranks = run_ddp(round_on_rank, world_size, str(config), str(ckpt), timeout_s=RUN_TIMEOUT_S)
    last_done = max(r["evaluate_fn_end"] for r in ranks)
    return {
        "cpu_secs": [r["cpu_secs"] for r in ranks],
        "wall_secs": [r["wall_secs"] for r in ranks],
        "evaluate_fn_secs": [r["evaluate_fn_secs"] for r in ranks],
        "reduce_ms": [1000 * (r["round_end"] - last_done) for r in ranks],
    }


def _progress(line: str) -> None:
    """Each run as it ends, on stderr: a crash later in a long run keeps what was measured."""
    print(line, file=sys.stderr, flush=True)


def _fmt(values: list[float], digits: int = 2) -> str:
    return ", ".join(f"{v:.{digits}f}" for v in values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=5000, help="prompts in the eval set")
    parser.add_argument("--n-samples", type=int, default=16, help="completions per prompt")
    parser.add_argument("--batch-size", type=int, default=64, help="prompts per eval batch")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each variant, interleaved; the fastest counts")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()

    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="sharded_eval_") as tmp:
        root = Path(tmp)
        config = write_config(root, args.size, args.n_samples, args.batch_size)
        ckpt = make_checkpoint(config, root)
        runs: dict[str, list[dict]] = {name: [] for name in COMMANDS}
        rounds: dict[int, list[dict]] = {1: [], 2: []}
        for repeat in range(args.repeats):  # interleaved, so a slow spell on the box hits every variant
            for name, (devices, threads) in COMMANDS.items():
                runs[name].append(evaluate(config, ckpt, root / f"{devices}x{threads}_{repeat}", devices, threads))
                _progress(f"repeat {repeat}, {name}: eval round {runs[name][-1]['eval_secs']:.2f} s")
            for world_size, timed in rounds.items():
                timed.append(in_process(config, ckpt, world_size))
                _progress(f"repeat {repeat}, in-process {world_size} rank(s): wall {_fmt(timed[-1]['wall_secs'])} s")
    best = {name: min(r["eval_secs"] for r in rs) for name, rs in runs.items()}
    reference = runs[ONE][0]["record"]["metrics"]
    # per variant: every run logged the numbers of the first 1-process, 1-thread run
    same = {name: all(r["record"]["metrics"] == reference for r in rs) for name, rs in runs.items()}
    prompts = sorted({r["record"]["num_prompts"] for rs in runs.values() for r in rs})
    cpu_one = min(r["cpu_secs"][0] for r in rounds[1])
    cpu_two = min(rounds[2], key=lambda r: max(r["cpu_secs"]))["cpu_secs"]
    balance = measure(BALANCE_SAMPLES, BALANCE_BATCH_SIZE, BALANCE_DATA_SEEDS)
    summary = {
        "eval_set": {"digits": 2, "size": args.size, "n_samples": args.n_samples, "batch_size": args.batch_size},
        "eval_round_secs": {name: [round(r["eval_secs"], 3) for r in rs] for name, rs in runs.items()},
        "command_secs": {name: [round(r["wall_secs"], 2) for r in rs] for name, rs in runs.items()},
        "ratio_eval_round": round(best[ONE] / best[TWO], 3),
        "ratio_vs_two_threads": round(best["1 proc, 2 threads"] / best[TWO], 3),
        "in_process": rounds,
        "ratio_cpu": round(cpu_one / max(cpu_two), 3),
        "rank_cpu_balance": round(max(cpu_two) / mean(cpu_two), 3),
        "same_metrics_as_1_proc_1_thread": same,
        "num_prompts": prompts,
        "load_average": {"before": load_before, "after": os.getloadavg()},
        "balance": balance,
    }
    if args.json:
        print(json.dumps(summary))
        return
    print(
        f"eval set: 2-digit sums, {args.size} prompts x {args.n_samples} samples, batch {args.batch_size}; "
        f"{args.repeats} interleaved runs of each variant, the fastest counts; load average before "
        f"{_fmt(list(load_before))}, after {_fmt(list(os.getloadavg()))}"
    )
    print("1. areal-lightning evaluate, eval-round wall time (eval_secs of the history; all runs) and whole command:")
    for name, rs in runs.items():
        print(
            f"  {name:30s} {best[name]:7.2f} s   ({_fmt([r['eval_secs'] for r in rs])})   "
            f"command {min(r['wall_secs'] for r in rs):.1f} s"
        )
    print(
        f"  RATIO eval round 1 proc / 2 procs: {summary['ratio_eval_round']:.2f}x "
        f"(vs 1 proc on 2 threads: {summary['ratio_vs_two_threads']:.2f}x); num_prompts {prompts}"
    )
    print("  same metrics as 1 proc, 1 thread in every run: " + "; ".join(f"{n}: {v}" for n, v in same.items()))
    print(
        "2. the same round in-process (gloo), per run: CPU seconds per rank | wall per rank | reduction after the "
        "slowest rank's evaluate_fn, ms"
    )
    for world_size, rs in rounds.items():
        for r in rs:
            print(
                f"  {world_size} rank(s): CPU {_fmt(r['cpu_secs'])} | wall {_fmt(r['wall_secs'])} | "
                f"reduce {_fmt(r['reduce_ms'], 1)}"
            )
    print(
        f"  RATIO CPU 1 rank / busiest of 2 ranks (the speed-up 2 free cores give): {summary['ratio_cpu']:.2f}x "
        f"({cpu_one:.2f} s vs {_fmt(cpu_two)} s; rank balance max/mean {summary['rank_cpu_balance']:.3f})"
    )
    print(
        f"3. cost balance (max/mean rank cost) of the deal, {BALANCE_SAMPLES} prompts of lognormal length, "
        f"batch {BALANCE_BATCH_SIZE}, {BALANCE_DATA_SEEDS} eval sets: mean / worst; target <= {TARGET}"
    )
    for row in balance:
        print(
            f"  {row['world_size']} ranks: batches cut by count {row['lpt_count_mean']:.3f} / "
            f"{row['lpt_count_worst']:.3f}, with max_batch_cost {row['lpt_budget_mean']:.3f} / "
            f"{row['lpt_budget_worst']:.3f} (round-robin by count: {row['rr_count_mean']:.3f} / "
            f"{row['rr_count_worst']:.3f})"
        )


if __name__ == "__main__":
    main()
