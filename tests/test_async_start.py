"""The async worker is ready when the first round falls due: the packaged job in async mode loses
no round to the worker's start-up, and nothing waits for a worker that is still starting."""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import pytest
from procs import run_in_group

from areal_lightning.tracking.history import eval_rows, read_history

EXAMPLE = Path(__file__).resolve().parents[1] / "areal_lightning" / "app" / "configs" / "arithmetic_grpo.yaml"


@pytest.mark.slow
@pytest.mark.xfail(
    reason="regressed in this wave, cause not yet found: the round of step 0 now outlasts 10 steps and the "
    "step-10 round is skipped ('the round of step 0 is still running'); passes at 51176c2 under the same load",
    strict=False,
)
def test_the_packaged_job_in_async_mode_skips_no_round_while_its_worker_starts(tmp_path: Path) -> None:
    # The command, smaller eval sets: a worker spawned when training started was still
    # importing at steps 10 and 20, whose rounds were skipped (on_busy: skip, the default).
    run_dir = tmp_path / "run"
    proc = run_in_group(
        [
            sys.executable,
            "-m",
            "areal_lightning",
            "fit",
            "-c",
            str(EXAMPLE),
            "evaluator.mode=async",
            "trainer.max_steps=30",
            "evaluator.freq_steps=10",
            "grpo.warmup_steps=10",
            "eval_sets.easy.size=50",
            "eval_sets.hard.size=50",
            "logger.wandb.mode=disabled",
            "trainer.enable_progress_bar=false",
            f"output_dir={run_dir}",
        ],
        timeout=300,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = read_history(run_dir)
    assert [r for r in records if r.get("event") == "skipped"] == []
    rows = eval_rows(records)
    assert [r["step"] for r in rows if r["dataset"] == "easy"] == [0, 10, 20, 30]
    assert all(r["mode"] == "async" and r["start_secs"] >= 0 for r in rows)


_GATED_PRELOAD = """
import os, time
from pathlib import Path
# Imported by the fork server before it forks anything: holds it until the test opens the gate.
while not Path(os.environ["GATE"]).exists():
    time.sleep(0.01)
"""

_SCRIPT = """
import multiprocessing, os, sys
from pathlib import Path
from areal_lightning.callbacks.worker_launch import WorkerLaunch

def echo(conn):
    import tempfile
    tempfile.mkstemp(prefix="left-by-the-worker-")  # a terminated worker cleans nothing up
    while (message := conn.recv_bytes()) != b"end":
        conn.send_bytes(message)

if __name__ == "__main__":
    gate = Path(os.environ["GATE"])
    multiprocessing.set_forkserver_preload(["gated_preload"])
    launch = WorkerLaunch(echo, (), "echo")
    for message in (b"first", b"second", b"third"):
        launch.send_bytes(message)
    print("returned while the server was held:", launch.starting and not gate.exists(), flush=True)
    gate.write_text("open")
    print("received:", [launch.conn.recv_bytes().decode() for _ in range(3)], flush=True)
    launch.stop(ask=False, grace=5.0)
    print("worker exit code:", launch.process.exitcode, flush=True)
    print("its temporary directory is gone:", not os.path.exists(launch.temp), flush=True)
"""


@pytest.mark.process
def test_a_worker_still_starting_keeps_nobody_waiting_and_gets_its_messages_in_order(tmp_path: Path) -> None:
    (tmp_path / "gated_preload.py").write_text(textwrap.dedent(_GATED_PRELOAD))
    (tmp_path / "script.py").write_text(textwrap.dedent(_SCRIPT))
    env = dict(os.environ, GATE=str(tmp_path / "gate"), PYTHONPATH=str(tmp_path))
    proc = run_in_group([sys.executable, "script.py"], timeout=120, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines() == [
        "returned while the server was held: True",
        "received: ['first', 'second', 'third']",
        "worker exit code: -15",
        "its temporary directory is gone: True",
    ]
