"""A `fit` killed with SIGKILL during an evaluation round, or between recording a round and saving
its checkpoint, then resumed with ``fit --ckpt <step checkpoint>``: the history's every line parses,
holds one record per (eval set, step), skips no due round, and matches an uninterrupted run; the
final weights are the same; neither the before-train round nor the warm-up runs twice.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
from cli_server import run_cli, start_cli

from areal_lightning.tracking.history import HISTORY_FILENAME, drop_superseded, read_history

HERE = Path(__file__).resolve().parent
RUNNER = HERE / "fit_with_faults.py"
EXAMPLE = HERE.parents[1] / "areal_lightning" / "app" / "configs" / "arithmetic_grpo.yaml"
RUN_TIMEOUT_S = 300
SMALL = [
    "trainer.max_steps=6",
    "trainer.checkpoint_every_n_steps=1",
    "trainer.enable_progress_bar=false",
    "policy.d_model=32",
    "policy.n_heads=2",
    "grpo.warmup_steps=60",  # the format learnt: some rollouts are right from the first step
    "grpo.prompts_per_step=8",  # 64 rollouts a step: some are right, so every step changes the weights
    "grpo.group_size=8",
    "task.train_size=32",  # 4 steps an epoch: step 3 is mid-epoch
    "eval_sets.easy.size=8",
    "eval_sets.easy.n_samples=2",
    "eval_sets.hard.size=4",
    "eval_sets.hard.n_samples=2",
    "evaluator.freq_steps=2",
    "evaluator.freq_epochs=null",
    "evaluator.freq_secs=null",
    "evaluator.eval_before_train=true",
    "logger.wandb.mode=disabled",
    "logger.csv=false",
]
EXPECTED_ROUNDS = [(0, ["before_train"]), (2, ["steps"]), (4, ["steps"]), (6, ["steps", "end"])]


def _env(marks: Path, hang: str = "") -> dict[str, str]:
    return dict(os.environ, FAULT_MARKS=str(marks), FAULT_HANG=hang)


def _args(run_dir: Path, *extra: str) -> list[str]:
    """``fit_with_faults.py``'s arguments; it runs forked from the fork server (tests/cli_server.py)."""
    return ["fit", "-c", str(EXAMPLE), *SMALL, f"output_dir={run_dir}", *extra]


def _fit(run_dir: Path, marks: Path, *extra: str) -> None:
    proc = run_cli(_args(run_dir, *extra), RUN_TIMEOUT_S, run_dir.parent, _env(marks), script=RUNNER)
    assert proc.returncode == 0, proc.stderr[-3000:]


def _fit_until_killed(run_dir: Path, marks: Path, hang: str) -> None:
    quiet = {"stdout": subprocess.DEVNULL}
    with start_cli(_args(run_dir), run_dir.parent, _env(marks, hang), script=RUNNER, **quiet) as proc:
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while not (marks.is_file() and "hang" in marks.read_text()):
            assert proc.poll() is None, f"the run ended before hanging: {proc.output(proc.err_path)[-3000:]}"
            assert time.monotonic() < deadline, "the run never reached the hang"
            time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL


def _rounds(run_dir: Path) -> list[tuple[str, int, list[str], dict]]:
    # Read as a resumed history is read: the dead session's records after the checkpoint are
    # superseded. The paired changes go on from the checkpoint's per-prompt outcomes.
    return [
        (r["dataset"], r["step"], r["trigger"], r["metrics"])
        for r in drop_superseded(read_history(run_dir))
        if "event" not in r
    ]


def _weights(run_dir: Path, name: str = "last") -> dict[str, torch.Tensor]:
    return torch.load(run_dir / "checkpoints" / f"{name}.ckpt", weights_only=False)["state_dict"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("reference") / "run"
    _fit(run_dir, run_dir.parent / "marks")
    return run_dir


@pytest.mark.slow
@pytest.mark.parametrize("hang", ["round:4", "checkpoint:4"])
def test_killed_run_resumed_from_a_step_checkpoint_matches_an_uninterrupted_one(
    reference: Path, hang: str, tmp_path: Path
) -> None:
    run_dir, marks = tmp_path / "run", tmp_path / "marks"
    _fit_until_killed(run_dir, marks, hang)
    killed_rounds = [line for line in marks.read_text().splitlines() if line.startswith("round easy")]
    assert killed_rounds == ["round easy 0", "round easy 2", "round easy 4"]
    assert not (run_dir / "checkpoints" / "step4.ckpt").exists()  # killed before step 4's checkpoint

    _fit(run_dir, marks, "--ckpt", str(run_dir / "checkpoints" / "step3.ckpt"))

    lines = (run_dir / HISTORY_FILENAME).read_text().splitlines()
    assert all(line.startswith("{") and line.endswith("}") for line in lines)  # every line whole JSON
    rounds = _rounds(run_dir)
    expected = [(d, step, trigger) for step, trigger in EXPECTED_ROUNDS for d in ("easy", "hard")]
    assert [(d, s, t) for d, s, t, _ in rounds] == expected  # one per (set, step), none skipped
    assert rounds == _rounds(reference)  # the same numbers too
    assert marks.read_text().splitlines().count("warmup") == 1  # the resumed run starts from the checkpoint
    assert [line for line in marks.read_text().splitlines() if line.endswith(" 0")] == ["round easy 0", "round hard 0"]
    # The same weights: the resumed steps trained on the prompts of the uninterrupted run (the rest
    # of epoch 0 from its 4th batch, then epoch 1 in its own order), and they did change the weights.
    final, uninterrupted, resumed_from = _weights(run_dir), _weights(reference), _weights(run_dir, "step3")
    assert final.keys() == uninterrupted.keys()
    assert not all(torch.equal(final[name], value) for name, value in resumed_from.items())
    for name, value in uninterrupted.items():
        assert torch.equal(final[name], value), name
