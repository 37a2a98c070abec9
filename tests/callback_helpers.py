"""Shared pieces of the `EvaluationCallback` tests: a module whose weights tell the step, a fake
clock driven by the training loop, a Trainer factory, an independent reference of the schedule.

`CountingModule` has a scalar weight ``w`` that starts at 0 and grows by exactly 1 per optimizer
step (SGD with lr 1 on ``loss = -w``), so an evaluation that reads ``w == k`` saw the weights after
exactly k optimizer steps; a `Linear` layer trained on random data makes the weights a real model.
Each ``training_step`` advances the module's `FakeClock`, which the callback reads (``clock=``),
so the time trigger sees a fixed amount of training time per step and no real time.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

from areal_lightning.eval_round import EvalBatch, EvalContext
from areal_lightning.tracking.history import eval_rows, read_history

IN_FEATURES = 3
LAYER_LR = 0.05  # the Linear layer's lr: small enough that random regression stays finite
DATA_SEED = 1234
START_TIME = 1000.0  # the fake clock's reading at construction; any value works

# Lightning's advice for real jobs, noise for a 1-sample-batch CPU test.
QUIET_WARNINGS = (
    r"ignore:.*does not have many workers.*",
    r"ignore:.*litlogger.*",
    r"ignore:.*LitModelCheckpoint.*",
    r"ignore:.*smaller than the logging interval.*",
    r"ignore:.*checkpoint that ended before the epoch ended.*",
    r"ignore:.*compute.*before.*update.*",
    r"ignore:.*isinstance\(treespec, LeafSpec\).*",
    r"ignore:.*callbacks used to create the checkpoint need to be provided.*",
)


def quiet() -> None:
    """Apply `QUIET_WARNINGS` in a process that pytest does not configure (DDP workers)."""
    for spec in QUIET_WARNINGS:
        _, message, *_ = spec.split(":", 2)
        warnings.filterwarnings("ignore", message=message)


class FakeClock:
    """Seconds that move only when the training loop says so."""

    def __init__(self, now: float = START_TIME) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, secs: float) -> None:
        self.now += secs


class CountingModule(L.LightningModule):
    """A user's own LightningModule (no `evaluate` method): ``w`` equals the global step.

    Args:
        epoch_len: optimizer steps per epoch (batches of one sample each, no accumulation).
        clock: advanced by ``step_secs`` in every training step; None: no clock.
        step_secs: training seconds one step takes on ``clock``.
    """

    def __init__(self, epoch_len: int = 5, clock: FakeClock | None = None, step_secs: float = 1.0) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.zeros(()))
        generator = torch.Generator().manual_seed(DATA_SEED)
        self.layer = nn.Linear(IN_FEATURES, 1)
        self.x = torch.randn(epoch_len, IN_FEATURES, generator=generator)
        self.y = torch.randn(epoch_len, 1, generator=generator)
        self.clock, self.step_secs = clock, step_secs

    def training_step(self, batch: Sequence[Tensor], batch_idx: int) -> Tensor:
        if self.clock is not None:
            self.clock.advance(self.step_secs)
        x, y = batch
        return -self.w + nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD([{"params": [self.w], "lr": 1.0}, {"params": self.layer.parameters(), "lr": LAYER_LR}])

    def train_dataloader(self) -> DataLoader:
        return DataLoader(TensorDataset(self.x, self.y), batch_size=1)


def probe_weights(module: nn.Module, batches: Sequence[EvalBatch], ctx: EvalContext) -> dict[str, Any]:
    """An `evaluate_fn` that reports ``w`` (a plain float) and a per-sample tensor of the samples."""
    values = torch.tensor([float(s) for b in batches for s in b.samples], dtype=torch.float64)
    return {"w": float(module.w), "sample_value": values}


def make_trainer(root: str | Path, callbacks: list[L.Callback], max_steps: int, **kwargs: Any) -> L.Trainer:
    """A quiet single-process CPU Trainer; `kwargs` override the defaults."""
    checkpointing = any(isinstance(c, ModelCheckpoint) for c in callbacks)  # only where a test asks for it
    options: dict[str, Any] = dict(
        max_steps=max_steps,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=checkpointing,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(root),
        callbacks=callbacks,
    )
    options.update(kwargs)
    return L.Trainer(**options)


def history_steps(run_dir: str | Path, dataset: str | None = None) -> list[tuple[int, list[str]]]:
    """(step, trigger causes) of each round record in file order, for one eval set (default: the first)."""
    rows = eval_rows(read_history(run_dir))
    if dataset is None and rows:
        dataset = rows[0]["dataset"]
    return [(r["step"], r["trigger"]) for r in rows if r["dataset"] == dataset]


def reference_schedule(
    max_steps: int,
    epoch_len: int,
    *,
    freq_steps: int | None = None,
    freq_epochs: int | None = None,
    freq_secs: float | None = None,
    step_secs: float = 1.0,
    eval_before_train: bool = False,
    eval_at_end: bool = True,
) -> list[tuple[int, list[str]]]:
    """The evaluations a user expects from the documented rules, by plain counting.

    Steps are 1-based global steps; an epoch ends after every ``epoch_len``-th step; training time
    grows by ``step_secs`` per step and restarts from 0 at every evaluation.
    """
    evals: list[tuple[int, list[str]]] = [(0, ["before_train"])] if eval_before_train else []
    secs = 0.0
    for step in range(1, max_steps + 1):
        secs += step_secs
        causes = []
        if freq_steps is not None and step % freq_steps == 0:
            causes.append("steps")
        if freq_epochs is not None and step % epoch_len == 0 and (step // epoch_len) % freq_epochs == 0:
            causes.append("epochs")
        if freq_secs is not None and secs >= freq_secs:
            causes.append("secs")
        if causes:
            evals.append((step, causes))
            secs = 0.0
    if eval_at_end and evals and evals[-1][0] == max_steps and max_steps > 0:
        evals[-1][1].append("end")  # the end fired at a step evaluated for another cause: one round, both causes
    elif eval_at_end:
        evals.append((max_steps, ["end"]))
    return evals


def metric_by_step(run_dir: str | Path, metric: str, dataset: str | None = None) -> list[tuple[int, float]]:
    """(step, metric value) of each round record in file order, for one eval set (default: the first)."""
    rows = eval_rows(read_history(run_dir))
    if dataset is None and rows:
        dataset = rows[0]["dataset"]
    return [(r["step"], r["metrics"][metric]) for r in rows if r["dataset"] == dataset]


def state_copy(module: nn.Module) -> Mapping[str, Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def round_metrics(metrics: dict[str, Any]) -> dict[str, Any]:
    """The metrics the round itself computes, without what the callback derives across rounds
    (``/best``, ``/best_step``, ``/delta...``, the prompt story's ``/gained``, ``/lost``,
    ``/bucket/...`` and ``/gap``): a standalone evaluation has no earlier round."""
    derived = ("/best", "/best_step", "/gained", "/lost", "/gap")
    return {k: v for k, v in metrics.items() if not k.endswith(derived) and "/delta" not in k and "/bucket/" not in k}


_GROUPS = {
    "schedule": ("freq_epochs", "freq_steps", "freq_secs", "eval_before_train", "eval_at_end", "adaptive", "budget"),
    "execution": ("mode", "on_busy", "async_device", "async_threads", "max_snapshot_mib"),
    "rounds": ("precision", "cache", "cache_dir", "max_table_rows", "on_error"),
    "decisions": (
        "metric_thresholds",
        "threshold_action",
        "best_metrics",
        "reward_watch",
        "best_rule",
        "best_confidence",
        "prompt_story",
        "integrity",
    ),
}


def grouped(**options: Any) -> dict[str, Any]:
    """`EvaluationCallback`'s keyword arguments from its options by name: tests that vary a few
    options across groups (``freq_steps=2, mode="async"``) write them side by side, as YAML does."""
    out: dict[str, Any] = {}
    for name, value in options.items():
        group = next((g for g, names in _GROUPS.items() if name in names), None)
        if group is None:
            out[name] = value  # eval_sets, output_dir, seed, run_id, clock
        else:
            out.setdefault(group, {})[name] = value
    return out
