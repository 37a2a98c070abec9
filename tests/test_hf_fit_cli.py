"""`areal-lightning fit` and `evaluate` with a local Hugging Face model on a local GSM8K file, end to
end through the CLI and the example config (a tiny random-weight Llama built in the test)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from cli_server import run_command

pytest.importorskip("transformers")
from callback_helpers import round_metrics
from hf_models import save_tiny_llama, write_gsm8k

from areal_lightning.tracking.history import eval_rows, read_history

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "math" / "gsm8k_grpo.yaml"
MAX_STEPS = 3
EVAL_PROMPTS = 6
EVAL_SAMPLES = 8  # per prompt: 48 a round, a few of them right


def _cli(tmp: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, WANDB_MODE="disabled", OMP_NUM_THREADS="1")
    return run_command([sys.executable, "-m", "areal_lightning", *args], 400, cwd=tmp, env=env)


def _small(tmp: Path) -> list[str]:
    model = save_tiny_llama(tmp / "model", digit_bias=2.0)  # random completions are sometimes right
    return [
        f"policy.path={model}",
        "policy.dtype=float32",
        "policy.attn_implementation=eager",
        f"task.path={write_gsm8k(tmp / 'train.jsonl', 8)}",
        "task.verifier=numeric",  # random text: numbers, not LaTeX
        f"eval_sets.gsm8k.path={write_gsm8k(tmp / 'test.jsonl', EVAL_PROMPTS, offset=8)}",
        "trainer.accelerator=cpu",
        f"trainer.max_steps={MAX_STEPS}",
        "trainer.enable_progress_bar=false",
        "trainer.checkpoint_every_n_steps=null",
        "grpo.group_size=8",  # 32 rollouts a step: some right, so every step has a gradient
        "grpo.prompts_per_step=4",
        "grpo.lr=1e-2",
        "grpo.max_new_tokens=6",
        "eval_sets.gsm8k.max_new_tokens=6",
        f"eval_sets.gsm8k.n_samples={EVAL_SAMPLES}",
        "eval_sets.gsm8k.batch_size=4",
        "evaluator.freq_steps=2",
        "evaluator.freq_epochs=null",
        "evaluator.freq_secs=null",
        "logger.wandb.mode=disabled",
        f"output_dir={tmp / 'run'}",
    ]


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> tuple[Path, list[str]]:
    tmp = tmp_path_factory.mktemp("hf_fit")
    overrides = _small(tmp)
    proc = _cli(tmp, "fit", "-c", str(EXAMPLE), *overrides)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return tmp, overrides


@pytest.mark.slow
def test_fit_trains_the_hf_model_and_evaluates_it_on_the_gsm8k_file(run) -> None:
    tmp, _ = run
    rows = eval_rows(read_history(tmp / "run"))
    assert [r["step"] for r in rows] == [0, 2, MAX_STEPS]  # before training, every 2 steps, the end
    for row in rows:
        assert row["dataset"] == "gsm8k" and row["num_prompts"] == EVAL_PROMPTS
        assert row["num_samples"] == EVAL_SAMPLES * EVAL_PROMPTS
        assert {"accuracy", "reward/mean", "pass@1", f"pass@{EVAL_SAMPLES}", f"maj@{EVAL_SAMPLES}"} <= set(
            row["metrics"]
        )
    # GRPO updated the transformers model's own weights.
    from transformers import AutoModelForCausalLM

    start = AutoModelForCausalLM.from_pretrained(tmp / "model").state_dict()
    ckpt = torch.load(tmp / "run" / "checkpoints" / "last.ckpt", weights_only=True)
    assert ckpt["global_step"] == MAX_STEPS
    head = "lm_head.weight"
    assert ckpt["state_dict"][f"policy.model.{head}"].shape == start[head].shape
    assert not torch.equal(ckpt["state_dict"][f"policy.model.{head}"], start[head])
    metrics_csv = next((tmp / "run" / "csv").rglob("metrics.csv")).read_text()
    assert "train/reward" in metrics_csv and "train/completion/entropy" in metrics_csv


@pytest.mark.slow
def test_evaluate_of_the_checkpoint_gives_the_metrics_of_the_last_training_round(run) -> None:
    tmp, _ = run
    saved = tmp / "run" / "config.yaml"  # the run's resolved config, as a user would reuse it
    proc = _cli(tmp, "evaluate", "-c", str(saved), "--ckpt", str(tmp / "run" / "checkpoints" / "last.ckpt"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "gsm8k" in proc.stdout
    rows = eval_rows(read_history(tmp / "run"))
    at_end, evaluated = rows[-2], rows[-1]
    assert evaluated["trigger"] == ["evaluate"] and evaluated["step"] == MAX_STEPS
    # Same weights, same per-sample seeds: the same completions, so the same numbers.
    assert 0 < at_end["metrics"]["accuracy"] < 1  # some right, some wrong: the comparison means something
    assert evaluated["metrics"] == round_metrics(at_end["metrics"])
    assert evaluated["num_prompts"] == EVAL_PROMPTS


@pytest.mark.process
def test_fit_without_a_model_path_fails_before_any_work(tmp_path: Path) -> None:
    data = write_gsm8k(tmp_path / "test.jsonl", 2)
    proc = _cli(
        tmp_path,
        "fit",
        "-c",
        str(EXAMPLE),
        "policy.path=null",
        f"task.path={data}",
        f"eval_sets.gsm8k.path={data}",
        f"output_dir={tmp_path / 'run'}",
    )
    assert proc.returncode == 2
    assert "policy.path is required for policy.kind: hf" in proc.stderr
    assert not (tmp_path / "run").exists()
