"""GRPO on code end to end: `areal-lightning fit` of the example config with a tiny random Llama,
rewarded by the tests of the problems in the sandbox, evaluated on HumanEval and on a local file.

The training problems ask for ``return <an int>``: random completions of the tiny model are
sometimes a number (passed), sometimes not Python (syntax_error) or another type (failed).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch
from cli_server import run_command

pytest.importorskip("transformers")
from hf_models import save_tiny_llama

from areal_lightning.tracking.history import eval_rows, read_history

EXAMPLE = Path(__file__).resolve().parents[1] / "areal_lightning" / "app" / "configs" / "code_grpo.yaml"
MAX_STEPS = 2
STATUSES = ("passed", "failed", "timeout", "crashed", "syntax_error", "out_of_memory")


def write_int_problems(path: Path, n: int) -> Path:
    """`n` HumanEval-shaped problems whose answer is any int."""
    rows = [
        {
            "task_id": f"int/{i}",
            "prompt": f"def f{i}():\n    return ",
            "test": "def check(candidate):\n    assert isinstance(candidate(), int)\n",
            "entry_point": f"f{i}",
            "canonical_solution": str(i),
        }
        for i in range(n)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.slow
def test_fit_trains_on_code_and_counts_each_program_status(tmp_path: Path) -> None:
    model = save_tiny_llama(tmp_path / "model", digit_bias=3.0, max_positions=1024)  # HumanEval's headers are long
    problems = write_int_problems(tmp_path / "train.jsonl", 4)
    overrides = [
        f"policy.path={model}",
        "policy.dtype=float32",
        "policy.attn_implementation=eager",
        f"task.path={problems}",
        "task.sandbox_wall_s=5",
        "trainer.accelerator=cpu",
        f"trainer.max_steps={MAX_STEPS}",
        "trainer.enable_progress_bar=false",
        "trainer.checkpoint_every_n_steps=null",
        "grpo.group_size=8",
        "grpo.prompts_per_step=4",
        "grpo.lr=1e-2",
        "grpo.max_new_tokens=3",
        "eval_sets.humaneval.size=2",
        "eval_sets.humaneval.n_samples=2",
        "eval_sets.humaneval.max_new_tokens=4",
        "eval_sets.humaneval.batch_size=2",
        f"eval_sets.ints.path={problems}",  # a second eval set: the training problems
        "eval_sets.ints.n_samples=4",
        "eval_sets.ints.max_new_tokens=3",
        "evaluator.freq_steps=null",
        "evaluator.freq_epochs=null",
        "evaluator.freq_secs=null",
        "evaluator.metric_thresholds={code/passed: 1000}",  # a code count is a metric a user may name
        "logger.wandb.mode=disabled",
        f"output_dir={tmp_path / 'run'}",
    ]
    env = dict(os.environ, WANDB_MODE="disabled", OMP_NUM_THREADS="1")
    proc = run_command(
        [sys.executable, "-m", "areal_lightning", "fit", "-c", str(EXAMPLE), *overrides], 600, tmp_path, env
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = eval_rows(read_history(tmp_path / "run"))
    assert sorted((r["dataset"], r["step"]) for r in rows) == [
        ("humaneval", 0),
        ("humaneval", MAX_STEPS),
        ("ints", 0),
        ("ints", MAX_STEPS),
    ]
    for row in rows:
        counts = {s: row["metrics"][f"code/{s}"] for s in STATUSES}
        assert sum(counts.values()) == row["num_samples"], counts  # every program has exactly one status
        assert {"pass@1", "accuracy", "reward/mean"} <= set(row["metrics"])
        if row["dataset"] == "ints":
            assert row["metrics"]["pass@1"] == counts["passed"] / row["num_samples"]
    ints = {r["step"]: r["metrics"]["pass@1"] for r in rows if r["dataset"] == "ints"}
    assert ints[MAX_STEPS] > ints[0], ints  # the tests' reward taught it to return an int (0.125 -> 0.94 here)
    ckpt = torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", weights_only=True)
    assert ckpt["global_step"] == MAX_STEPS
    metrics_csv = next((tmp_path / "run" / "csv").rglob("metrics.csv")).read_text()
    assert "train/reward" in metrics_csv


@pytest.mark.process
@pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox runs programs as another user only when started as root")
def test_fit_where_the_sandbox_cannot_enter_the_temporary_directory_stops_in_one_line_before_training(
    tmp_path: Path,
) -> None:
    model = save_tiny_llama(tmp_path / "model", max_positions=1024)
    private = tmp_path / "private"
    private.mkdir(mode=0o700)  # a per-user or per-job TMPDIR
    overrides = ["policy.path=" + str(model), "task.path=humaneval", f"output_dir={tmp_path / 'run'}"]
    env = dict(os.environ, TMPDIR=str(private), WANDB_MODE="disabled", OMP_NUM_THREADS="1")
    proc = run_command(
        [sys.executable, "-m", "areal_lightning", "fit", "-c", str(EXAMPLE), *overrides], 300, tmp_path, env
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    (line,) = [s for s in proc.stderr.splitlines() if s.startswith("areal-lightning: error:")]
    assert "who cannot enter" in line and "set TMPDIR" in line, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "run").exists()  # nothing started
    assert os.listdir(private) == []
