"""Cost of `EvaluationCallback` on training steps where nothing is evaluated.

A small MLP trains on random data in one process, in three configurations: no callback, an empty
``lightning.Callback()`` (what Lightning's hook dispatch costs any callback) and the
`EvaluationCallback`. The callback is configured so that it works on every step and never
evaluates inside the run: ``freq_steps`` beyond the run, ``freq_secs`` very large (the time
trigger still reads the clock every step), no evaluation before training or at the end.
Target: a slowdown under 1 %.

The machine is shared and noisy, so the configurations run in rotating order, one segment each
per round, after an untimed warm-up round; each segment times its steps after a warm-up; every
ratio is taken within a round (adjacent segments share the machine's state, which drifts a lot
over a run) and the median over rounds is reported, by this process's CPU time (steadier: time
the CPU spent on other processes does not count) and by wall time. The time spent inside the
callback's per-step hook is also measured directly.

    .venv/bin/python benchmarks/callback_overhead.py [--steps 400] [--rounds 9] [--width 128] [--json]
"""

from __future__ import annotations

import argparse
import json
import logging
import time
import warnings
from collections.abc import Callable
from statistics import median
from typing import Any

import lightning as L
import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

from areal_lightning.callbacks.evaluation import EvaluationCallback

TARGET_PERCENT = 1.0
DEFAULT_WIDTH = 128
IN_FEATURES = 32
BATCH_SIZE = 32
WARMUP_STEPS = 20  # not timed: allocator, autograd and loader warm-up
NEVER_SECS = 1e9  # the time trigger runs every step and never fires
SEED = 0
CONFIGS = ("none", "empty", "callback")
CLOCKS = ("cpu", "wall")


class MLP(L.LightningModule):
    """Two hidden layers of `width` units, MSE regression on random data."""

    def __init__(self, steps: int, width: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(IN_FEATURES, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
                                 nn.Linear(width, 1))
        generator = torch.Generator().manual_seed(SEED)
        samples = steps * BATCH_SIZE
        self.data = TensorDataset(torch.randn(samples, IN_FEATURES, generator=generator),
                                  torch.randn(samples, 1, generator=generator))

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=1e-3)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.data, batch_size=BATCH_SIZE)


class StepTimer(L.Callback):
    """Wall and CPU time from the start of step `WARMUP_STEPS` to the start of the last step:
    whole steps, every callback's hooks included."""

    def __init__(self) -> None:
        self.started: tuple[float, float] | None = None
        self.timed_steps = 0
        self.elapsed = (0.0, 0.0)

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        now = (time.perf_counter(), time.process_time())
        if trainer.global_step == WARMUP_STEPS:
            self.started = now
            self.timed_steps = 0
        elif self.started is not None:
            self.timed_steps += 1
            self.elapsed = (now[0] - self.started[0], now[1] - self.started[1])

    def steps_per_sec(self) -> dict[str, float]:
        return {"wall": self.timed_steps / self.elapsed[0], "cpu": self.timed_steps / self.elapsed[1]}


def _no_evaluation(module: nn.Module, batches: Any, ctx: Any) -> dict[str, float]:
    raise AssertionError("the benchmark's window must contain no evaluation")


def _timed_hook(callback: EvaluationCallback) -> list[float]:
    """Wraps the callback's per-step hook on the instance, recording each call's duration."""
    durations: list[float] = []
    hook: Callable[..., None] = callback.on_train_batch_end

    def timed(*args: Any, **kwargs: Any) -> None:
        start = time.perf_counter()
        hook(*args, **kwargs)
        durations.append(time.perf_counter() - start)

    callback.on_train_batch_end = timed  # type: ignore[method-assign]
    return durations


