"""The watcher's loop (`_watch_on_rank`) on two real gloo ranks, each with its own Fabric: what each
rank returns when it stops.

Rank 0's status is the command's exit status. Every other rank returns 0 whatever happened: the
rounds that failed are rank 0's to report, and Lightning's launcher (`_ChildProcessObserver`)
kills every process, rank 0 included, when a rank it started exits non-zero while rank 0 still
runs, so a rank 1 that said "failed" could cut rank 0's report and W&B upload short.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from ddp_utils import run_ddp

from areal_lightning.tracking.history import eval_rows, event_rows, read_history

CONFIG = {
    "seed": 2,
    "policy": {"d_model": 16, "n_layers": 1},
    "trainer": {"enable_progress_bar": False, "accelerator": "cpu", "devices": 2, "strategy": "ddp"},
    "eval_sets": {"w": {"digits": 1, "size": 4, "n_samples": 1, "batch_size": 4}},
    "logger": {"csv": False, "wandb": {"mode": "disabled"}},
}
FAILING_STEP = 2


def _out_of_memory_at_one_step(evaluate: Any, module: Any, batches: Any, ctx: Any) -> Any:
    if ctx.global_step == FAILING_STEP:  # what a real round can hit; the model here is too small to
        raise RuntimeError("CUDA out of memory")
    return evaluate(module, batches, ctx)


def _watch_until_the_sentinel(rank: int, world_size: int, config: str, ckpts: str) -> int:
    from lightning.fabric import Fabric

    from areal_lightning.app.config import load_config
    from areal_lightning.app.watch_checkpoints import _Watch, _watch_on_rank
    from areal_lightning.rl import rollout_eval

    # This rank's evaluations fail at one step (run_ddp forks each rank: the patch stays in it).
    rollout_eval.rollout_evaluate = functools.partial(_out_of_memory_at_one_step, rollout_eval.rollout_evaluate)
    cfg = load_config(config)
    # run_ddp started the ranks and their process group: Fabric finds them (LOCAL_RANK, WORLD_SIZE).
    fabric = Fabric(accelerator="cpu", devices=world_size, strategy="ddp")
    fabric.launch()
    assert fabric.global_rank == rank
    history = Path(cfg.output_dir) / "eval_history.jsonl"
    watch = _Watch(cfg, Path(ckpts), history, poll_secs=0.02, idle_timeout=None, trust=False)
    return _watch_on_rank(fabric, watch)


@pytest.mark.ddp
def test_rank_zero_returns_the_failed_status_and_every_other_rank_returns_zero(tmp_path: Path) -> None:
    from areal_lightning.app.builders import build_module
    from areal_lightning.app.config import load_config
    from areal_lightning.app.console import ROUNDS_FAILED
    from areal_lightning.app.watch_directory import STOP_FILENAME

    config = tmp_path / "cfg.yaml"
    config.write_text(yaml.safe_dump({**CONFIG, "output_dir": str(tmp_path / "run")}))
    weights = build_module(load_config(config)).state_dict()
    ckpts = tmp_path / "ckpts"
    ckpts.mkdir()
    for step in (FAILING_STEP, FAILING_STEP + 2):
        torch.save({"global_step": step, "epoch": 0, "state_dict": weights}, ckpts / f"step{step}.ckpt")
    (ckpts / STOP_FILENAME).touch()  # stop once both are evaluated

    assert run_ddp(_watch_until_the_sentinel, 2, str(config), str(ckpts)) == [ROUNDS_FAILED, 0]
    history = read_history(tmp_path / "run" / "eval_history.jsonl")
    assert [(r["step"], r["world_size"]) for r in eval_rows(history)] == [(FAILING_STEP + 2, 2)]
    assert [e["step"] for e in event_rows(history, "error")] == [FAILING_STEP]  # recorded once, by rank 0
