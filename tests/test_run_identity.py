"""One run, one identity: `fit` never mixes two runs in one directory, and `fit --ckpt` after a kill
continues the same run: its run_id, its eval history, its W&B run (rewound to the checkpoint's row,
read back from the offline run files) and its CSV version. Real CLI processes throughout (forked from
the fork server where they run to their end); the kill is a real SIGKILL of a fresh interpreter."""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from cli_server import CliProcess, run_cli, start_cli
from small_run import SMALL_FIT
from wandb_reader import (
    branch_point,
    read_wandb_records,
    rewound_history,
    wandb_history,
    wandb_metric_definitions,
    wandb_step_metric,
)

from areal_lightning.tracking.history import drop_superseded, eval_rows, event_rows, read_history, split_runs

EXAMPLE = Path(__file__).resolve().parents[1] / "areal_lightning" / "app" / "configs" / "arithmetic_grpo.yaml"
RUN_TIMEOUT_S = 300
KILL_AT_EVAL_STEP = 6
"""The kill comes once step 6 is evaluated: after the checkpoint of step 5, before the one of step 10."""
CHECKPOINT_EVERY = 5
RESUMED_MAX_STEPS = 12


def _env(tmp_path: Path) -> dict[str, str]:
    temp = tmp_path / "tmp"  # the killed run's temporary files (W&B's) stay in the test's directory
    temp.mkdir(exist_ok=True)
    return dict(
        os.environ,
        TMPDIR=str(temp),
        WANDB_SILENT="true",
        WANDB_CONFIG_DIR=str(tmp_path / "wb-config"),
        WANDB_CACHE_DIR=str(tmp_path / "wb-cache"),
        WANDB_DATA_DIR=str(tmp_path / "wb-data"),
    )


def _fit_command(run_dir: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "areal_lightning",
        "fit",
        "-c",
        str(EXAMPLE),
        *SMALL_FIT,
        "trial_name=t",
        f"output_dir={run_dir}",
        *extra,
    ]


def _fit(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """A command run to its end, forked from the fork server (tests/cli_server.py); the killed run
    of the resume test is a fresh interpreter (`_fit_command`), as a user's is."""
    return run_cli(_fit_command(tmp_path / "runs" / "t", *args)[3:], RUN_TIMEOUT_S, tmp_path, _env(tmp_path))


def _fit_new_run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """`--new-run` with the default output_dir (runs/<experiment>/<trial>), so that a trial can move."""
    argv = [
        "fit",
        "-c",
        str(EXAMPLE),
        *SMALL_FIT,
        "experiment_name=runs",
        "trial_name=t",
        "output_dir=${experiment_name}/${trial_name}",
        *args,
    ]
    return run_cli(argv, RUN_TIMEOUT_S, tmp_path, _env(tmp_path))


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.slow
def test_a_second_fit_into_a_used_directory_stops_and_leaves_the_first_run_untouched(tmp_path: Path) -> None:
    first = _fit_new_run(
        tmp_path, "trainer.max_steps=3", "evaluator.freq_steps=2", "trainer.checkpoint_every_n_steps=2"
    )
    assert first.returncode == 0, first.stderr[-3000:]
    run_dir = tmp_path / "runs" / "t"
    before = _snapshot(run_dir)
    assert {"config.yaml", "eval_history.jsonl", "checkpoints/last.ckpt"} <= set(before)
    assert any(name.endswith(".wandb") for name in before) and any(name.startswith("csv/") for name in before)

    again = _fit_new_run(tmp_path, "trainer.max_steps=3", "seed=7", "grpo.lr=1e-2")  # an override, same trial
    assert again.returncode == 2 and "Traceback" not in again.stderr
    message = again.stderr
    assert f"output_dir {str(Path('runs/t'))!r} already holds a run" in message
    assert "config.yaml, eval_history.jsonl, checkpoints, csv, wandb" in message and "nothing was written" in message
    assert "trial_name=..." in message and "--ckpt runs/t/checkpoints/last.ckpt" in message and "--new-run" in message
    assert _snapshot(run_dir) == before  # every file of the first run byte-identical, nothing added

    both = _fit_new_run(tmp_path, "--new-run", "--ckpt", str(run_dir / "checkpoints" / "last.ckpt"))
    assert both.returncode == 2 and "pass one of them" in both.stderr

    beside = _fit_new_run(tmp_path, "trainer.max_steps=2", "evaluator.freq_steps=2", "--new-run")
    assert beside.returncode == 0, beside.stderr[-3000:]
    assert _snapshot(run_dir) == before
    new_dir = tmp_path / "runs" / "t-1"
    old_cfg, new_cfg = (yaml.safe_load((d / "config.yaml").read_text()) for d in (run_dir, new_dir))
    assert new_cfg["trial_name"] == "t-1" and new_cfg["run_id"] != old_cfg["run_id"]
    assert {r["run_id"] for r in read_history(new_dir)} == {new_cfg["run_id"]}


def _wandb_run_dirs(run_dir: Path) -> list[Path]:
    return sorted((run_dir / "wandb").glob("offline-run-*"))


def _kill_after_eval_of_step(proc: CliProcess, run_dir: Path, step: int) -> None:
    """SIGKILL the whole process group (wandb's own process too) once `step` is in the eval history."""
    history = run_dir / "eval_history.jsonl"
    deadline = time.monotonic() + RUN_TIMEOUT_S
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            if history.is_file() and any(r["step"] >= step for r in eval_rows(read_history(history))):
                break
            time.sleep(0.02)
        assert proc.poll() is None, "the run ended before it could be killed:\n" + proc.output(proc.err_path)[-3000:]
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)


