"""Many short training steps with a round every few: the history is exact and memory stays flat.

A tiny regression model trains for `--steps` optimizer steps (one-sample batches, so a step costs
Lightning's loop and little else); `EvaluationCallback` evaluates two eval sets every `--every`
steps with torchmetrics state (reward, accuracy, pass@k) and table rows. After the run the eval
history must hold exactly one record per eval set per round, in order. The resident set size
(VmRSS) is read after rounds 10 and `--steps / --every` (the last), and their ratio printed:
a history, metric or table leak grows it round after round.

    .venv/bin/python benchmarks/load_rounds.py [--steps 10000] [--every 10] [--json]
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from areal_lightning.callbacks import EvaluationCallback
from areal_lightning.metrics import AccuracyMetric, PassAtK, RewardMetric
from areal_lightning.tracking.history import eval_rows, read_history

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from callback_helpers import make_trainer  # the tests' quiet CPU Trainer, reused

EVAL_SETS = {"easy": [0.2 * i for i in range(16)], "hard": [0.1 * i for i in range(8)]}
EARLY_ROUND = 10


class _Regression(L.LightningModule):
    def __init__(self, samples: int = 64) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(0)
        self.layer = nn.Linear(8, 1)
        self.x, self.y = torch.randn(samples, 8, generator=generator), torch.randn(samples, 1, generator=generator)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=1e-3)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(TensorDataset(self.x, self.y), batch_size=1)


def _evaluate(module: nn.Module, batches: Any, ctx: Any) -> dict[str, Any]:
    reward, accuracy = ctx.metric("reward", RewardMetric), ctx.metric("accuracy", AccuracyMetric)
    pass_at_2 = ctx.metric("pass@2", lambda: PassAtK(2))
    for batch in batches:
        x = torch.tensor(batch.samples, dtype=torch.float32)[:, None].repeat(1, 8)
        scores = torch.sigmoid(module.layer(x)).repeat(1, 2)
        reward.update(scores)
        accuracy.update(scores)
        pass_at_2.update(scores > 0.5)
        for index, value in zip(batch.indices, batch.samples, strict=True):
            ctx.record_sample(index, sample=value)
    return {}


def _rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


class _RssAfterRounds(L.Callback):
    """Reads the RSS after the evaluation callback's round at the given round numbers."""

    def __init__(self, every: int, rounds: set[int]) -> None:
        self.every, self.rounds, self.rss = every, rounds, {}

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        step = trainer.global_step
        if step % self.every == 0 and step // self.every in self.rounds:
            self.rss[step // self.every] = _rss_mib()


def run(steps: int, every: int, out_dir: Path) -> dict[str, Any]:
    """Trains, evaluating every `every` steps; returns the counts, RSS and timing of the run."""
    last_round = steps // every
    probe = _RssAfterRounds(every, {EARLY_ROUND, last_round})
    callback = EvaluationCallback(
        EVAL_SETS,
        _evaluate,
        schedule={"freq_steps": every, "eval_at_end": False},
        rounds={"max_table_rows": 4},
        output_dir=out_dir,
    )
    trainer = make_trainer(out_dir, [callback, probe], steps)  # the probe runs after the round of the same step
    start = time.perf_counter()
    trainer.fit(_Regression())
    secs = time.perf_counter() - start
    rows = eval_rows(read_history(out_dir))
    expected = [(step, name) for step in range(every, steps + 1, every) for name in EVAL_SETS]
    return {
        "steps": steps,
        "every": every,
        "records": len(rows),
        "expected_records": len(expected),
        "exact": [(r["step"], r["dataset"]) for r in rows] == expected,
        "rss_mib": {str(k): round(v, 1) for k, v in sorted(probe.rss.items())},
        "rss_ratio_last_to_early": round(
            probe.rss.get(last_round, float("nan")) / probe.rss.get(EARLY_ROUND, float("nan")), 4
        ),
        "secs": round(secs, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--every", type=int, default=10)
    parser.add_argument("--out", default=None, help="run directory (default: a temporary one)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    logging.getLogger("lightning").setLevel(logging.ERROR)
    logging.getLogger("areal_lightning").setLevel(logging.WARNING)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        result = run(args.steps, args.every, Path(args.out or tmp))
    if args.json:
        print(json.dumps(result))
        return
    print(
        f"{result['steps']} steps, a round every {result['every']}: {result['records']} records "
        f"(expected {result['expected_records']}, exact order: {result['exact']}) in {result['secs']} s"
    )
    print(
        f"RSS after rounds {', '.join(result['rss_mib'])}: {', '.join(map(str, result['rss_mib'].values()))} MiB; "
        f"ratio {result['rss_ratio_last_to_early']}"
    )


if __name__ == "__main__":
    main()
