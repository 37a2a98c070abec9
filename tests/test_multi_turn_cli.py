"""The packaged MT2 example through the commands a user runs: `fit` (progress bar, CSV logger and
checkpoints on), then `evaluate` of its checkpoint, then a resume from a step checkpoint; and the
typo a user makes in the episodes section."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch
from cli_server import run_cli, run_command
from procs import evaluate_command

from areal_lightning.tracking.history import eval_rows, read_history

CONFIGS = Path(__file__).resolve().parents[1] / "areal_lightning" / "app" / "configs"
SMALL = [
    "trainer.max_steps=4",
    "trainer.checkpoint_every_n_steps=2",
    "trainer.log_every_n_steps=1",
    "evaluator.freq_steps=2",
    "grpo.warmup_steps=60",  # the answer format, so that some episodes succeed and every step trains
    "grpo.prompts_per_step=8",
    "grpo.group_size=8",
    "task.train_size=16",
    "eval_sets.easy.size=8",
    "eval_sets.easy.n_samples=2",
]
TIMEOUT_S = 300


def _command(*args: str, cwd: Path) -> str:
    proc = run_cli(list(args), TIMEOUT_S, cwd, dict(os.environ))  # forked from the fork server (tests/cli_server.py)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout + proc.stderr


def _rounds(run: Path, source: str = "training") -> list[dict]:
    return [r for r in eval_rows(read_history(run)) if r.get("source", "training") == source]


@pytest.mark.slow
@pytest.mark.process
def test_fit_evaluate_and_resume_the_mt2_example(tmp_path: Path) -> None:
    run = tmp_path / "mt2"
    _command("fit", "-c", str(CONFIGS / "arithmetic_mt2.yaml"), *SMALL, f"output_dir={run}", cwd=tmp_path)
    rounds = _rounds(run)
    assert [r["step"] for r in rounds] == [0, 2, 4]
    for r in rounds:
        m = r["metrics"]
        assert m["success@1"] <= m["success@2"] == m["accuracy"] and 1.0 <= m["turns/mean"] <= 2.0
        assert {"completion/length/mean", "turn1/completion/truncated", "turn2/completion/entropy"} <= m.keys()
    end = rounds[-1]["metrics"]

    # The second command: the checkpoint evaluated alone gives the end round's numbers.
    proc = run_command(
        evaluate_command(run / "config.yaml", run / "checkpoints" / "last.ckpt"), timeout=TIMEOUT_S, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (alone,) = _rounds(run, "standalone")
    for key in ("reward/mean", "accuracy", "success@1", "success@2", "turns/mean", "turn1/completion/entropy"):
        assert alone["metrics"][key] == end[key], key

    # A resume from step 2 trains on the same episodes: the same weights at step 4, the same round.
    first_weights = torch.load(run / "checkpoints" / "step4.ckpt", weights_only=True)["state_dict"]
    at_step2 = torch.load(run / "checkpoints" / "step2.ckpt", weights_only=True)["state_dict"]
    assert not all(torch.equal(at_step2[k], first_weights[k]) for k in at_step2)  # steps 3 and 4 trained
    _command("fit", "-c", str(run / "config.yaml"), "--ckpt", str(run / "checkpoints" / "step2.ckpt"), cwd=tmp_path)
    again = [r for r in _rounds(run) if r["step"] == 4]
    assert len(again) == 2 and again[1]["metrics"]["success@2"] == end["success@2"]
    assert again[1]["metrics"]["reward/mean"] == end["reward/mean"]
    (resumed,) = (run / "checkpoints").glob("step4-v*.ckpt")  # Lightning keeps the first run's step4.ckpt
    weights = torch.load(resumed, weights_only=True)["state_dict"]
    assert weights.keys() == first_weights.keys()
    assert all(torch.equal(weights[k], first_weights[k]) for k in weights)


@pytest.mark.process
def test_a_typo_in_the_episodes_section_is_refused_before_any_work(tmp_path: Path) -> None:
    proc = run_command(
        [
            sys.executable,
            "-m",
            "areal_lightning",
            "fit",
            "-c",
            str(CONFIGS / "arithmetic_mt4.yaml"),
            "episodes.max_turn=3",
        ],
        timeout=TIMEOUT_S,
        cwd=tmp_path,
    )
    assert proc.returncode == 2
    assert "unknown config key `episodes.max_turn`" in proc.stderr and "Did you mean `max_turns`?" in proc.stderr
    assert not (tmp_path / "runs").exists()
