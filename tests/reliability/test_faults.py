"""Faults in the evaluation path, as a user's run meets them, each run in its own process group
under a timeout that ends the whole group (`procs.run_in_group`): a hang fails the test.

* `evaluate_fn` raising on rank 1 only, under Lightning's own DDP launcher (2 CPU ranks, gloo):
  with ``on_error="raise"`` every rank raises the same error and the run exits non-zero; with
  ``on_error="log"`` every rank trains on and the error is recorded once.
* W&B unavailable (an online run against a closed port, a save_dir that cannot be created) in
  ``areal-lightning fit``: the run exits 0 and the eval history holds every round.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path

import pytest
from procs import run_in_group

from areal_lightning.tracking.history import eval_rows, event_rows, read_history

HERE = Path(__file__).resolve().parent
DDP_TIMEOUT_S = 300.0
FIT_TIMEOUT_S = 300.0
LAUNCHER_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT")
FAILING_STEP = 2  # ddp_eval_fault.py's
MAX_STEPS = 4
WANDB_WARNING = "W&B logging is off for the rest of this run; training goes on"


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS and not k.startswith("WANDB_")}
    env.update(OMP_NUM_THREADS="1", **extra)
    return env


def _ddp_fault(root: Path, on_error: str) -> tuple[int, str]:
    done = run_in_group(
        [sys.executable, str(HERE / "ddp_eval_fault.py"), str(root), on_error],
        timeout=DDP_TIMEOUT_S,
        env=_clean_env(),
        cwd=root,
    )
    return done.returncode, done.stdout + done.stderr


@pytest.mark.ddp
def test_a_failure_on_one_rank_with_on_error_raise_raises_on_every_rank_and_exits_non_zero(tmp_path: Path) -> None:
    status, output = _ddp_fault(tmp_path, "raise")
    assert status != 0, output
    for rank in (0, 1):
        raised = tmp_path / f"rank{rank}.raised"
        assert raised.is_file(), f"rank {rank} did not raise:\n{output}"
        assert f"rank 1: RuntimeError: rank-1-only failure at step {FAILING_STEP}" in raised.read_text()
    assert not list(tmp_path.glob("rank*.done"))
    records = read_history(tmp_path)
    assert [r["step"] for r in eval_rows(records)] == list(range(1, FAILING_STEP))  # nothing after the failure


@pytest.mark.ddp
def test_a_failure_on_one_rank_with_on_error_log_is_recorded_once_and_every_rank_trains_on(tmp_path: Path) -> None:
    status, output = _ddp_fault(tmp_path, "log")
    assert status == 0, output
    expected_steps = [s for s in range(1, MAX_STEPS + 1) if s != FAILING_STEP]
    for rank in (0, 1):
        assert json.loads((tmp_path / f"rank{rank}.done").read_text()) == [expected_steps, MAX_STEPS], f"rank {rank}"
    records = read_history(tmp_path)
    assert [r["step"] for r in eval_rows(records)] == expected_steps
    (error,) = event_rows(records, "error")
    assert error["step"] == FAILING_STEP and "rank 1: RuntimeError: rank-1-only failure" in error["message"]


# ---- W&B unavailable --------------------------------------------------------------------------

RUN_CONFIG = """\
eval_sets: {easy: {size: 4, n_samples: 2}, hard: {size: 3, digits: 2, n_samples: 2}}
trainer: {max_steps: 4, enable_progress_bar: false}
policy: {d_model: 32, n_layers: 1, n_heads: 2}
grpo: {warmup_steps: 0, group_size: 2, prompts_per_step: 2}
evaluator: {freq_steps: 2, eval_before_train: true}
"""
EXPECTED_ROUNDS = [(step, name) for step in (0, 2, 4) for name in ("easy", "hard")]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _fit(tmp_path: Path, overrides: list[str], **env: str) -> tuple[Path, str]:
    config = tmp_path / "run.yaml"
    config.write_text(RUN_CONFIG)
    out = tmp_path / "out"
    done = run_in_group(
        [sys.executable, "-m", "areal_lightning", "fit", "-c", str(config), f"output_dir={out}", *overrides],
        timeout=FIT_TIMEOUT_S,
        env=_clean_env(**env),
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return out, done.stdout + done.stderr


def _assert_every_round_recorded(out: Path) -> None:
    records = read_history(out)
    assert [(r["step"], r["dataset"]) for r in eval_rows(records)] == EXPECTED_ROUNDS
    assert event_rows(records, "error") == []
    assert all(r["num_prompts"] == {"easy": 4, "hard": 3}[r["dataset"]] for r in eval_rows(records))


@pytest.mark.process
def test_wandb_online_without_a_server_leaves_training_and_the_history_complete(tmp_path: Path) -> None:
    out, output = _fit(
        tmp_path,
        ["logger.wandb.mode=online"],
        WANDB_BASE_URL=f"http://127.0.0.1:{_closed_port()}",
        WANDB_API_KEY="x" * 40,
        WANDB_INIT_TIMEOUT="2",
    )
    assert output.count(WANDB_WARNING) == 1, output
    _assert_every_round_recorded(out)
    assert (out / "checkpoints" / "last.ckpt").is_file()
