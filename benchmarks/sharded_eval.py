"""Sharded evaluation: wall time on 1 vs 2 CPU processes, and the cost balance of the deal.

1. Trains a checkpoint for one step (after the default format warm-up), then runs
   ``areal-lightning evaluate`` on the same 2-digit eval set with 1 process and with
   ``trainer.devices=2 trainer.strategy=ddp``, each process on one thread (OMP_NUM_THREADS=1).
   Reports the eval round's own time (``eval_secs`` of the eval history, rank 0, which waits for
   the slowest rank at the round's reduction), the whole command's wall time (imports, launch,
   checkpoint load included), the speed-up, and whether both runs logged the same metrics.
   On a box shared with other jobs the wall-clock speed-up is capped by the free cores, so:
2. The same round in-process on 1 and 2 gloo ranks (``tests/ddp_utils.run_ddp``), with each
   rank's CPU seconds: how the work splits, and the speed-up 2 free cores would give
   (CPU seconds on 1 rank / the largest rank's CPU seconds on 2), plus the measured balance.
3. The cost balance (max rank cost / mean rank cost; target <= 1.05) of the deal on eval sets
   with very uneven (lognormal) prompt lengths, from ``benchmarks/shard_balance.py``.

    .venv/bin/python benchmarks/sharded_eval.py [--size 5000] [--n-samples 16] [--repeats 2] [--json]
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

import yaml
from shard_balance import TARGET, measure

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from ddp_utils import run_ddp

EVAL_SET = "bench"
BALANCE_SAMPLES = 1000
BALANCE_BATCH_SIZE = 16
BALANCE_DATA_SEEDS = 10
RUN_TIMEOUT_S = 600


def write_config(root: Path, size: int, n_samples: int, batch_size: int) -> Path:
    config = {
        "seed": 1,
        "trainer": {"enable_progress_bar": False},
        "eval_sets": {EVAL_SET: {"digits": 2, "size": size, "n_samples": n_samples, "batch_size": batch_size,
                                 "temperature": 1.0}},
    }
    path = root / "bench.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def make_checkpoint(config: Path, root: Path) -> Path:
    """A checkpoint of the default tiny policy after its format warm-up and one GRPO step, so that
    completions end at EOS as a trained policy's do (generation stops early when every row ended)."""
    import lightning as L
    import torch

    from areal_lightning.app.config import load_config
    from areal_lightning.rl.grpo import GRPOModule

    torch.set_num_threads(1)
    module = GRPOModule.from_config(load_config(config))
    trainer = L.Trainer(max_steps=1, accelerator="cpu", logger=False, enable_progress_bar=False,
                        enable_checkpointing=False, enable_model_summary=False, default_root_dir=root)
    trainer.fit(module)
    path = root / "bench.ckpt"
    trainer.save_checkpoint(path)
    return path


def evaluate(config: Path, ckpt: Path, out: Path, devices: int) -> dict[str, float | dict]:
    """Runs the evaluate command; returns its wall time and its eval-history record."""
    command = [sys.executable, "-m", "areal_lightning", "evaluate", "-c", str(config), "--ckpt", str(ckpt), "--trust-checkpoint",
               f"output_dir={out}"]
    if devices > 1:
        command += [f"trainer.devices={devices}", "trainer.strategy=ddp"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}  # one thread per process
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=RUN_TIMEOUT_S)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"evaluate on {devices} process(es) failed:\n{done.stderr[-3000:]}")
    from areal_lightning.tracking.history import read_history

    record = read_history(out)[-1]
    return {"wall_secs": wall, "eval_secs": record["eval_secs"], "record": record}