def run_segment(steps: int, width: int, config: str) -> dict[str, float]:
    """One fit of `steps` steps; steps/s after the warm-up, and the callback's hook time per step."""
    timer = StepTimer()
    callbacks: list[L.Callback] = [timer]
    durations: list[float] = []
    if config == "empty":
        callbacks.append(L.Callback())
    elif config == "callback":
        callback = EvaluationCallback({"unused": [0]}, _no_evaluation, freq_steps=steps + 1, freq_secs=NEVER_SECS,
                                      eval_before_train=False, eval_at_end=False)
        durations = _timed_hook(callback)
        callbacks.append(callback)
    torch.manual_seed(SEED)
    trainer = L.Trainer(max_steps=steps, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, callbacks=callbacks)
    trainer.fit(MLP(steps, width))
    timed = durations[WARMUP_STEPS:]
    return {**timer.steps_per_sec(), "hook_secs": sum(timed) / len(timed) if timed else 0.0}


def _slowdown(rounds: list[dict[str, dict[str, float]]], base: str, other: str, clock: str) -> float:
    return 100.0 * median(r[base][clock] / r[other][clock] - 1.0 for r in rounds)


def measure(steps: int, rounds: int, width: int) -> dict[str, Any]:
    for config in CONFIGS:  # warm-up round, not timed
        run_segment(steps, width, config)
    results: list[dict[str, dict[str, float]]] = []
    for index in range(rounds):
        shift = index % len(CONFIGS)  # rotate the order, so a drift in load hits every configuration alike
        order = CONFIGS[shift:] + CONFIGS[:shift]
        results.append({config: run_segment(steps, width, config) for config in order})
    out: dict[str, Any] = {"steps": steps, "rounds": rounds, "width": width}
    for clock in CLOCKS:
        out[clock] = {
            **{f"steps_per_sec_{c}": median(r[c][clock] for r in results) for c in CONFIGS},
            "slowdown_percent": _slowdown(results, "none", "callback", clock),
            "empty_callback_percent": _slowdown(results, "none", "empty", clock),
            "own_work_percent": _slowdown(results, "empty", "callback", clock),
        }
    hook_secs = median(r["callback"]["hook_secs"] for r in results)
    out["hook_us_per_step"] = 1e6 * hook_secs
    out["hook_percent_of_step"] = 100.0 * hook_secs * out["cpu"]["steps_per_sec_none"]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=400, help="optimizer steps per segment (default 400)")
    parser.add_argument("--rounds", type=int, default=9, help="timed rounds, one segment per configuration (default 9)")
    parser.add_argument("--width", type=int, default=DEFAULT_WIDTH, help=f"MLP hidden width (default {DEFAULT_WIDTH})")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    if args.steps <= WARMUP_STEPS + 1:
        parser.error(f"--steps must be more than {WARMUP_STEPS + 1} (the warm-up), got {args.steps}")
    if args.rounds < 1 or args.width < 1:
        parser.error(f"--rounds and --width must be at least 1, got {args.rounds} and {args.width}")
    warnings.filterwarnings("ignore")  # Lightning's advice about loader workers and the like
    for name in ("lightning", "lightning.pytorch"):
        logging.getLogger(name).setLevel(logging.ERROR)
    torch.set_num_threads(1)  # steadier timings on a shared CPU
    r = measure(args.steps, args.rounds, args.width)
    if args.json:
        print(json.dumps(r))
        return
    print(f"EvaluationCallback overhead: {r['steps']} steps x {r['rounds']} rounds, MLP {IN_FEATURES}-{r['width']}-"
          f"{r['width']}-1, batch {BATCH_SIZE}, CPU, 1 thread; medians over rounds")
    for clock in CLOCKS:
        c = r[clock]
        verdict = "meets" if c["slowdown_percent"] < TARGET_PERCENT else "misses"
        print(f"  by {clock} time: {c['steps_per_sec_none']:.1f} steps/s without, {c['steps_per_sec_callback']:.1f} with"
              f" the callback: slowdown {c['slowdown_percent']:+.2f} % (target < {TARGET_PERCENT:g} %: {verdict});"
              f" an empty Callback {c['empty_callback_percent']:+.2f} %, the callback's own work"
              f" {c['own_work_percent']:+.2f} %")
    print(f"  per-step hook, measured inside the run: {r['hook_us_per_step']:.1f} us/step ="
          f" {r['hook_percent_of_step']:.2f} % of a step")


if __name__ == "__main__":
    main()
