"""A model of one eval round at 8 to 512 ranks, from measured parts.

1. Collectives and bytes of one round of the default `rollout_evaluate` (two eval sets: easy and
   hard), counted on 2 real gloo ranks by wrapping torch.distributed's tensor collectives, those
   that an object gather runs inside included (count, payload per rank). Run it on another
   checkout (``PYTHONPATH=<checkout>``) to model that code's round.
2. The deal of a 10,000-prompt set (lognormal prompt lengths, as `shard_balance.py`) at each world
   size, with the real deal code: balance (max/mean rank cost), batches of the busiest rank (the
   forwards every rank runs under lockstep), idle ranks.
3. Projected round time = compute of the busiest rank (seconds per unit of cost measured on this
   box's 1-process round, passed in with --secs-per-prompt) + collectives (ring all-gather
   model: ``(W - 1) * (latency + bytes_per_rank / bandwidth)`` per collective).

    .venv/bin/python benchmarks/round_scale_model.py [--secs-per-prompt 0.002] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path
from statistics import mean
from typing import Any

import numpy as np
from shard_balance import prompt_lengths

from areal_lightning.eval_round.sharding import batch_costs, cost_balance, deal_batches, global_batches

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from ddp_utils import run_ddp

WORLD_SIZES = (8, 16, 32, 64, 128, 256, 512)
PROMPTS = 10_000
# (batch size, max_batch_cost in full batches of median-length prompts or None), as shard_balance.py.
BATCHINGS = ((64, None), (16, None), (16, 4))
# Network assumptions (stated, not measured here): TCP/gloo over 10 GbE, and NCCL over InfiniBand.
NETWORKS = {"gloo_10GbE": (100e-6, 1.0e9), "nccl_IB": (10e-6, 20e9)}


_TENSOR_COLLECTIVES = ("all_gather", "all_gather_into_tensor", "all_reduce", "broadcast", "reduce", "gather")


def _count_round(rank: int, world_size: int) -> dict[str, Any]:
    """The tensor collectives one round of the default evaluation runs on this rank (those inside
    an object gather included: it runs two), and the bytes this rank sends in them."""
    import torch
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    from areal_lightning.app.builders import build_eval_sets, build_module
    from areal_lightning.app.config import load_config
    from areal_lightning.eval_round import run_round
    from areal_lightning.rl.rollout_eval import rollout_evaluate

    calls: Counter[str] = Counter()
    payload: Counter[str] = Counter()
    originals = {(mod, name): getattr(mod, name) for mod in (dist, c10d) for name in _TENSOR_COLLECTIVES}

    def wrap(name: str, fn: Any) -> Any:
        def counted(*args: Any, **kwargs: Any) -> Any:
            calls[name] += 1
            sent = args[1] if name in ("all_gather", "all_gather_into_tensor") else args[0]
            if isinstance(sent, torch.Tensor):
                payload[name] += sent.numel() * sent.element_size()
            return fn(*args, **kwargs)

        return counted

    cfg = load_config(
        None,
        ["eval_sets.easy.size=64", "eval_sets.hard.size=64", "eval_sets.hard.digits=2", "grpo.warmup_steps=0"],
    )
    module = build_module(cfg)
    sets = build_eval_sets(cfg, module.task)
    for (mod, name), fn in originals.items():
        setattr(mod, name, wrap(name, fn))
    try:
        run_round(module, sets, rollout_evaluate, seed=1, global_step=0, epoch=0)
    finally:
        for (mod, name), fn in originals.items():
            setattr(mod, name, fn)
    return {"calls": dict(calls), "bytes_per_rank": dict(payload)}


def deal_model(world_size: int, batch_size: int, budget: float | None, seeds: int = 3) -> dict[str, float]:
    rows = []
    for seed in range(seeds):
        lengths = prompt_lengths(PROMPTS, seed)
        cap = None if budget is None else budget * batch_size * float(np.median(lengths))
        batches = global_batches(lengths, batch_size, max_batch_cost=cap)
        costs = batch_costs(lengths, batches)
        dealt = deal_batches(costs, world_size)
        rows.append(
            {
                "batches": len(batches),
                "balance": cost_balance(dealt, costs),
                "busiest_batches": max(len(d) for d in dealt),
                "idle_ranks": sum(1 for d in dealt if not d),
                "max_rank_cost_share": max(sum(costs[b] for b in d) for d in dealt) / sum(costs),
            }
        )
    return {key: mean(r[key] for r in rows) for key in rows[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--secs-per-prompt",
        type=float,
        default=9.95 / 5000,
        help="1-process round seconds per prompt (RESULTS.md: 9.95 s for 5000 prompts x 16 samples)",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    counted = run_ddp(_count_round, 2, timeout_s=300)[0]
    collectives = sum(counted["calls"].values())
    bytes_per_rank = sum(counted["bytes_per_rank"].values())
    out: dict[str, Any] = {"collectives_per_round": counted, "rows": []}
    for batch_size, budget in BATCHINGS:
        for w in WORLD_SIZES:
            deal = deal_model(w, batch_size, budget)
            compute = args.secs_per_prompt * PROMPTS * deal["max_rank_cost_share"]
            comm = {
                net: collectives * (w - 1) * lat + (w - 1) * bytes_per_rank / bw for net, (lat, bw) in NETWORKS.items()
            }
            out["rows"].append(
                {
                    "world_size": w,
                    "batch_size": batch_size,
                    "budget": budget,
                    **deal,
                    "compute_secs": compute,
                    **{f"comm_secs_{k}": v for k, v in comm.items()},
                    "gather_bytes_at_rank": (w - 1) * bytes_per_rank,
                }
            )
    if args.json:
        print(json.dumps(out))
        return
    print(
        f"one round, two eval sets, default rollout_evaluate, counted on 2 gloo ranks: {counted['calls']} "
        f"({collectives} collectives), bytes sent per rank {counted['bytes_per_rank']}"
    )
    print(
        f"{PROMPTS} prompts, lognormal lengths, 1-process cost {args.secs_per_prompt * PROMPTS:.1f} s; "
        "comm = collectives x (W-1) x latency + (W-1) x bytes / bandwidth"
    )
    print(
        "batch  budget  ranks  batches  balance  busiest(batches)  idle  compute_s  comm_s(gloo 10GbE)  comm_s(NCCL IB)"
    )
    for r in out["rows"]:
        print(
            f"{r['batch_size']:>5}  {r['budget']!s:>6}  {r['world_size']:>5}  "
            f"{r['batches']:>7.0f}  {r['balance']:>7.3f}  "
            f"{r['busiest_batches']:>16.1f}  {r['idle_ranks']:>4.0f}  {r['compute_secs']:>9.3f}  "
            f"{r['comm_secs_gloo_10GbE']:>18.4f}  {r['comm_secs_nccl_IB']:>15.4f}"
        )


if __name__ == "__main__":
    main()
