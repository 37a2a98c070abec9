"""Each example runs, at small size, as a user would run it: ``python SCRIPT ARGS`` in a directory of
its own, forked from the tests' fork server (tests/cli_server.py: the script runs as `__main__` with
the user's argv and environment, without paying torch's and Lightning's imports again; what only a
fresh interpreter shows is tested by test_demo, test_cli and test_wheel)."""

from __future__ import annotations

import csv
import importlib.util
import json
import os
from pathlib import Path

import pytest
import torch
import yaml
from cli_server import CliRun, run_cli, run_command
from procs import evaluate_command

from areal_lightning.tasks.math import MathTask
from areal_lightning.tasks.math_answers import CORRECT_REWARD
from areal_lightning.tracking.history import eval_rows, read_history

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _env(wandb_mode: str = "disabled") -> dict[str, str]:
    return dict(
        os.environ,
        WANDB_MODE=wandb_mode,
        OMP_NUM_THREADS="1",
        PYTHONPATH=os.pathsep.join([str(EXAMPLES.parent), os.environ.get("PYTHONPATH", "")]),
    )


def _run(tmp_path: Path, script: str, *args: str, wandb_mode: str = "disabled") -> CliRun:
    proc = run_cli(list(args), 400, tmp_path, _env(wandb_mode), script=EXAMPLES / script)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


@pytest.mark.slow
def test_geometry3k_vlm_example_trains_and_evaluates_a_tiny_vision_language_model(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    pytest.importorskip("PIL")
    from hf_models import save_tiny_llava, write_geometry3k

    model = save_tiny_llava(tmp_path / "vlm")
    data = write_geometry3k(tmp_path / "geo" / "train.jsonl", 4)
    out = tmp_path / "run"
    _run(
        tmp_path,
        "vlm/geometry3k_grpo.py",
        "--model",
        str(model),
        "--data",
        str(data),
        "--steps",
        "2",
        "--eval-every",
        "2",
        "--group-size",
        "2",
        "--prompts-per-step",
        "2",
        "--max-new-tokens",
        "4",
        "--accelerator",
        "cpu",
        "--output-dir",
        str(out),
    )
    rows = eval_rows(read_history(out))
    assert [(r["step"], r["dataset"], r["num_prompts"]) for r in rows] == [(0, "geometry3k", 4), (2, "geometry3k", 4)]
    assert {"reward/mean", "accuracy"} <= set(rows[0]["metrics"])


@pytest.mark.process
def test_custom_evaluate_fn_example_logs_bleu_and_accuracy_of_a_users_module(tmp_path: Path) -> None:
    out = tmp_path / "run"
    _run(
        tmp_path,
        "custom_evaluate_fn.py",
        "--steps",
        "60",
        "--eval-every",
        "30",
        "--eval-size",
        "16",
        "--output-dir",
        str(out),
    )
    rows = eval_rows(read_history(out))
    assert [(r["step"], r["dataset"], r["num_prompts"]) for r in rows] == [
        (0, "dev", 16),
        (30, "dev", 16),
        (60, "dev", 16),
    ]
    bleu = [r["metrics"]["bleu"] for r in rows]
    assert all(0 <= b <= 1 for b in bleu) and bleu[-1] > bleu[0]  # the translator learns, and BLEU shows it
    assert rows[-1]["metrics"]["accuracy"] >= rows[0]["metrics"]["accuracy"]
    # What the docstring promises: eval/<set>/bleu reaches the Trainer's logger, at the rounds' steps.
    with open(out / "csv" / "version_0" / "metrics.csv") as f:
        logged = [row for row in csv.DictReader(f) if row.get("eval/dev/bleu")]
    assert [int(r["step"]) for r in logged] == [r["step"] for r in rows]
    assert [float(r["eval/dev/bleu"]) for r in logged] == pytest.approx(bleu, rel=1e-6)  # float32 in the logger
    assert all(r["eval/dev/accuracy"] for r in logged)


@pytest.mark.slow
def test_gsm8k_example_script_runs_its_own_evaluate_fn(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    from hf_models import save_tiny_llama, write_gsm8k

    model = save_tiny_llama(tmp_path / "model", digit_bias=2.0)
    data = write_gsm8k(tmp_path / "gsm8k.jsonl", 4)
    out = tmp_path / "run"
    _run(
        tmp_path,
        "math/gsm8k_grpo.py",
        f"policy.path={model}",
        "policy.dtype=float32",
        f"task.path={data}",
        "task.verifier=numeric",
        f"eval_sets.gsm8k.path={data}",
        "trainer.accelerator=cpu",
        "trainer.max_steps=2",
        "grpo.group_size=2",
        "grpo.prompts_per_step=2",
        "grpo.max_new_tokens=4",
        "eval_sets.gsm8k.max_new_tokens=4",
        "eval_sets.gsm8k.n_samples=2",
        "evaluator.freq_steps=2",
        "evaluator.freq_epochs=null",
        "evaluator.freq_secs=null",
        "logger.wandb.mode=offline",
        f"output_dir={out}",
        wandb_mode="offline",
    )
    records = read_history(out)
    rows = eval_rows(records)
    assert [(r["step"], r["num_prompts"], r["num_samples"]) for r in rows] == [(0, 4, 8), (2, 4, 8)]
    metrics = rows[-1]["metrics"]
    assert {"reward/mean", "accuracy", "completion_tokens", "no_answer_frac"} <= set(metrics)
    assert 0 < metrics["completion_tokens"] <= 4 and 0 <= metrics["no_answer_frac"] <= 1
    # One run, one identity: config.yaml, every record, the checkpoint and the W&B run share the id.
    run_id = yaml.safe_load((out / "config.yaml").read_text())["run_id"]
    assert run_id and {r["run_id"] for r in records} == {run_id}
    assert torch.load(out / "checkpoints" / "last.ckpt", weights_only=True)["run_id"] == run_id
    assert [p.name.rsplit("-", 1)[-1] for p in (out / "wandb").glob("offline-run-*")] == [run_id]
    # ... so `evaluate` knows the run of the checkpoint.
    done = run_command(evaluate_command(out / "config.yaml", out / "checkpoints" / "last.ckpt"), 300, tmp_path, _env())
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"(run {run_id}, step 2," in done.stdout


def test_the_vlm_examples_reward_scores_as_the_math_task_does(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("geometry3k_grpo", EXAMPLES / "vlm" / "geometry3k_grpo.py")
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    data = tmp_path / "rows.jsonl"
    data.write_text(json.dumps({"question": "?", "answer": "#### 1"}) + "\n")
    task = MathTask(data, score_timeout_s=None)  # verifier "auto", scored in this process
    cases = [
        ("so \\boxed{\\frac{1}{2}}", "0.5"),
        ("The angle is \\boxed{14}.", "14"),
        ("The angle is \\boxed{15}.", "14"),
        ("no final answer here", "14"),
        ("\\boxed{\\frac{\\sqrt{3}}{2}}", "\\frac{\\sqrt3}{2}"),  # symbolic: needs math-verify
    ]
    assert [example.geometric_reward(c, a) for c, a in cases] == [task.reward(c, a) for c, a in cases]
    if importlib.util.find_spec("math_verify") is not None:
        assert example.geometric_reward(*cases[-1]) == CORRECT_REWARD
