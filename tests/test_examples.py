"""Each example runs, at small size, as a user would run it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from areal_lightning.tracking.history import eval_rows, read_history

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _run(tmp_path: Path, script: str, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, WANDB_MODE="disabled", OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(EXAMPLES.parent), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, str(EXAMPLES / script), *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=400)
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
    _run(tmp_path, "vlm/geometry3k_grpo.py", "--model", str(model), "--data", str(data), "--steps", "2",
         "--eval-every", "2", "--group-size", "2", "--prompts-per-step", "2", "--max-new-tokens", "4",
         "--accelerator", "cpu", "--output-dir", str(out))
    rows = eval_rows(read_history(out))
    assert [(r["step"], r["dataset"], r["num_prompts"]) for r in rows] == [(0, "geometry3k", 4), (2, "geometry3k", 4)]
    assert {"reward/mean", "accuracy"} <= set(rows[0]["metrics"])
