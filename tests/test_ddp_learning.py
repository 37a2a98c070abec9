"""`areal-lightning fit` of the main job on 2 DDP processes learns, as on one process; its
in-training rounds equal a standalone 2-process `evaluate` of the checkpoint of the same step; and
every other command follows the same run on two gloo processes: `evaluate --watch` (stopped with
SIGTERM, as a service manager stops it) and `plot`.

Each rank samples `grpo.prompts_per_step` prompts a step and DDP averages the two ranks'
gradients, so 16 prompts per rank make the same 32-prompt step (and the same 8 steps an epoch) as
the example's one-process job. The fit runs with every rank-0 side path on: thresholds and alerts,
best values, the reward watch, W&B (offline) with its sample tables, the CSV logger, the progress
bar, checkpoints. A rank that alone reaches a collective (rank 0 validating a config, whose metric
names come from a torchmetrics compute()) leaves the other rank waiting in a broadcast for ever:
each command runs in its own process group, ended on timeout, so a hang fails the test instead of
blocking it.
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
from callback_helpers import round_metrics
from cli_server import run_cli, start_cli

from areal_lightning.tracking.history import eval_rows, event_rows, read_history

MAX_STEPS = 160
MID_STEP = MAX_STEPS // 2
FIT_TIMEOUT_S = 1500.0  # about 30 CPU seconds; a shared, loaded 2-core box stretches it many times
COMMAND_TIMEOUT_S = 600.0  # evaluate, the watcher's wait, plot: a hang fails at this limit
POLL_S = 0.5
RANK_EXIT_S = 60  # for the other rank to leave after rank 0 stopped
EXAMPLE = Path(__file__).resolve().parents[1] / "areal_lightning" / "app" / "configs" / "arithmetic_grpo.yaml"
DDP = ["trainer.devices=2", "trainer.strategy=ddp"]
FIT = [
    f"trainer.max_steps={MAX_STEPS}",
    "grpo.prompts_per_step=16",
    f"evaluator.freq_steps={MID_STEP}",
    "evaluator.freq_epochs=null",
    "evaluator.freq_secs=null",
    f"trainer.checkpoint_every_n_steps={MID_STEP}",
    "eval_sets.hard.size=8",  # the hard set stays hard; the easy set (100 prompts x 4) is the measure:
    "eval_sets.easy.size=100",  # what GRPO trains on, all the one-digit problems, none held out
    "task.hold_out_eval=false",
    # Every rank-0 side path on (the example's own: the progress bar, CSV, W&B offline, alerts).
    "trainer.enable_progress_bar=true",
    "evaluator.metric_thresholds={accuracy: 0.01, reward: 0.01}",
    "evaluator.threshold_action=alert",
    "evaluator.best_metrics={accuracy: max}",
    "evaluator.reward_watch={metric: accuracy, min_train_rise: 0.01}",
    "evaluator.max_table_rows=4",
    "logger.csv=true",
    "logger.wandb.mode=offline",
]


def _env(tmp: Path) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "WANDB_SILENT": "true",
        "WANDB_CONFIG_DIR": str(tmp / "wb-config"),
        "WANDB_CACHE_DIR": str(tmp / "wb-cache"),
        "WANDB_DATA_DIR": str(tmp / "wb-data"),
    }


def _run(args: list[str], log: Path, timeout_s: float) -> str:
    """Runs the CLI forked from the fork server (tests/cli_server.py) in its own session, its output
    in `log`; on a timeout its whole process group (every rank) is killed."""
    with (
        log.open("w") as out,
        start_cli(args, log.parent, _env(log.parent), stdout=out, stderr=subprocess.STDOUT) as proc,
    ):
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{args[0]} still running after {timeout_s:.0f} s on 2 processes: {log.read_text()[-3000:]}")
    assert proc.returncode == 0, log.read_text()[-3000:]
    return log.read_text()


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("ddp") / "run"
    _run(["fit", "-c", str(EXAMPLE), *DDP, *FIT, f"output_dir={run}"], run.parent / "fit.log", FIT_TIMEOUT_S)
    return run


def _easy(run: Path) -> dict[int, dict]:
    return {r["step"]: r for r in eval_rows(read_history(run)) if r["dataset"] == "easy"}


@pytest.mark.slow
@pytest.mark.ddp
def test_grpo_on_two_ddp_processes_raises_eval_accuracy_far_beyond_chance(run_dir: Path) -> None:
    easy = _easy(run_dir)
    assert sorted(easy) == [0, MID_STEP, MAX_STEPS]
    assert {(r["world_size"], r["num_prompts"], r["num_samples"]) for r in easy.values()} == {(2, 100, 400)}
    before, after = easy[0]["metrics"], easy[MAX_STEPS]["metrics"]
    # The format warm-up teaches no answers: chance level on 19 possible sums.
    assert before["accuracy"] < 0.1
    # 100 prompts each: the 95% Wilson intervals over prompts are disjoint with room to spare (as on one process).
    assert after["accuracy/ci_low"] > before["accuracy/ci_high"] + 0.05, (before, after)
    assert after["reward/mean"] > 3 * max(before["reward/mean"], 0.02)
    # fit ends with its checkpoints and by drawing the run's plot; rank 0 alone wrote the side files.
    assert {"last.ckpt", f"step{MID_STEP}.ckpt"} <= {p.name for p in (run_dir / "checkpoints").glob("*.ckpt")}
    assert (run_dir / "eval_accuracy.png").is_file()
    assert list(run_dir.rglob("*.wandb")), "no W&B offline run file"


@pytest.mark.slow
@pytest.mark.ddp
def test_evaluating_a_mid_training_checkpoint_on_two_processes_reproduces_its_round(run_dir: Path) -> None:
    history = run_dir / "reevaluated.jsonl"
    ckpt = run_dir / "checkpoints" / f"step{MID_STEP}.ckpt"
    args = ["evaluate", "-c", str(run_dir / "config.yaml"), "--ckpt", str(ckpt), "--history", str(history), *DDP]
    out = _run(args, run_dir.parent / "evaluate.log", COMMAND_TIMEOUT_S)
    assert "2 process(es)" in out
    in_training = {r["dataset"]: r for r in eval_rows(read_history(run_dir)) if r["step"] == MID_STEP}
    again = {r["dataset"]: r for r in eval_rows(read_history(history))}
    assert set(again) == set(in_training) == {"easy", "hard"}
    for dataset, record in again.items():
        assert (record["step"], record["world_size"], record["trigger"]) == (MID_STEP, 2, ["evaluate"])
        assert record["num_prompts"] == in_training[dataset]["num_prompts"]
        # the same weights, deal and per-sample seeds: the same numbers, to the last bit
        assert record["metrics"] == round_metrics(in_training[dataset]["metrics"]), dataset


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


@pytest.mark.slow
@pytest.mark.ddp
@pytest.mark.timeout(4 * COMMAND_TIMEOUT_S)
def test_the_watch_and_the_plot_follow_the_run_on_two_processes(run_dir: Path) -> None:
    # The watcher: every checkpoint once, a file that is no checkpoint reported once (rank 0 alone
    # decides), then SIGTERM ends both processes cleanly.
    checkpoints = run_dir / "checkpoints"
    steps_on_disk = {MID_STEP, MAX_STEPS}
    later_step = MAX_STEPS + 2  # a checkpoint written once the broken file is reported
    broken = checkpoints / "broken.ckpt"
    broken.write_bytes(b"not a checkpoint")
    log = run_dir.parent / "watch.log"
    config = str(run_dir / "config.yaml")
    with open(log, "w") as sink:  # forked from the fork server, in a process group of its own
        watcher = start_cli(
            # on 2 processes: the devices of the run's config
            ["evaluate", "-c", config, "--watch", str(checkpoints), "--poll-secs", "0.2"],
            run_dir.parent, _env(run_dir.parent), stdout=sink, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:

        def wait_for(steps: set[int]) -> None:
            """Until the watch has evaluated `steps` and reported the broken file."""
            deadline = time.monotonic() + COMMAND_TIMEOUT_S
            while {r["step"] for r in eval_rows(read_history(run_dir)) if "watch" in r["trigger"]} != steps or not [
                e for e in event_rows(read_history(run_dir)) if e.get("checkpoint") == str(broken)
            ]:
                assert watcher.poll() is None, f"the watcher ended early:\n{log.read_text()[-3000:]}"
                assert time.monotonic() < deadline, f"the watcher hung on 2 processes:\n{log.read_text()[-3000:]}"
                time.sleep(POLL_S)

        wait_for(steps_on_disk)
        # One more checkpoint, evaluated before the stop: the watch has looked at the directory again
        # after the broken file's record, so a second rank that also decided (and counted the
        # broken file's failed loads) would have recorded it a second time by now.
        later = torch.load(checkpoints / "last.ckpt", weights_only=False)
        later["global_step"] = later_step
        torch.save(later, run_dir / "later.tmp")
        os.replace(run_dir / "later.tmp", checkpoints / f"step{later_step}.ckpt")
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
    assert {r["world_size"] for r in eval_rows(read_history(run_dir)) if "watch" in r["trigger"]} == {2}

    # plot: the run's curves, with the watch's evaluations beside training.
    out_png = run_dir.parent / "plot.png"
    done = run_cli(
        ["plot", str(run_dir), "--out", str(out_png)], COMMAND_TIMEOUT_S, run_dir.parent, _env(run_dir.parent)
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert out_png.stat().st_size > 0
    errors = [e for e in event_rows(read_history(run_dir)) if e.get("event") == "error"]
    assert [e.get("checkpoint") for e in errors] == [str(broken)], errors
