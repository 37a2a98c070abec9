"""Model graders configured in YAML, end to end through the CLI on a CPU: `fit` and `evaluate` with
the example config's reward model and judge (tiny random-weight models built in the test)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from cli_server import run_cli

pytest.importorskip("transformers")
from hf_models import save_tiny_llama, write_gsm8k
from test_code_model_graders import save_tiny_reward_model

from areal_lightning.tracking.history import eval_rows, read_history

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "math" / "gsm8k_graders.yaml"
EVAL_PROMPTS, EVAL_SAMPLES = 4, 3
TIMEOUT_S = 400


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("graders_cli")
    save_tiny_llama(tmp / "policy", digit_bias=2.0)
    save_tiny_llama(tmp / "judge", seed=3, digit_bias=2.0)  # its replies hold digits: verdicts parse
    save_tiny_reward_model(tmp / "rm")
    write_gsm8k(tmp / "train.jsonl", 8)
    write_gsm8k(tmp / "test.jsonl", EVAL_PROMPTS, offset=8)
    return tmp


def _paths(models: Path, run: Path) -> list[str]:
    return [
        f"policy.path={models / 'policy'}",
        f"graders.reward_model.path={models / 'rm'}",
        f"graders.judge.path={models / 'judge'}",
        # A random judge never writes "VERDICT: ...": its first digit is the verdict (3: correct).
        r"graders.judge.verdict_pattern=(\d)",
        "graders.judge.correct_word=3",
        f"task.path={models / 'train.jsonl'}",
        f"eval_sets.gsm8k.path={models / 'test.jsonl'}",
        f"output_dir={run}",
    ]


SHORT = [
    "trainer.max_steps=2",
    "trainer.enable_progress_bar=false",
    "grpo.group_size=2",
    "grpo.prompts_per_step=2",
    "grpo.max_new_tokens=4",
    "eval_sets.gsm8k.max_new_tokens=4",
    f"eval_sets.gsm8k.n_samples={EVAL_SAMPLES}",
    "evaluator.freq_steps=2",
    "logger.wandb.mode=disabled",
]


def _cli(cwd: Path, *args: str) -> Any:
    env = dict(os.environ, OMP_NUM_THREADS="1", WANDB_MODE="disabled")
    done = run_cli(list(args), TIMEOUT_S, cwd, env)  # forked from the fork server (tests/cli_server.py)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def _graded(metrics: dict[str, float]) -> None:
    """The round was graded by both models: the judge's verdicts are its correctness, the reward
    model's continuous scores its reward."""
    n = EVAL_PROMPTS * EVAL_SAMPLES
    counts = [metrics[f"judge/{w}"] for w in ("correct", "incorrect", "unparsed")]
    assert sum(counts) == n and metrics["accuracy"] == metrics["judge/correct_share"] == counts[0] / n
    assert counts[0] + counts[1] > 0  # verdicts were parsed
    assert not {metrics["reward/min"], metrics["reward/max"]} & {0.0, 1.0} and metrics["reward/std"] > 0


@pytest.mark.process
@pytest.mark.slow
def test_fit_and_evaluate_grade_with_the_configured_models(models: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    _cli(tmp_path, "fit", "-c", str(EXAMPLE), *_paths(models, run), *SHORT)
    rounds = eval_rows(read_history(run / "eval_history.jsonl"))
    assert [r["step"] for r in rounds] == [0, 2]
    for r in rounds:
        _graded(r["metrics"])

    ckpt = str(run / "checkpoints" / "last.ckpt")
    _cli(tmp_path, "evaluate", "-c", str(run / "config.yaml"), "--ckpt", ckpt, "logger.wandb.mode=disabled")
    after = eval_rows(read_history(run / "eval_history.jsonl"))
    assert len(after) == len(rounds) + 1 and after[-1]["step"] == 2  # the standalone evaluation's record
    _graded(after[-1]["metrics"])

    # The checkpoint holds the graders' weights; evaluated without graders, the verifier alone grades.
    bare = [
        "graders.reward_model=null",
        "graders.judge=null",
        "evaluator.best_metrics=null",
        "logger.wandb.mode=disabled",
    ]
    _cli(tmp_path, "evaluate", "-c", str(run / "config.yaml"), "--ckpt", ckpt, *bare)
    plain = eval_rows(read_history(run / "eval_history.jsonl"))[-1]["metrics"]
    assert not [m for m in plain if m.startswith("judge/")]
    assert {plain["reward/min"], plain["reward/max"]} <= {0.0, 1.0}  # the verifier's 0/1


def test_the_tiny_policy_is_still_warmed_up_when_graders_grade_arithmetic(models: Path) -> None:
    from areal_lightning.app.builders import build_module
    from areal_lightning.app.config import load_config

    cfg = load_config(None, ["eval_sets.easy.size=4", f"graders.reward_model.path={models / 'rm'}"])
    module = build_module(cfg)
    assert type(module.task).__name__ == "GradedTask" and module.uses_format_warmup
