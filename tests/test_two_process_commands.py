"""Every command on two gloo processes with every rank-0 side path on: thresholds and alerts, best
values, the reward watch, W&B (offline) with its sample tables, checkpoints, the watcher, the plot.

A rank that alone reaches a collective (rank 0 validating a config, whose metric names come from a
torchmetrics compute()) leaves the other rank waiting in a broadcast for ever: each command runs in
its own process group, ended on timeout, so a hang fails the test instead of blocking it. The
watcher is stopped with SIGTERM, as a service manager stops it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
import yaml
from cli_server import run_cli, start_cli

from areal_lightning.tracking.history import eval_rows, event_rows, read_history

COMMAND_TIMEOUT_S = 300  # one command on a busy 2-core box; a hang fails at this limit
POLL_S = 0.5
RANK_EXIT_S = 60  # for the other rank to leave after rank 0 stopped
STEPS = 4
CONFIG = {
    "seed": 3,
    "trainer": {
        "max_steps": STEPS,
        "accelerator": "cpu",
        "devices": 2,
        "strategy": "ddp",
        "checkpoint_every_n_steps": 2,
        "enable_progress_bar": True,
    },
    "policy": {"d_model": 16, "n_layers": 1},
    "grpo": {"warmup_steps": 10, "prompts_per_step": 2, "group_size": 2},
    "eval_sets": {"easy": {"digits": 1, "size": 6, "n_samples": 2, "batch_size": 4}},
    "evaluator": {
        "freq_steps": 2,
        "eval_before_train": True,
        "metric_thresholds": {"accuracy": 0.01, "reward": 0.01},
        "threshold_action": "alert",
        "best_metrics": {"accuracy": "max"},
        "reward_watch": {"metric": "accuracy", "min_train_rise": 0.01},
        "max_table_rows": 4,
    },
    "logger": {"csv": True, "wandb": {"mode": "offline"}},
}


def _live_members(pgid: int) -> list[int]:
    """The processes of process group `pgid` that still run (zombies, which nothing may reap in a
    container, do not count)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            fields = stat.read_text().rsplit(")", 1)[1].split()  # after "pid (comm)": state, ppid, pgrp
            if int(fields[2]) == pgid and fields[0] != "Z":
                found.append(int(stat.parent.name))
    return found


def _env(tmp_path: Path) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "OMP_NUM_THREADS": "1",
        "WANDB_SILENT": "true",
        "WANDB_CONFIG_DIR": str(tmp_path / "wb-config"),
        "WANDB_CACHE_DIR": str(tmp_path / "wb-cache"),
        "WANDB_DATA_DIR": str(tmp_path / "wb-data"),
    }


def _cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    try:  # forked from the fork server (tests/cli_server.py); the ranks it launches are fresh interpreters
        done = run_cli(list(args), COMMAND_TIMEOUT_S, tmp_path, _env(tmp_path))
    except subprocess.TimeoutExpired as err:
        raise AssertionError(f"{' '.join(args[:3])} hung on 2 processes:\n{str(err.stderr)[-3000:]}") from None
    assert done.returncode == 0, f"{' '.join(args[:3])} failed:\n{done.stderr[-3000:]}"
    return done


