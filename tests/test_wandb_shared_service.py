"""A process started by one that runs W&B joins that process's W&B service (wandb hands it on in
``WANDB_SERVICE``): a sweep agent, a notebook, or pytest after an in-process W&B test. That service
has its own working directory, so a relative ``save_dir`` (a relative ``output_dir``) must reach it
resolved, or the run's transaction log is written elsewhere or not at all. This is why
test_interrupt_resume.py's Ctrl-C test failed in full ``-n 2`` runs ("no W&B session of run ...")
when its xdist worker had run an in-process W&B test before it."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import wandb
from procs import run_in_group
from wandb_reader import read_wandb_records, run_sessions, wandb_history

CHILD_TIMEOUT_S = 120.0
CHILD = """
from areal_lightning.tracking.wandb_logger import SafeWandbLogger, finish_wandb, wandb_failure
logger = SafeWandbLogger(project="p", offline=True, save_dir="runs/t", id="joined1")
logger.log_metrics({"m": 1.5}, step=0)
assert wandb_failure(logger) is None, wandb_failure(logger)
finish_wandb([logger], exit_code=130)
"""


@pytest.fixture()
def parent_service(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """This process runs an offline W&B run (and so a W&B service); torn down afterwards, so that
    later tests in this process start their own."""
    monkeypatch.setenv("WANDB_SILENT", "true")
    for name in ("WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(name, str(tmp_path / name.lower()))
    wandb.teardown()  # a service of an earlier test, with its settings, would be joined instead
    (tmp_path / "parent").mkdir()
    run = wandb.init(mode="offline", dir=str(tmp_path / "parent"), project="parent")
    try:
        token = os.environ.get("WANDB_SERVICE")
        assert token, "wandb.init did not hand its service on in WANDB_SERVICE"
        yield token
    finally:
        run.finish()
        wandb.teardown()


@pytest.mark.process
def test_a_logger_that_joins_another_processs_service_keeps_its_session_in_its_own_dir(
    tmp_path: Path, parent_service: str
) -> None:
    child = tmp_path / "child"  # another working directory than the service's
    child.mkdir()
    done = run_in_group([sys.executable, "-c", CHILD], timeout=CHILD_TIMEOUT_S, cwd=child, env=dict(os.environ))
    assert done.returncode == 0, done.stderr[-3000:]
    (session,) = run_sessions(child / "runs" / "t", "joined1")
    records = read_wandb_records(session)
    assert [(r["_step"], r["m"]) for r in wandb_history(records)] == [(0, 1.5)]
    assert [r["exit"]["exit_code"] for r in records if r["type"] == "exit"] == [130]
