"""The newer paths of `gpu_check.py`: an async fit whose worker evaluates on the device (how long
after falling due its first round began, whether a round was skipped), and a round on 2 ranks
(gloo, metrics on the device) reduced in one gather (collectives counted, values equal to one
process's)."""

from __future__ import annotations

import atexit
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def async_fit(module: Any, cfg: Any, device: torch.device, smoke: bool) -> dict[str, Any]:
    """A few GRPO steps with async evaluation on `device` (a round before training and every 2 steps)."""
    import lightning as L

    from areal_lightning.app.builders import build_eval_sets
    from areal_lightning.callbacks import EvaluationCallback
    from areal_lightning.tracking.history import read_history

    out = Path(tempfile.mkdtemp(prefix="gpu_check_async_"))
    atexit.register(shutil.rmtree, out, ignore_errors=True)  # scratch: the model, the data, the run
    callback = EvaluationCallback(
        build_eval_sets(cfg),
        schedule={"freq_steps": 2, "eval_before_train": True},
        execution={"mode": "async", "async_device": str(device)},
        output_dir=out,
        seed=cfg.seed,
    )
    trainer = L.Trainer(
        max_steps=4 if smoke else 8,
        accelerator="cpu" if smoke else "gpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[callback],
        default_root_dir=str(out),
    )
    trainer.fit(module)
    records = read_history(out)
    rounds = [r for r in records if "event" not in r]
    return {
        "async_rounds": len({r["step"] for r in rounds}),
        "async_skipped": sum(1 for r in records if r.get("event") == "skipped"),
        "async_first_round_start_s": max((r["start_secs"] for r in rounds if r["step"] == 0), default=float("nan")),
    }


def _counted_round(rank: int, world_size: int, device: str) -> dict[str, Any]:
    import torch.distributed as dist

    from areal_lightning.eval_round import EvalSet, run_round
    from areal_lightning.metrics import RewardMetric

    def evaluate(module: Any, batches: Any, ctx: Any) -> dict[str, Any]:
        reward = ctx.metric("reward", RewardMetric)
        for batch in batches:
            seeds = torch.tensor(batch.seeds, dtype=torch.float64)
            reward.update((seeds % 1000 / 1000).to(device))
        return {}

    calls = {"n": 0}
    original = dist.all_gather_object

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        return original(*args, **kwargs)

    dist.all_gather_object = counting
    try:
        module = torch.nn.Linear(1, 1).to(device)
        sets = [EvalSet(name, list(range(50)), batch_size=8) for name in ("a", "b", "c")]
        results = run_round(module, sets, evaluate, seed=3, global_step=0, epoch=0)
    finally:
        dist.all_gather_object = original
    return {"gathers": calls["n"], "metrics": {r.dataset: r.metrics for r in results}}


def packed_round(device: torch.device) -> dict[str, Any]:
    """A round of 3 eval sets on 2 gloo ranks whose metrics live on `device`: its object gathers
    (1 expected) and whether its values equal one process's."""
    from ddp_utils import run_ddp

    two = run_ddp(_counted_round, 2, str(device), timeout_s=240)
    import torch.distributed as dist

    assert not dist.is_initialized()
    one = _counted_round(0, 1, str(device))
    return {
        "packed_round_gathers": two[0]["gathers"],
        "packed_round_equal_to_one_process": two[0]["metrics"] == two[1]["metrics"] == one["metrics"],
    }