@pytest.mark.ddp
@pytest.mark.slow
@pytest.mark.timeout(4 * COMMAND_TIMEOUT_S)  # four commands, each ended at its own limit
def test_fit_evaluate_watch_and_plot_on_two_processes(tmp_path: Path) -> None:
    config = tmp_path / "cfg.yaml"
    run = tmp_path / "run"
    config.write_text(yaml.safe_dump({**CONFIG, "output_dir": str(run)}))

    # fit: rounds at steps 0, 2, 4 on both ranks, checkpoints, W&B tables, thresholds checked each round.
    _cli(tmp_path, "fit", "-c", str(config))
    training = eval_rows(read_history(run))
    assert [r["step"] for r in training] == [0, 2, 4] and {r["world_size"] for r in training} == {2}
    checkpoints = sorted(p.name for p in (run / "checkpoints").glob("*.ckpt"))
    assert "last.ckpt" in checkpoints and len(checkpoints) >= 2
    assert (run / "eval_accuracy.png").is_file()  # fit ends by drawing the run's plot

    # evaluate one checkpoint on two processes.
    done = _cli(tmp_path, "evaluate", "-c", str(config), "--ckpt", str(run / "checkpoints" / "last.ckpt"))
    assert "2 process(es)" in done.stdout
    assert [r["step"] for r in eval_rows(read_history(run)) if r.get("trigger") == ["evaluate"]] == [STEPS]

    # the watcher: every checkpoint once, a file that is no checkpoint reported once (rank 0 alone
    # decides), then SIGTERM ends both processes cleanly.
    steps_on_disk = {2, 4}
    later_step = STEPS + 2  # a checkpoint written once the broken file is reported
    broken = run / "checkpoints" / "broken.ckpt"
    broken.write_bytes(b"not a checkpoint")
    log = tmp_path / "watch.log"
    with open(log, "w") as sink:  # forked from the fork server, in a process group of its own
        watcher = start_cli(
            ["evaluate", "-c", str(config), "--watch", str(run / "checkpoints"), "--poll-secs", "0.2"],
            tmp_path, _env(tmp_path), stdout=sink, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:

        def wait_for(steps: set[int]) -> None:
            """Until the watch has evaluated `steps` and reported the broken file."""
            deadline = time.monotonic() + COMMAND_TIMEOUT_S
            while {r["step"] for r in eval_rows(read_history(run)) if "watch" in r["trigger"]} != steps or not [
                e for e in event_rows(read_history(run)) if e.get("checkpoint") == str(broken)
            ]:
                assert watcher.poll() is None, f"the watcher ended early:\n{log.read_text()[-3000:]}"
                assert time.monotonic() < deadline, f"the watcher hung on 2 processes:\n{log.read_text()[-3000:]}"
                time.sleep(POLL_S)

        wait_for(steps_on_disk)
        # One more checkpoint, evaluated before the stop: the watch has looked at the directory again
        # after the broken file's record, so a second rank that also decided (and counted the
        # broken file's failed loads) would have recorded it a second time by now.
        later = torch.load(run / "checkpoints" / "last.ckpt", weights_only=False)
        later["global_step"] = later_step
        torch.save(later, run / "later.tmp")
        os.replace(run / "later.tmp", run / "checkpoints" / f"step{later_step}.ckpt")
        steps_on_disk.add(later_step)
        wait_for(steps_on_disk)
        os.kill(watcher.pid, signal.SIGTERM)  # to the process the user started (rank 0)
        try:
            watcher.wait(COMMAND_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"SIGTERM did not end the watch:\n{log.read_text()[-3000:]}") from None
        # Rank 1 ends with rank 0 (it gets the stop decision in the next broadcast).
        deadline = time.monotonic() + RANK_EXIT_S
        while _live_members(watcher.pid) and time.monotonic() < deadline:
            time.sleep(POLL_S)
        assert not _live_members(watcher.pid), "a rank of the watcher outlived SIGTERM"
    finally:
        watcher.close()  # SIGTERM, then SIGKILL, to whatever of its group is left
    out = log.read_text()
    assert watcher.returncode == 0, out[-3000:]
    assert f"watch stopped: stop requested; {len(steps_on_disk)} checkpoint(s) evaluated" in out

    # plot: the run's curves, with the standalone and watch evaluations beside training.
    out_png = tmp_path / "plot.png"
    _cli(tmp_path, "plot", str(run), "--out", str(out_png))
    assert out_png.stat().st_size > 0
    errors = [e for e in event_rows(read_history(run)) if e.get("event") == "error"]
    assert [e.get("checkpoint") for e in errors] == [str(broken)], errors
