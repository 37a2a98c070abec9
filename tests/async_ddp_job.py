"""The DDP part of the async tests, run as its own process (`test_async_ddp.py` kills its whole
process group on a timeout, async workers included): three fits on 2 gloo CPU ranks.

    python tests/async_ddp_job.py OUT_DIR   # writes OUT_DIR/results.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch
from callback_helpers import CountingModule, grouped, make_trainer, probe_weights, quiet
from ddp_utils import run_ddp

from areal_lightning.callbacks.evaluation_callback import EvaluationCallback
from areal_lightning.metrics import RewardMetric

WORLD_SIZE = 2
SAMPLES_PER_EPOCH = 8
EVAL_SET = {"probe": list(range(7))}  # odd size: the ranks get different numbers of samples
STOP_SCRIPT = [0.9, 0.8, 0.3]  # mean reward of the rounds of steps 2, 4, 6 (and later): below 0.7 at step 6
THRESHOLD = 0.7
FAILING_STEP = 4
TIMEOUT_S = 400.0


def stop_script(module: Any, batches: Any, ctx: Any) -> dict[str, Any]:
    reward = ctx.metric("reward", RewardMetric)
    for batch in batches:
        reward.update(
            torch.full(
                (len(batch.samples),), STOP_SCRIPT[min(ctx.global_step // 2, len(STOP_SCRIPT)) - 1], dtype=torch.float64
            )
        )
    return {}


def fails_on_rank_1(module: Any, batches: Any, ctx: Any) -> dict[str, float]:
    if ctx.rank == 1 and ctx.global_step == FAILING_STEP:
        raise RuntimeError(f"rank-1-only failure at step {ctx.global_step}")
    return {"w": float(module.w)}


def _fit(root: Path, name: str, evaluate_fn: Any, max_steps: int, **kwargs: Any) -> tuple[list[int], int]:
    callback = EvaluationCallback(EVAL_SET, evaluate_fn, **grouped(freq_steps=2, mode="async", **kwargs))
    trainer = make_trainer(root / name, [callback], max_steps, strategy="ddp", accelerator="cpu", devices=WORLD_SIZE)
    trainer.fit(CountingModule(epoch_len=SAMPLES_PER_EPOCH))
    return callback.evaluated_steps, trainer.global_step


def _fits(rank: int, world_size: int, root: str) -> dict[str, Any]:
    quiet()
    out = {
        "every_round": _fit(Path(root), "every_round", probe_weights, 9, on_busy="wait"),
        "skip": _fit(Path(root), "skip", probe_weights, 9),
        "stop": _fit(
            Path(root),
            "stop",
            stop_script,
            20,
            on_busy="wait",
            metric_thresholds={"reward": THRESHOLD},
            threshold_action="stop",
        ),
        "error": _fit(Path(root), "error", fails_on_rank_1, 6, on_busy="wait"),
    }
    return out


if __name__ == "__main__":
    out_dir = Path(sys.argv[1])
    results = run_ddp(_fits, WORLD_SIZE, str(out_dir), timeout_s=TIMEOUT_S)
    (out_dir / "results.json").write_text(json.dumps(results))
