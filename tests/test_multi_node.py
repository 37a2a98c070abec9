"""Two "nodes" on one machine: `areal-lightning fit` with `trainer.num_nodes=2 trainer.devices=1`,
launched twice with its own `NODE_RANK`, as torchrun or SLURM would on two machines. Lightning's
own launcher joins them (MASTER_ADDR, MASTER_PORT, NODE_RANK); every round is recorded once, by
global rank 0, with `world_size: 2`.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from areal_lightning.tracking.history import eval_rows, read_history

TIMEOUT_S = 240.0
MAX_STEPS = 4
FREQ_STEPS = 2
EXAMPLE = Path(__file__).resolve().parents[1] / "areal_lightning" / "app" / "configs" / "arithmetic_grpo.yaml"
OVERRIDES = [
    f"trainer.max_steps={MAX_STEPS}",
    "trainer.num_nodes=2",
    "trainer.devices=1",
    "trainer.strategy=ddp",
    "trainer.enable_progress_bar=false",
    "trainer.checkpoint_every_n_steps=null",
    "logger.wandb.mode=disabled",
    "logger.csv=false",
    "policy.d_model=32",
    "policy.n_heads=2",
    "grpo.warmup_steps=5",
    "grpo.prompts_per_step=4",
    "grpo.group_size=4",
    "task.train_size=16",
    "eval_sets.easy.size=7",
    "eval_sets.easy.n_samples=2",
    "eval_sets.hard.size=3",
    "eval_sets.hard.n_samples=2",
    f"evaluator.freq_steps={FREQ_STEPS}",
    "evaluator.freq_epochs=null",
    "evaluator.freq_secs=null",
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(node_rank: int, port: int, run_dir: Path) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")}
    env.update(NODE_RANK=str(node_rank), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    log = open(run_dir.parent / f"node{node_rank}.log", "w")  # noqa: SIM115 - closed with the process
    # Its own session: on a timeout the whole process group goes, children included.
    return subprocess.Popen(
        [sys.executable, "-m", "areal_lightning", "fit", "-c", str(EXAMPLE), *OVERRIDES, f"output_dir={run_dir}"],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


@pytest.mark.ddp
@pytest.mark.slow
def test_two_nodes_record_every_round_once_with_world_size_two(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    port = _free_port()
    nodes = [_launch(rank, port, run_dir) for rank in (0, 1)]
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while any(p.poll() is None for p in nodes) and time.monotonic() < deadline:
            time.sleep(0.5)
    finally:
        hung = [rank for rank, p in enumerate(nodes) if p.poll() is None]
        for p in nodes:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    logs = {rank: (tmp_path / f"node{rank}.log").read_text()[-3000:] for rank in (0, 1)}
    assert not hung, f"nodes {hung} still running after {TIMEOUT_S:.0f} s: {logs}"
    assert [p.returncode for p in nodes] == [0, 0], logs
    rows = eval_rows(read_history(run_dir))
    steps = list(range(0, MAX_STEPS + 1, FREQ_STEPS))  # eval_before_train, every 2 steps, the end (already done)
    assert Counter((r["step"], r["dataset"]) for r in rows) == Counter((s, d) for s in steps for d in ("easy", "hard"))
    assert {r["world_size"] for r in rows} == {2}
    assert {(r["dataset"], r["num_prompts"]) for r in rows} == {("easy", 7), ("hard", 3)}
