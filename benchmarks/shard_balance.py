"""Cost balance of the eval-batch deal on an eval set with very uneven prompt lengths.

Balance = max rank cost / mean rank cost (1.0 is perfect; the target is at most 1.05), where a
batch costs ``len(batch) * longest prompt`` (padded generation). Compares our longest-processing-
time deal with a round-robin deal by count (batch i to rank i % W), on batches cut by count only
and on batches also capped by a cost budget (``max_batch_cost``), over several random eval sets.

    .venv/bin/python benchmarks/shard_balance.py [--samples 1000] [--batch-size 16] [--json]
"""

from __future__ import annotations

import argparse
import json
from statistics import mean

import numpy as np

from areal_lightning.eval_round.sharding import batch_costs, cost_balance, deal_batches, global_batches

TARGET = 1.05
WORLD_SIZES = (2, 4, 8)
# Prompt lengths in tokens: lognormal, median ~55, the longest of 1000 typically 20-40x the median.
PROMPT_LOG_MEAN = 4.0
PROMPT_LOG_SIGMA = 1.0
# The budget lets a batch cost at most this many full batches of median-length prompts.
BUDGET_IN_MEDIAN_BATCHES = 4


def prompt_lengths(samples: int, seed: int) -> list[int]:
    rng = np.random.default_rng(seed)
    lengths = rng.lognormal(PROMPT_LOG_MEAN, PROMPT_LOG_SIGMA, samples)
    return [int(x) for x in np.maximum(1, np.round(lengths))]


def round_robin(num_batches: int, world_size: int) -> list[list[int]]:
    return [list(range(rank, num_batches, world_size)) for rank in range(world_size)]


def measure(samples: int, batch_size: int, data_seeds: int) -> list[dict[str, float | int]]:
    """Return one row per world size: mean and worst balance over ``data_seeds`` eval sets."""
    balances: dict[tuple[int, str], list[float]] = {}
    for seed in range(data_seeds):
        lengths = prompt_lengths(samples, seed)
        budget = BUDGET_IN_MEDIAN_BATCHES * batch_size * float(np.median(lengths))
        cuts = {
            "count": global_batches(lengths, batch_size),
            "budget": global_batches(lengths, batch_size, max_batch_cost=budget),
        }
        for cut, batches in cuts.items():
            costs = batch_costs(lengths, batches)
            for world_size in WORLD_SIZES:
                deals = {
                    "lpt": deal_batches(costs, world_size),
                    "rr": round_robin(len(costs), world_size),
                }
                for deal, assignment in deals.items():
                    key = (world_size, f"{deal}_{cut}")
                    balances.setdefault(key, []).append(cost_balance(assignment, costs))
                # No deal of whole batches beats the heaviest batch over the mean rank cost.
                bound = max(1.0, max(costs) / (sum(costs) / world_size))
                balances.setdefault((world_size, f"bound_{cut}"), []).append(bound)
    rows: list[dict[str, float | int]] = []
    for world_size in WORLD_SIZES:
        row: dict[str, float | int] = {"world_size": world_size}
        for name in ("lpt_count", "rr_count", "lpt_budget", "rr_budget", "bound_count"):
            values = balances[(world_size, name)]
            row[f"{name}_mean"] = mean(values)
            row[f"{name}_worst"] = max(values)
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=1000)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--data-seeds", type=int, default=10, help="random eval sets to measure")
    parser.add_argument("--json", action="store_true", help="print one JSON object per world size")
    args = parser.parse_args()
    rows = measure(args.samples, args.batch_size, args.data_seeds)
    if args.json:
        for row in rows:
            print(json.dumps(row))
        return
    print(
        f"cost balance (max/mean rank cost), {args.samples} samples, batch {args.batch_size}, "
        f"lognormal prompt lengths (sigma {PROMPT_LOG_SIGMA}), {args.data_seeds} eval sets: "
        f"mean / worst; target <= {TARGET}"
    )
    print(f"{'ranks':>5}  {'LPT':>13}  {'round-robin':>13}  {'LPT+budget':>13}  {'RR+budget':>13}")
    for row in rows:
        cells = [
            f"{row[f'{name}_mean']:.3f} / {row[f'{name}_worst']:.3f}"
            for name in ("lpt_count", "rr_count", "lpt_budget", "rr_budget")
        ]
        print(f"{row['world_size']:>5}  " + "  ".join(f"{cell:>13}" for cell in cells))
    bounds = ", ".join(f"{row['world_size']} ranks {row['bound_count_worst']:.3f}" for row in rows)
    print(
        "no deal of whole batches beats (heaviest batch / mean rank cost); for batches cut by "
        f"count only, that bound is at worst: {bounds}; max_batch_cost (+budget) lowers it"
    )


if __name__ == "__main__":
    main()
