"""`EvaluationCallback(mode="async")` under DDP on 2 CPU processes: every round recorded once,
exact reductions, the same stop step on every rank, a one-rank failure on both, no hang.

The fits run in `async_ddp_job.py`, a process of its own in a new session: on a timeout the whole
process group (the ranks and their async workers) is killed, so nothing outlives the test.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from async_ddp_job import EVAL_SET, FAILING_STEP, STOP_SCRIPT, THRESHOLD, WORLD_SIZE

from areal_lightning.tracking.history import eval_rows, event_rows, read_history

pytestmark = [pytest.mark.ddp]

JOB_TIMEOUT_S = 480.0
LINGER_S = 15.0
TESTS_DIR = Path(__file__).parent


def _live_members(pgid: int) -> list[str]:
    """Command lines of the live (not zombie) processes of process group `pgid`."""
    live = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmdline = (stat.parent / "cmdline").read_text().replace("\0", " ")
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            live.append(cmdline)
    return live


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, list[Any]]]:
    root = tmp_path_factory.mktemp("async_ddp")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS_DIR), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen(
        [sys.executable, str(TESTS_DIR / "async_ddp_job.py"), str(root)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = proc.communicate(timeout=JOB_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        pytest.fail(f"the async DDP job hung for {JOB_TIMEOUT_S:.0f} s:\n{output[-4000:]}")
    assert proc.returncode == 0, output[-6000:]
    # multiprocessing's resource tracker exits a moment after its parent; a worker must not linger.
    deadline = time.monotonic() + LINGER_S
    while _live_members(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    leftovers = _live_members(proc.pid)
    if leftovers:
        os.killpg(proc.pid, signal.SIGKILL)
    assert not leftovers, f"the job left processes behind: {leftovers}"
    per_rank = json.loads((root / "results.json").read_text())
    return root, {name: [r[name] for r in per_rank] for name in per_rank[0]}


def test_every_round_is_recorded_once_with_the_exact_reduction(ddp_run: tuple[Path, dict[str, list[Any]]]) -> None:
    root, results = ddp_run
    assert results["every_round"] == [[[2, 4, 6, 8, 9], 9]] * WORLD_SIZE
    rows = eval_rows(read_history(root / "every_round"))
    assert [(r["step"], r["metrics"]["w"]) for r in rows] == [(s, float(s)) for s in (2, 4, 6, 8, 9)]
    probes = EVAL_SET["probe"]
    assert all(
        r["world_size"] == WORLD_SIZE
        and r["num_prompts"] == len(probes)
        and r["mode"] == "async"
        and r["metrics"]["sample_value"] == pytest.approx(sum(probes) / len(probes))
        for r in rows
    )


def test_skipped_rounds_are_the_same_on_every_rank(ddp_run: tuple[Path, dict[str, list[Any]]]) -> None:
    root, results = ddp_run
    assert results["skip"][0] == results["skip"][1]
    records = read_history(root / "skip")
    recorded = [r["step"] for r in eval_rows(records)]
    skipped = [e["step"] for e in event_rows(records, "skipped")]
    assert recorded == results["skip"][0][0]
    assert sorted(recorded + skipped) == [2, 4, 6, 8, 9] and not set(recorded) & set(skipped)


def test_a_threshold_stop_on_a_late_result_stops_every_rank_at_the_same_step(
    ddp_run: tuple[Path, dict[str, list[Any]]],
) -> None:
    root, results = ddp_run
    (evaluated, stop_step), other = results["stop"]
    assert other == [evaluated, stop_step]
    assert evaluated[:3] == [2, 4, 6] and stop_step >= 6 and stop_step < 20
    alerts = event_rows(read_history(root / "stop"), "alert")
    assert [(a["step"], a["value"]) for a in alerts] == [(6, pytest.approx(STOP_SCRIPT[-1]))]
    assert alerts[0]["threshold"] == THRESHOLD


def test_a_worker_failure_on_one_rank_is_recorded_and_every_rank_trains_on(
    ddp_run: tuple[Path, dict[str, list[Any]]],
) -> None:
    root, results = ddp_run
    assert results["error"] == [[[2, 6], 6]] * WORLD_SIZE
    errors = event_rows(read_history(root / "error"), "error")
    assert [e["step"] for e in errors] == [FAILING_STEP]
    assert f"rank 1: RuntimeError: rank-1-only failure at step {FAILING_STEP}" in errors[0]["message"]