def round_cpu_secs(rank: int, world_size: int, config: str, ckpt: str) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of this rank's evaluation round, on one thread."""
    import torch

    from areal_lightning.app.builders import build_eval_sets
    from areal_lightning.app.config import load_config
    from areal_lightning.app.evaluate import STATE_DICT_KEY, load_checkpoint, load_weights
    from areal_lightning.eval_round import check_eval_sets_consistent, run_round
    from areal_lightning.rl.grpo import GRPOModule
    from areal_lightning.rl.rollout_eval import rollout_evaluate

    torch.set_num_threads(1)
    cfg = load_config(config)
    module = GRPOModule.from_config(cfg)
    load_weights(module, load_checkpoint(ckpt, trust=True)[STATE_DICT_KEY], ckpt)
    eval_sets = build_eval_sets(cfg, module.task)
    check_eval_sets_consistent(eval_sets)  # also lines the ranks up before the clocks start
    cpu, wall = time.process_time(), time.perf_counter()
    run_round(module, eval_sets, rollout_evaluate, seed=cfg.seed, global_step=0, epoch=0)
    return time.process_time() - cpu, time.perf_counter() - wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=5000, help="prompts in the eval set")
    parser.add_argument("--n-samples", type=int, default=16, help="completions per prompt")
    parser.add_argument("--batch-size", type=int, default=64, help="prompts per eval batch")
    parser.add_argument("--repeats", type=int, default=2, help="runs per process count; the fastest counts")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="sharded_eval_") as tmp:
        root = Path(tmp)
        config = write_config(root, args.size, args.n_samples, args.batch_size)
        ckpt = make_checkpoint(config, root)
        runs: dict[int, list[dict]] = {1: [], 2: []}
        for repeat in range(args.repeats):  # interleaved, so a slow spell on the box hits both
            for devices in runs:
                runs[devices].append(evaluate(config, ckpt, root / f"p{devices}_{repeat}", devices))
        cpu = {w: run_ddp(round_cpu_secs, w, str(config), str(ckpt), timeout_s=RUN_TIMEOUT_S) for w in (1, 2)}
    best = {d: min(rs, key=lambda r: r["eval_secs"]) for d, rs in runs.items()}
    metrics = [r["record"]["metrics"] for rs in runs.values() for r in rs]
    identical = all(m == metrics[0] for m in metrics)
    prompts = {r["record"]["num_prompts"] for rs in runs.values() for r in rs}
    speedup_eval = best[1]["eval_secs"] / best[2]["eval_secs"]
    speedup_wall = min(r["wall_secs"] for r in runs[1]) / min(r["wall_secs"] for r in runs[2])
    balance = measure(BALANCE_SAMPLES, BALANCE_BATCH_SIZE, BALANCE_DATA_SEEDS)
    rank_cpu = [c for c, _ in cpu[2]]
    speedup_cpu = cpu[1][0][0] / max(rank_cpu)
    cpu_balance = max(rank_cpu) / (sum(rank_cpu) / len(rank_cpu))

    summary = {
        "eval_set": {"digits": 2, "size": args.size, "n_samples": args.n_samples, "batch_size": args.batch_size},
        "eval_secs": {d: [round(r["eval_secs"], 3) for r in rs] for d, rs in runs.items()},
        "wall_secs": {d: [round(r["wall_secs"], 2) for r in rs] for d, rs in runs.items()},
        "speedup_eval": round(speedup_eval, 3), "speedup_wall": round(speedup_wall, 3),
        "round_cpu_secs": {w: [round(c, 3) for c, _ in r] for w, r in cpu.items()},
        "speedup_with_free_cores": round(speedup_cpu, 3), "rank_cpu_balance": round(cpu_balance, 3),
        "identical_metrics": identical, "num_prompts": sorted(prompts),
        "accuracy": metrics[0].get("accuracy"), "load_average": os.getloadavg(),
        "balance": balance,
    }
    if args.json:
        print(json.dumps(summary))
        return
    print(f"eval set: 2-digit sums, {args.size} prompts x {args.n_samples} samples, batch {args.batch_size}, "
          f"one thread per process, best of {args.repeats}")
    for devices in runs:
        each = ", ".join(f"{r['eval_secs']:.2f}" for r in runs[devices])
        print(f"  {devices} process(es): eval round {best[devices]['eval_secs']:.2f} s (runs: {each}), "
              f"whole command {min(r['wall_secs'] for r in runs[devices]):.1f} s")
    print(f"  speed-up 2 vs 1 process: eval round {speedup_eval:.2f}x, whole command {speedup_wall:.2f}x")
    print(f"  same metrics in every run: {identical}; num_prompts: {sorted(prompts)}; "
          f"load average during the runs: {', '.join(f'{x:.1f}' for x in os.getloadavg())}")
    print(f"in-process round, CPU seconds per rank: 1 rank {cpu[1][0][0]:.2f} s; 2 ranks "
          f"{' + '.join(f'{c:.2f}' for c in rank_cpu)} s (max/mean {cpu_balance:.3f}); "
          f"speed-up with 2 free cores {speedup_cpu:.2f}x")
    print(f"cost balance (max/mean rank cost) of the deal, {BALANCE_SAMPLES} prompts of lognormal length, "
          f"batch {BALANCE_BATCH_SIZE}, {BALANCE_DATA_SEEDS} eval sets: mean / worst; target <= {TARGET}")
    for row in balance:
        print(f"  {row['world_size']} ranks: batches cut by count {row['lpt_count_mean']:.3f} / "
              f"{row['lpt_count_worst']:.3f}, with max_batch_cost {row['lpt_budget_mean']:.3f} / "
              f"{row['lpt_budget_worst']:.3f} (round-robin by count: {row['rr_count_mean']:.3f} / "
              f"{row['rr_count_worst']:.3f})")


if __name__ == "__main__":
    main()
