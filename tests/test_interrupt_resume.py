"""Ctrl-C and SIGTERM during a real `areal-lightning fit`, then the resume command it prints.

The run is a process in its own process group (forked from the tests' fork server: `start_cli`),
and the signal goes to the whole group, as a terminal's Ctrl-C reaches every process of the
foreground job (W&B's own service included). The SIGINT comes 2 s after the history holds a round
of step `SIGNAL_AFTER_EVAL_STEP`. Then the printed ``fit ... --ckpt`` command runs on: no eval step
missing or repeated, the paired change and the best values go on from the checkpoint, the W&B run,
read back from its offline files, holds one copy of every step (the resumed session rewinds it to
the checkpoint's row and numbers its rows on from there), and the rounds and final weights are
those of a run never stopped.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from cli_server import run_command, start_cli
from small_run import SMALL_FIT
from wandb_reader import branch_point, read_wandb_records, rewound_history, run_sessions, wandb_history

from areal_lightning.tracking.history import eval_rows, event_rows, read_history

EXAMPLE = Path(__file__).resolve().parents[1] / "areal_lightning" / "app" / "configs" / "arithmetic_grpo.yaml"
SMALL = [
    *SMALL_FIT,
    # Training that changes the weights at every step (64 rollouts, the format learnt), with
    # 4 steps an epoch: the stop falls mid-epoch or at an epoch's end, and either way the resumed
    # run must end with the weights of a run never stopped.
    "grpo.warmup_steps=60",
    "grpo.prompts_per_step=8",
    "grpo.group_size=8",
    "task.train_size=32",
    "evaluator.freq_steps=2",
    "trainer.checkpoint_every_n_steps=5",
    "trial_name=t",
    "output_dir=runs/t",
    "trainer.max_steps=1000",
]
SIGNAL_AFTER_EVAL_STEP = 6
"""The signal follows a round of step 6: after the periodic checkpoint of step 5."""
SIGNAL_DELAY_S = 2.0
RESUMED_EXTRA_STEPS = 6
RUN_TIMEOUT_S = 300.0
TEST_TIMEOUT_S = 3 * RUN_TIMEOUT_S + 60
"""The Ctrl-C test runs three fits, each allowed RUN_TIMEOUT_S: the suite's 300 s per test is less
than it allows itself (under a load of 14 on 2 cores its third fit ran past it)."""
PROGRAM = "areal-lightning"


def _env(tmp_path: Path) -> dict[str, str]:
    return dict(
        os.environ,
        WANDB_SILENT="true",
        WANDB_CONFIG_DIR=str(tmp_path / "wb-config"),
        WANDB_CACHE_DIR=str(tmp_path / "wb-cache"),
        WANDB_DATA_DIR=str(tmp_path / "wb-data"),
    )


def _fit_args(*extra: str) -> list[str]:
    return [sys.executable, "-m", "areal_lightning", "fit", "-c", str(EXAMPLE), *SMALL, *extra]


def _signal_after_eval(tmp_path: Path, sig: signal.Signals, eval_step: int) -> tuple[int, str]:
    """Starts `fit`, sends `sig` to its process group `SIGNAL_DELAY_S` after the history holds a
    round of `eval_step`; returns its exit status and stderr. The group ends within the timeout."""
    history = tmp_path / "runs" / "t" / "eval_history.jsonl"
    stderr_path = tmp_path / f"fit-{sig.name}.err"
    # Leaving `start_cli` ends whatever is left of the group (nothing, when it stopped as it should).
    with (
        stderr_path.open("w") as stderr,
        start_cli(_fit_args()[3:], tmp_path, _env(tmp_path), stdout=subprocess.DEVNULL, stderr=stderr) as proc,
    ):
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while time.monotonic() < deadline and proc.poll() is None:
            if history.is_file() and any(r["step"] >= eval_step for r in eval_rows(read_history(history))):
                break
            time.sleep(0.05)
        assert proc.poll() is None, "fit ended before the signal:\n" + stderr_path.read_text()[-3000:]
        time.sleep(SIGNAL_DELAY_S)
        os.killpg(proc.pid, sig)
        status = proc.wait(timeout=RUN_TIMEOUT_S)
    return status, stderr_path.read_text()


def _resume_words(stderr: str) -> list[str]:
    """The command the stopped `fit` printed after ``resume with:``, split as a shell would."""
    lines = stderr.splitlines()
    (at,) = [i for i, line in enumerate(lines) if line.strip() == "resume with:"]
    words = shlex.split(lines[at + 1])
    assert words[:2] == [PROGRAM, "fit"] and words[-2] == "--ckpt", words
    return words


def _first_best(rows: list[dict[str, Any]], metric: str) -> tuple[float, int]:
    """The highest value of `metric` among `rows` and the first step that reached it."""
    best = max(r["metrics"][metric] for r in rows)
    return best, next(r["step"] for r in rows if r["metrics"][metric] == best)


@pytest.mark.slow
@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_ctrl_c_checkpoints_the_step_and_the_printed_command_resumes_everything(tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / "t"
    status, stderr = _signal_after_eval(tmp_path, signal.SIGINT, SIGNAL_AFTER_EVAL_STEP)
    assert status == 130, stderr[-3000:]
    assert "Traceback" not in stderr
    words = _resume_words(stderr)
    ckpt_path = tmp_path / words[-1]
    assert ckpt_path == run_dir / "checkpoints" / "last.ckpt"

    ckpt = torch.load(ckpt_path, weights_only=True)
    stopped = ckpt["global_step"]
    run_id = yaml.safe_load((run_dir / "config.yaml").read_text())["run_id"]
    assert ckpt["run_id"] == run_id and stopped >= SIGNAL_AFTER_EVAL_STEP
    assert f"training stopped by SIGINT after step {stopped}" in stderr
    before = read_history(run_dir)
    (interrupted,) = event_rows(before, "interrupted")
    assert (interrupted["step"], interrupted["signal"]) == (stopped, "SIGINT")
    assert shlex.split(interrupted["resume_command"]) == words
    # W&B was finished, with the exit status.
    (dead_session,) = run_sessions(run_dir, run_id)
    dead_records = read_wandb_records(dead_session)
    assert [r["exit"]["exit_code"] for r in dead_records if r["type"] == "exit"] == [130]

    max_steps = stopped + RESUMED_EXTRA_STEPS
    resumed = run_command(
        [sys.executable, "-m", "areal_lightning", *words[1:-2], f"trainer.max_steps={max_steps}", *words[-2:]],
        timeout=RUN_TIMEOUT_S,
        cwd=tmp_path,
        env=_env(tmp_path),
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]

    # The schedule: every eval step once, none missing, none repeated (nothing was superseded).
    records = read_history(run_dir)
    assert records[: len(before)] == before
    expected = sorted({*range(0, max_steps + 1, 2), max_steps})
    easy = [r for r in eval_rows(records) if r["dataset"] == "easy"]
    assert [r["step"] for r in easy] == expected
    (resume,) = event_rows(records, "resume")
    assert resume["step"] == stopped
    # The paired change and the best values go on from the checkpoint at the first resumed round.
    first_resumed = next(r for r in easy if r["step"] > stopped)
    assert {"accuracy/delta", "accuracy/delta_ci_low", "accuracy/delta_best"} <= set(first_resumed["metrics"])
    best, best_step = _first_best([r for r in easy if r["step"] <= first_resumed["step"]], "accuracy")
    assert (first_resumed["metrics"]["accuracy/best"], first_resumed["metrics"]["accuracy/best_step"]) == (
        best,
        best_step,
    )

    # W&B: the resumed session rewound the run to the checkpoint's row; read back as W&B holds it
    # after syncing, the run has every eval step once and no row of the dead session after it.
    sessions = run_sessions(run_dir, run_id)
    assert sessions[0] == dead_session and len(sessions) == 2
    resumed_records = read_wandb_records(sessions[1])
    assert branch_point(resumed_records) == {"run": run_id, "metric": "_step", "value": ckpt["wandb_step"]}
    # The stop came at the step's end: its checkpoint holds the session's last row (a crash after a
    # periodic checkpoint leaves later rows, which the rewind drops: test_run_identity.py).
    assert wandb_history(dead_records)[-1]["_step"] == ckpt["wandb_step"]
    rows = rewound_history([dead_records, resumed_records])
    steps = [r["_step"] for r in rows]
    assert steps == sorted(set(steps))
    assert [r["eval/step"] for r in rows if "eval/step" in r] == expected
    trained = [r["trainer/global_step"] for r in rows if "eval/step" not in r]
    assert trained == sorted(set(trained)) and trained[-1] == max_steps - 1

    # A run never stopped, to the same step: the same rounds (numbers, changes, best values) and
    # the same weights, bit for bit. The resumed steps trained on the same prompts in the same order.
    never_stopped = tmp_path / "runs" / "never-stopped"
    reference = run_command(
        _fit_args(f"trainer.max_steps={max_steps}", "trial_name=never-stopped", f"output_dir={never_stopped}"),
        timeout=RUN_TIMEOUT_S,
        cwd=tmp_path,
        env=_env(tmp_path),
    )
    assert reference.returncode == 0, reference.stderr[-3000:]
    rounds = [(r["dataset"], r["step"], r["metrics"]) for r in eval_rows(records)]
    assert rounds == [(r["dataset"], r["step"], r["metrics"]) for r in eval_rows(read_history(never_stopped))]
    final = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    expected_weights = torch.load(never_stopped / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    assert not all(torch.equal(final[name], value) for name, value in ckpt["state_dict"].items())  # it trained on
    assert all(torch.equal(final[name], value) for name, value in expected_weights.items())


@pytest.mark.slow
def test_sigterm_checkpoints_the_step_and_exits_143(tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / "t"
    status, stderr = _signal_after_eval(tmp_path, signal.SIGTERM, 2)
    assert status == 143, stderr[-3000:]
    ckpt = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    assert ckpt["global_step"] >= 2
    assert f"training stopped by SIGTERM after step {ckpt['global_step']}" in stderr
    assert _resume_words(stderr)[-1] == "runs/t/checkpoints/last.ckpt"
    (interrupted,) = event_rows(read_history(run_dir), "interrupted")
    assert (interrupted["step"], interrupted["signal"]) == (ckpt["global_step"], "SIGTERM")
