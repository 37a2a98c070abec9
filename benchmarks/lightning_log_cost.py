"""What Lightning's `self.log` costs a training step, side by side in one process.

A one-layer module trains on random data twice in a row, alternating fits: once logging nothing,
once logging `--keys` scalars a step from `training_step` (`GRPOModule` logs 17). Each call runs
`_ResultMetric.to(device)`, which walks the stored metric's `__dict__` with `apply_to_collection`
and deep-copies its metadata dataclass, even when the value is already on that device. The medians
of `--repeats` fits are printed, and the cost per key.

    .venv/bin/python benchmarks/lightning_log_cost.py [--keys 17] [--steps 400] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

import lightning as L
import torch


class Logging(L.LightningModule):
    def __init__(self, keys: int, steps: int) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
        self.keys, self.steps = keys, steps

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        loss = self.layer(batch).sum()
        for k in range(self.keys):
            self.log(f"train/k{k}", loss.detach() * k, batch_size=len(batch))
        return loss

    def train_dataloader(self) -> torch.utils.data.DataLoader:
        return torch.utils.data.DataLoader(torch.randn(self.steps * 8, 2), batch_size=8)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def ms_per_step(keys: int, steps: int) -> float:
    trainer = L.Trainer(
        max_steps=steps, accelerator="cpu", logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    start = time.perf_counter()
    trainer.fit(Logging(keys, steps))
    return (time.perf_counter() - start) / steps * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=17)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    none, some = [], []
    for _ in range(args.repeats):
        none.append(ms_per_step(0, args.steps))
        some.append(ms_per_step(args.keys, args.steps))
    base, logged = statistics.median(none), statistics.median(some)
    print(f"no key logged: {base:.2f} ms/step; {args.keys} keys: {logged:.2f} ms/step")
    print(f"self.log: {(logged - base) / args.keys:.2f} ms a key ({logged / base:.1f}x the bare step)")


if __name__ == "__main__":
    main()
