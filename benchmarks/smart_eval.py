"""Cheaper evaluation, measured side by side in one process on one policy:

* a stratified subset vs the full eval set: eval time, and the subset's accuracy as an estimate of the
  full set's (its t interval with the finite-population correction, and whether the full value lies in it);
* the result cache: a round answered from the cache (weights digest + one file read) vs evaluated;
* bf16 vs fp32 evaluation: eval time, and the accuracy change as a paired difference over the same
  prompts and per-prompt seeds (`metrics.paired`), with its 95% interval.

The policy is the default tiny one after its format warm-up and `--train-steps` GRPO steps on 1-digit sums.

    PYTHONPATH=$PWD python benchmarks/smart_eval.py --size 2000 --fraction 0.1
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from areal_lightning.app.builders import build_eval_sets, build_module
from areal_lightning.app.config import load_config
from areal_lightning.eval_round import SetResult, run_round
from areal_lightning.eval_round.cache import ResultCache, result_key, weights_digest
from areal_lightning.eval_round.precision import EvalPrecision, eval_precision
from areal_lightning.eval_round.subsample import Subsample, subsample
from areal_lightning.metrics.paired import PairedChange, t_quantile
from areal_lightning.rl.grpo.module import GRPOModule
from areal_lightning.rl.rollout_eval import rollout_evaluate

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from callback_helpers import make_trainer  # the tests' quiet CPU Trainer, reused


def timed_round(module: GRPOModule, eval_set, precision: EvalPrecision = EvalPrecision.FP32) -> tuple[SetResult, float]:
    start = time.perf_counter()
    with eval_precision(module, precision):
        (result,) = run_round(module, [eval_set], rollout_evaluate, seed=1, global_step=0, epoch=0)
    return result, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=2000)
    parser.add_argument("--fraction", type=float, default=0.1)
    parser.add_argument("--train-steps", type=int, default=60)
    parser.add_argument("--repeats", type=int, default=2, help="best of N for every timing")
    args = parser.parse_args()

    cfg = load_config(None, [f"eval_sets.easy.size={args.size}", "eval_sets.easy.n_samples=4"])
    module = build_module(cfg)
    with tempfile.TemporaryDirectory() as root:
        make_trainer(root, [], args.train_steps).fit(module)
        (full_set,) = build_eval_sets(cfg, module.task)
        sub_set = subsample(full_set, Subsample(fraction=args.fraction, seed=cfg.seed))

        def best(fn):
            runs = [fn() for _ in range(args.repeats)]
            return min(runs, key=lambda r: r[1])

        full, full_secs = best(lambda: timed_round(module, full_set))
        sub, sub_secs = best(lambda: timed_round(module, sub_set))
        half, half_secs = best(lambda: timed_round(module, full_set, EvalPrecision.BF16))

        # The subset's accuracy estimates the full set's: t interval with finite-population correction.
        values = list(sub.outcomes["accuracy"].values())
        m, n = len(values), len(full_set.samples)
        half_width = t_quantile(0.975, m - 1) * statistics.stdev(values) / math.sqrt(m) * math.sqrt(1 - m / n)
        acc_full, acc_sub = full.metrics["accuracy"], sub.metrics["accuracy"]

        # Cache: the same weights and settings, answered from disk.
        cache = ResultCache(Path(root) / "eval_cache")
        settings = {"seed": 1, "precision": "32"}

        def miss() -> tuple[None, float]:
            start = time.perf_counter()
            result, _ = timed_round(module, full_set)
            cache.put(result_key(weights_digest(module), full_set, **settings), result)
            return None, time.perf_counter() - start

        def hit() -> tuple[SetResult | None, float]:
            start = time.perf_counter()
            cached = cache.get(result_key(weights_digest(module), full_set, **settings))
            return cached, time.perf_counter() - start

        _, miss_secs = best(miss)
        cached, hit_secs = best(hit)
        assert cached is not None and cached.metrics["accuracy"] == acc_full

        paired = PairedChange()
        common = sorted(full.outcomes["accuracy"])
        paired.update(
            torch.tensor([half.outcomes["accuracy"][i] for i in common], dtype=torch.float64),
            torch.tensor([full.outcomes["accuracy"][i] for i in common], dtype=torch.float64),
        )
        change = paired.compute()

    print(f"policy: tiny, format warm-up + {args.train_steps} GRPO steps; eval set: {n} one-digit sums x 4 samples")
    print(f"{'':34}{'secs':>8}{'accuracy':>10}")
    print(f"{'full set (fp32)':34}{full_secs:8.2f}{acc_full:10.4f}")
    print(f"{f'stratified subset {m} prompts':34}{sub_secs:8.2f}{acc_sub:10.4f}")
    print(f"{'full set, bf16 autocast':34}{half_secs:8.2f}{half.metrics['accuracy']:10.4f}")
    print(f"{'full set, cache miss (eval+store)':34}{miss_secs:8.2f}")
    print(f"{'full set, cache hit':34}{hit_secs:8.4f}")
    print(
        f"subset: time saved {1 - sub_secs / full_secs:.1%}; deviation {acc_sub - acc_full:+.4f}; "
        f"95% interval of the estimate [{acc_sub - half_width:.4f}, {acc_sub + half_width:.4f}] "
        f"{'contains' if abs(acc_sub - acc_full) <= half_width else 'MISSES'} the full value"
    )
    print(f"cache: hit {miss_secs / hit_secs:.0f}x faster than a miss")
    print(
        f"bf16: time ratio bf16/fp32 {half_secs / full_secs:.2f}; accuracy change {change.delta:+.4f}, "
        f"paired 95% interval [{change.low:+.4f}, {change.high:+.4f}] over {change.n} prompts"
    )


if __name__ == "__main__":
    main()
