"""`areal-lightning evaluate --watch`: checkpoints of a concurrent real `fit` evaluated once each,
oldest first, across a kill and restart of the watcher; partial files never read; clean stops.

Every command is forked from the tests' fork server (`start_cli`) into a session of its own, and
is killed with its whole process group on timeout.
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
from cli_server import CliProcess, start_cli

from areal_lightning.app.watch_directory import STOP_FILENAME, next_checkpoint
from areal_lightning.tracking.history import eval_rows, event_rows, read_history

DEADLINE_S = 400  # the whole scenario, on a busy 2-core box
POLL_S = 0.2
CONFIG = {
    "seed": 2,
    "policy": {"d_model": 32, "n_layers": 1},
    "grpo": {"warmup_steps": 20, "prompts_per_step": 4, "group_size": 4},
    "trainer": {"max_steps": 8, "checkpoint_every_n_steps": 2, "enable_progress_bar": False},
    "eval_sets": {"w": {"digits": 1, "size": 12, "n_samples": 2, "batch_size": 8, "top_p": 0.9}},
    "evaluator": {"eval_at_end": False, "freq_steps": 1000},  # fit evaluates nothing itself
    "logger": {"csv": False, "wandb": {"mode": "disabled"}},
}


def _start(*args: str, cwd: Path) -> CliProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return start_cli(list(args), cwd, env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def _kill(proc: CliProcess, sig: int = signal.SIGKILL) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)


def _wait_for(condition, what: str, deadline: float, procs: list[CliProcess]) -> None:
    while not condition():
        if time.monotonic() > deadline:
            for p in procs:
                _kill(p)
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(POLL_S)


def _watch_steps(history: Path) -> list[int]:
    return [r["step"] for r in eval_rows(read_history(history)) if "watch" in r["trigger"]] if history.exists() else []


@pytest.mark.slow
def test_watch_follows_a_concurrent_fit_once_per_checkpoint_across_a_restart(tmp_path: Path) -> None:
    config = tmp_path / "cfg.yaml"
    run = tmp_path / "run"
    config.write_text(yaml.safe_dump({**CONFIG, "output_dir": str(run)}))
    ckpts, history = run / "checkpoints", run / "eval_history.jsonl"
    deadline = time.monotonic() + DEADLINE_S
    watch_args = ["evaluate", "-c", str(config), "--watch", str(ckpts), "--poll-secs", "0.3"]
    fit = _start("fit", "-c", str(config), cwd=tmp_path)
    first = _start(*watch_args, cwd=tmp_path)
    procs = [fit, first]
    try:
        # Kill the first watcher (the whole group, no chance to clean up) once it evaluated one checkpoint.
        _wait_for(lambda: len(_watch_steps(history)) >= 1, "the first watch record", deadline, procs)
        _kill(first)
        first.wait(30)
        # A partially written checkpoint (half a real one) appears; it must never be evaluated.
        _wait_for(lambda: (ckpts / "step2.ckpt").exists(), "a checkpoint", deadline, procs)
        data = (ckpts / "step2.ckpt").read_bytes()
        (ckpts / "step1000.ckpt").write_bytes(data[: len(data) // 2])
        second = _start(*watch_args, cwd=tmp_path)
        procs.append(second)
        _wait_for(lambda: fit.poll() is not None, "fit to end", deadline, procs)
        fit_out = fit.stdout.read()
        assert fit.returncode == 0, fit_out[-3000:]
        (ckpts / STOP_FILENAME).touch()
        _wait_for(lambda: second.poll() is not None, "the second watcher to stop", deadline, procs)
        out = second.stdout.read()
        assert second.returncode == 0, out[-3000:]
    finally:
        for p in procs:
            _kill(p)
            p.close()
    expected = sorted(
        {
            int(torch.load(p, weights_only=True, mmap=True)["global_step"])
            for p in ckpts.glob("*.ckpt")
            if p.name != "step1000.ckpt"
        }
    )
    assert expected == [2, 4, 6, 8]
    steps = _watch_steps(history)
    assert sorted(steps) == expected  # each once: none twice across the restart, none skipped
    assert steps == sorted(steps)  # oldest first
    assert "watch stopped: STOP_WATCH found" in out
    # The partial file was reported, never evaluated, and did not crash the watcher.
    assert any("step1000.ckpt" in e["message"] for e in event_rows(read_history(history), "error"))
    record = eval_rows(read_history(history))[-1]
    assert record["checkpoint"].endswith(".ckpt") and record["sampling"]["top_p"] == 0.9
    assert record["num_prompts"] == 12


@pytest.mark.process
@pytest.mark.parametrize("how", ["sigint", "idle"])
def test_watch_stops_cleanly_on_ctrl_c_and_on_idle_timeout(tmp_path: Path, how: str) -> None:
    config = tmp_path / "cfg.yaml"
    config.write_text(yaml.safe_dump({**CONFIG, "output_dir": str(tmp_path / "run")}))
    log = tmp_path / "watch.log"
    args = [
        "evaluate",
        "-c",
        str(config),
        "--watch",
        str(tmp_path / "empty"),
        "--poll-secs",
        "0.2",
        *(["--idle-timeout", "1"] if how == "idle" else []),
    ]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with open(log, "w") as sink, start_cli(args, tmp_path, env, stdout=sink, stderr=subprocess.STDOUT) as proc:
        if how == "sigint":
            _wait_for(
                lambda: "watching" in log.read_text() or proc.poll() is not None,
                "the watcher to start",
                time.monotonic() + 120,
                [proc],
            )
            os.kill(proc.pid, signal.SIGINT)  # what Ctrl-C sends
        proc.wait(120)
    out = log.read_text()
    assert proc.returncode == 0, out[-3000:]
    expected = "stop requested" if how == "sigint" else "no new checkpoint for 1 s"
    assert f"watch stopped: {expected}; 0 checkpoint(s) evaluated" in out
    assert "Traceback" not in out


def test_next_checkpoint_takes_the_oldest_step_not_yet_evaluated() -> None:
    steps = {Path("last.ckpt"): (9, 1), Path("step3.ckpt"): (3, 0), Path("step6.ckpt"): (6, 0)}
    assert next_checkpoint(steps, set()) == (Path("step3.ckpt"), 3, 0)
    assert next_checkpoint(steps, {3, 6}) == (Path("last.ckpt"), 9, 1)
    assert next_checkpoint(steps, {3, 6, 9}) is None
