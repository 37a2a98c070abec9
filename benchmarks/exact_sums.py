"""Cost of the metrics' float sums on one eval round's worth of samples.

Times ``update`` over 80,000 values in batches of 1024, then one ``compute``, for the metrics
whose float sums are exact (RewardMetric, AdvantageMetric, PassAtK, ExactMean: the round's mean
of returned values), and torchmetrics' MeanMetric (a float sum) for scale; single process, CPU,
1 torch thread. A round of 80,000 samples takes about 7 s, so the metrics should stay in the
milliseconds.

Run: ``.venv/bin/python benchmarks/exact_sums.py [--samples 80000] [--batch 1024] [--repeats 5]``
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
from torchmetrics import MeanMetric, Metric

from areal_lightning.metrics import AdvantageMetric, PassAtK, RewardMetric
from areal_lightning.metrics.mean import ExactMean

GROUP = 8  # samples per prompt (advantage groups, pass@k rows)

CASES: dict[str, tuple[Callable[[], Metric], Callable[[torch.Tensor], tuple[torch.Tensor, ...]]]] = {
    "RewardMetric": (RewardMetric, lambda r: (r,)),
    "AdvantageMetric": (AdvantageMetric, lambda r: (r.view(-1, GROUP),)),
    "PassAtK(k=4)": (lambda: PassAtK(k=4), lambda r: (r.view(-1, GROUP) > 1.0,)),
    "ExactMean": (ExactMean, lambda r: (r,)),
    "MeanMetric (float)": (lambda: MeanMetric(nan_strategy="disable").set_dtype(torch.float64), lambda r: (r,)),
}


def time_metric(make: Callable[[], Metric], args: list[tuple[torch.Tensor, ...]]) -> tuple[float, float]:
    metric = make()
    start = time.perf_counter()
    for batch in args:
        metric.update(*batch)
    middle = time.perf_counter()
    metric.compute()
    return middle - start, time.perf_counter() - middle


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=80_000)
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=5)
    opts = parser.parse_args()
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    rewards = torch.randn(opts.samples, dtype=torch.float64, generator=gen).exp()
    batches = [rewards[i : i + opts.batch] for i in range(0, opts.samples, opts.batch)]
    batches = [b[: b.numel() // GROUP * GROUP] for b in batches]
    print(f"{opts.samples} values in {len(batches)} batches of {opts.batch}, best of {opts.repeats}")
    for name, (make, to_args) in CASES.items():
        args = [to_args(b) for b in batches]
        runs = [time_metric(make, args) for _ in range(opts.repeats)]
        update, compute = min(runs, key=sum)
        ms = [round(t * 1e3, 2) for t in (update, compute, update + compute)]
        print(f"  {name:18s} update {ms[0]:7.2f} ms, compute {ms[1]:6.2f} ms, total {ms[2]:7.2f} ms")


if __name__ == "__main__":
    main()
