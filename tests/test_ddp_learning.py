"""`areal-lightning fit` of the main job on 2 DDP processes learns, as on one process, and its
in-training rounds equal a standalone 2-process `evaluate` of the checkpoint of the same step.

Each rank samples `grpo.prompts_per_step` prompts a step and DDP averages the two ranks'
gradients, so 16 prompts per rank make the same 32-prompt step (and the same 8 steps an epoch) as
the example's one-process job.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from callback_helpers import round_metrics
from cli_server import start_cli

from areal_lightning.tracking.history import eval_rows, read_history

MAX_STEPS = 160
MID_STEP = MAX_STEPS // 2
FIT_TIMEOUT_S = 1500.0  # about 30 CPU seconds; a shared, loaded 2-core box stretches it many times
EVALUATE_TIMEOUT_S = 600.0
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
    "trainer.enable_progress_bar=false",
    "logger.wandb.mode=disabled",
    "logger.csv=false",
]


def _run(args: list[str], log: Path, timeout_s: float) -> None:
    """Runs the CLI forked from the fork server (tests/cli_server.py) in its own session, its output
    in `log`; on a timeout its whole process group (every rank) is killed."""
    env = dict(os.environ)
    with log.open("w") as out, start_cli(args, log.parent, env, stdout=out, stderr=subprocess.STDOUT) as proc:
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{args[0]} still running after {timeout_s:.0f} s: {log.read_text()[-3000:]}")
    assert proc.returncode == 0, log.read_text()[-3000:]


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


@pytest.mark.slow
@pytest.mark.ddp
def test_evaluating_a_mid_training_checkpoint_on_two_processes_reproduces_its_round(run_dir: Path) -> None:
    history = run_dir / "reevaluated.jsonl"
    _run(
        [
            "evaluate",
            "-c",
            str(run_dir / "config.yaml"),
            "--ckpt",
            str(run_dir / "checkpoints" / f"step{MID_STEP}.ckpt"),
            "--history",
            str(history),
            *DDP,
        ],
        run_dir / "evaluate.log",
        EVALUATE_TIMEOUT_S,
    )
    in_training = {r["dataset"]: r for r in eval_rows(read_history(run_dir)) if r["step"] == MID_STEP}
    again = {r["dataset"]: r for r in eval_rows(read_history(history))}
    assert set(again) == set(in_training) == {"easy", "hard"}
    for dataset, record in again.items():
        assert (record["step"], record["world_size"], record["trigger"]) == (MID_STEP, 2, ["evaluate"])
        assert record["num_prompts"] == in_training[dataset]["num_prompts"]
        # the same weights, deal and per-sample seeds: the same numbers, to the last bit
        assert record["metrics"] == round_metrics(in_training[dataset]["metrics"]), dataset