@pytest.mark.slow
def test_fit_ckpt_after_a_kill_continues_the_same_run_id_history_wandb_run_and_csv(tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / "t"
    options = ["evaluator.freq_steps=2", f"trainer.checkpoint_every_n_steps={CHECKPOINT_EVERY}"]
    argv = _fit_command(run_dir, "trainer.max_steps=1000", *options)[3:]
    with start_cli(argv, tmp_path, _env(tmp_path), stdout=subprocess.DEVNULL) as proc:
        _kill_after_eval_of_step(proc, run_dir, KILL_AT_EVAL_STEP)
    assert proc.returncode == -signal.SIGKILL
    ckpt = run_dir / "checkpoints" / "last.ckpt"
    saved = torch.load(ckpt, weights_only=True)
    run_id = yaml.safe_load((run_dir / "config.yaml").read_text())["run_id"]
    assert saved["run_id"] == run_id and saved["global_step"] == CHECKPOINT_EVERY
    killed_history = read_history(run_dir)
    dead = [r["step"] for r in eval_rows(killed_history) if r["step"] > CHECKPOINT_EVERY]
    assert dead, "the killed session evaluated no step after its checkpoint: nothing to supersede"
    config_before = (run_dir / "config.yaml").read_bytes()
    (killed_wandb,) = _wandb_run_dirs(run_dir)

    resumed = _fit(tmp_path, f"trainer.max_steps={RESUMED_MAX_STEPS}", *options, "--ckpt", str(ckpt))
    assert resumed.returncode == 0, resumed.stderr[-3000:]

    # The eval history: one run, a resume event, every step once after superseding the dead session.
    records = read_history(run_dir)
    assert records[: len(killed_history)] == killed_history  # appended to, never rewritten
    assert list(split_runs(records)) == [run_id]
    (resume,) = event_rows(records, "resume")
    assert resume["step"] == CHECKPOINT_EVERY and resume["run_id"] == run_id
    kept = eval_rows(drop_superseded(records))
    assert [r["step"] for r in kept if r["dataset"] == "easy"] == list(range(0, RESUMED_MAX_STEPS + 1, 2))
    assert (run_dir / "config.yaml").read_bytes() == config_before  # the resumed session's config went beside it
    assert yaml.safe_load((run_dir / f"config.resumed-step{CHECKPOINT_EVERY}.yaml").read_text())["run_id"] == run_id

    # W&B: the resumed session wrote to the same run id and rewound it to the checkpoint's row. Read
    # back as W&B holds it after syncing: no step twice, every eval step after the checkpoint once.
    # Before it, the rows the killed W&B service had written out: a SIGKILL of the whole group
    # takes the rows it still held with it (no rewind or resume brings them back; the eval history
    # has every round).
    wandb_dirs = _wandb_run_dirs(run_dir)
    assert len(wandb_dirs) == 2 and all(d.name.endswith(f"-{run_id}") for d in wandb_dirs)
    (resumed_wandb,) = [d for d in wandb_dirs if d != killed_wandb]
    killed_records, records_wandb = read_wandb_records(killed_wandb), read_wandb_records(resumed_wandb)
    (run,) = [r["run"] for r in records_wandb if r["type"] == "run"]
    assert run["run_id"] == run_id
    assert branch_point(records_wandb) == {"run": run_id, "metric": "_step", "value": saved["wandb_step"]}
    assert wandb_step_metric(wandb_metric_definitions(records_wandb), "eval/easy/accuracy") == "eval/step"
    rows = rewound_history([killed_records, records_wandb])
    assert [row["_step"] for row in rows] == sorted({row["_step"] for row in rows})
    points = [row["eval/step"] for row in rows if "eval/step" in row]
    killed_points = [row["eval/step"] for row in wandb_history(killed_records) if "eval/step" in row]
    assert [s for s in points if s <= CHECKPOINT_EVERY] == [s for s in killed_points if s <= CHECKPOINT_EVERY]
    assert [s for s in points if s > CHECKPOINT_EVERY] == list(range(CHECKPOINT_EVERY + 1, RESUMED_MAX_STEPS + 1, 2))
    trained = [row["trainer/global_step"] for row in rows if "eval/step" not in row]
    assert trained == sorted(set(trained))  # no training point twice

    # Lightning's CSV logger went on in its own version, keeping the killed session's rows.
    assert [p.name for p in (run_dir / "csv").iterdir()] == ["version_0"]
    with (run_dir / "csv" / "version_0" / "metrics.csv").open() as f:
        steps = {int(row["step"]) for row in csv.DictReader(f)}
    assert {0, RESUMED_MAX_STEPS} <= steps
