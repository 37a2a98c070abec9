"""Cost of `EvaluationCallback` on training steps where nothing is evaluated.

A small MLP trains on random data in one process. Four configurations take turns inside the same
fit, step by step (`BLOCK_STEPS`) in a random order: no extra callback, the same again (an
A/A control: its difference shows the noise floor), an empty ``lightning.Callback()`` (what
Lightning's hook dispatch costs any callback) and the `EvaluationCallback`; a controller swaps the
Trainer's callback list before each step. Why interleave: the machine is shared and noisy, and
400-step segments run one after the other differed by +-20 % here, far more than the 1 % we look
for; steps a few milliseconds apart see the same machine. Each step's duration is
recorded (wall and this process's CPU time), a configuration's cost is the median of its steps
(robust to the steps a preemption hit), and the median over repeated fits is reported.

The callback is configured so that it works on every step and never evaluates inside the run:
``freq_steps`` beyond the run, ``freq_secs`` very large (the time trigger still reads the clock
every step), no evaluation before training or at the end. Target: a slowdown under 1 %. The time
spent inside the callback's per-step hook is also measured directly, in a fit of its own.

    .venv/bin/python benchmarks/callback_overhead.py [--steps 8000] [--repeats 3] [--width 128] [--json]
    .venv/bin/python benchmarks/callback_overhead.py --model grpo --steps 400 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import time
import warnings
from collections.abc import Callable
from statistics import median
from typing import Any

import lightning as L
import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

from areal_lightning.callbacks.evaluation_callback import EvaluationCallback

TARGET_PERCENT = 1.0
DEFAULT_WIDTH = 128
IN_FEATURES = 32
BATCH_SIZE = 32
WARMUP_STEPS = 60  # not timed: allocator, autograd and loader warm-up
# Consecutive steps of one configuration. One: the configurations share the machine's state
# step by step (blocks of 25 steps showed an A/A difference of up to 4 % here, single steps 0.1 %).
BLOCK_STEPS = 1
SETTLE_STEPS = 0  # first steps of a block not timed (for longer blocks: caches adapting)
NEVER_SECS = 1e9  # the time trigger runs every step and never fires
SEED = 0
CONFIGS = ("none", "none_again", "empty", "callback")  # none_again: an A/A control, the noise floor
CLOCKS = ("wall", "cpu")


class MLP(L.LightningModule):
    """Two hidden layers of `width` units, MSE regression on random data."""

    def __init__(self, steps: int, width: int) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(IN_FEATURES, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 1)
        )
        generator = torch.Generator().manual_seed(SEED)
        samples = steps * BATCH_SIZE
        self.data = TensorDataset(
            torch.randn(samples, IN_FEATURES, generator=generator), torch.randn(samples, 1, generator=generator)
        )

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=1e-3)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.data, batch_size=BATCH_SIZE)


class Interleave(L.Callback):
    """First in the callback list: before each step, installs the step's configuration behind
    itself and records when the step starts; a step lasts until the next one starts, so it
    includes every hook the installed callbacks receive.

    Configurations run in blocks of `BLOCK_STEPS` steps, every configuration once per round in a
    random order (a fixed rotation lines up with anything periodic in the loop: an A/A run showed
    2 % between positions). The first `SETTLE_STEPS` steps of a block are not recorded.
    """

    def __init__(self, extras: dict[str, list[L.Callback]], steps: int) -> None:
        self.extras = extras
        rng = random.Random(SEED)
        self.schedule: list[tuple[str, bool]] = []  # (configuration, recorded) per global step
        while len(self.schedule) <= steps:
            for config in rng.sample(CONFIGS, len(CONFIGS)):
                self.schedule += [(config, i >= SETTLE_STEPS) for i in range(BLOCK_STEPS)]
        self.durations: dict[str, dict[str, list[float]]] = {c: {k: [] for k in CLOCKS} for c in CONFIGS}
        self._previous: tuple[str, bool, float, float] | None = None

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        wall, cpu = time.perf_counter(), time.process_time()
        step = trainer.global_step
        if self._previous is not None and self._previous[1] and step > WARMUP_STEPS:
            config, _, wall0, cpu0 = self._previous
            self.durations[config]["wall"].append(wall - wall0)
            self.durations[config]["cpu"].append(cpu - cpu0)
        config, recorded = self.schedule[step]
        # Lightning iterates over this very list for this hook: items after this one may change.
        trainer.callbacks[1:] = self.extras[config]
        self._previous = (config, recorded, time.perf_counter(), time.process_time())


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


def _make_callback(steps: int) -> EvaluationCallback:
    return EvaluationCallback(
        {"unused": [0]},
        _no_evaluation,
        schedule={"freq_steps": steps + 1, "freq_secs": NEVER_SECS, "eval_before_train": False, "eval_at_end": False},
    )


def _trainer(steps: int, callbacks: list[L.Callback]) -> L.Trainer:
    torch.manual_seed(SEED)
    return L.Trainer(
        max_steps=steps,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=callbacks,
    )


def _module(model: str, steps: int, width: int) -> L.LightningModule:
    if model == "mlp":
        return MLP(steps, width)
    # The main job's model and step: GRPO on the arithmetic task with the default TinyPolicy.
    from areal_lightning.app.builders import build_module
    from areal_lightning.app.config import load_config

    return build_module(load_config(None, ["eval_sets.unused.size=1", "grpo.warmup_steps=0"]))


def run_fit(steps: int, width: int, model: str = "mlp") -> dict[str, dict[str, float]]:
    """One fit of `steps` steps, the configurations taking turns; median step time of each."""
    callback = _make_callback(steps)
    extras: dict[str, list[L.Callback]] = {
        "none": [],
        "none_again": [],
        "empty": [L.Callback()],
        "callback": [callback],
    }
    interleave = Interleave(extras, steps)
    # The callback is installed from the start, so that its setup / on_train_start hooks run.
    _trainer(steps, [interleave, callback]).fit(_module(model, steps, width))
    return {c: {k: median(interleave.durations[c][k]) for k in CLOCKS} for c in CONFIGS}


def hook_secs(steps: int, width: int, model: str = "mlp") -> float:
    """Median wall time of one call of the callback's per-step hook, in a fit of its own (the
    timing wrapper costs a little itself, so it stays out of the interleaved fits)."""
    callback = _make_callback(steps)
    durations = _timed_hook(callback)
    _trainer(steps, [callback]).fit(_module(model, steps, width))
    return median(durations[WARMUP_STEPS:])


def _percent(slower: float, faster: float) -> float:
    return 100.0 * (slower / faster - 1.0)


def measure(steps: int, repeats: int, width: int, model: str = "mlp") -> dict[str, Any]:
    fits = [run_fit(steps, width, model) for _ in range(repeats)]
    out: dict[str, Any] = {"steps": steps, "repeats": repeats, "width": width, "model": model}
    for clock in CLOCKS:
        step_secs = {c: median(f[c][clock] for f in fits) for c in CONFIGS}
        out[clock] = {
            **{f"steps_per_sec_{c}": 1.0 / step_secs[c] for c in CONFIGS},
            "slowdown_percent": median(_percent(f["callback"][clock], f["none"][clock]) for f in fits),
            "empty_callback_percent": median(_percent(f["empty"][clock], f["none"][clock]) for f in fits),
            "own_work_percent": median(_percent(f["callback"][clock], f["empty"][clock]) for f in fits),
            "a_a_noise_percent": median(_percent(f["none_again"][clock], f["none"][clock]) for f in fits),
        }
    hook = hook_secs(max(steps // len(CONFIGS), WARMUP_STEPS + 20), width, model)
    out["hook_us_per_step"] = 1e6 * hook
    out["hook_percent_of_step"] = 100.0 * hook * out["wall"]["steps_per_sec_none"]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--steps", type=int, default=8000, help="optimizer steps per fit, all configurations (default 8000)"
    )
    parser.add_argument("--repeats", type=int, default=3, help="fits (default 3)")
    parser.add_argument("--width", type=int, default=DEFAULT_WIDTH, help=f"MLP hidden width (default {DEFAULT_WIDTH})")
    parser.add_argument(
        "--model",
        choices=("mlp", "grpo"),
        default="mlp",
        help="mlp: a ~2 ms step (the worst case); grpo: the main job's GRPOModule step",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    least = WARMUP_STEPS + 2 * BLOCK_STEPS * len(CONFIGS)
    if args.steps < least:
        parser.error(f"--steps must be at least {least} (warm-up plus two rounds of blocks), got {args.steps}")
    if args.repeats < 1 or args.width < 1:
        parser.error(f"--repeats and --width must be at least 1, got {args.repeats} and {args.width}")
    warnings.filterwarnings("ignore")  # Lightning's advice about loader workers and the like
    for name in ("lightning", "lightning.pytorch"):
        logging.getLogger(name).setLevel(logging.ERROR)
    torch.set_num_threads(1)  # steadier timings on a shared CPU
    r = measure(args.steps, args.repeats, args.width, args.model)
    if args.json:
        print(json.dumps(r))
        return
    print(
        f"EvaluationCallback overhead: {r['repeats']} fits x {r['steps']} steps, configurations interleaved in blocks"
        f" of {BLOCK_STEPS} step(s); "
        + (
            f"MLP {IN_FEATURES}-{r['width']}-{r['width']}-1, batch {BATCH_SIZE}"
            if r["model"] == "mlp"
            else "GRPOModule (TinyPolicy, 32 prompts x 16 samples)"
        )
        + ", CPU, 1 thread; median step times"
    )
    for clock in CLOCKS:
        c = r[clock]
        verdict = "meets" if c["slowdown_percent"] < TARGET_PERCENT else "misses"
        print(
            f"  by {clock:4s} time: {c['steps_per_sec_none']:.1f} steps/s without,"
            f" {c['steps_per_sec_callback']:.1f} with"
            f" the callback: slowdown {c['slowdown_percent']:+.2f} % (target < {TARGET_PERCENT:g} %: {verdict});"
            f" an empty Callback {c['empty_callback_percent']:+.2f} %, the callback's own work"
            f" {c['own_work_percent']:+.2f} %; A/A noise (no callback vs no callback) {c['a_a_noise_percent']:+.2f} %"
        )
    print(
        f"  per-step hook, measured inside the run: {r['hook_us_per_step']:.1f} us/step ="
        f" {r['hook_percent_of_step']:.2f} % of a step"
    )


if __name__ == "__main__":
    main()
