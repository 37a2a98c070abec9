"""The completion statistics and every k where a user looks: `areal-lightning fit`'s eval history,
metrics.csv and offline W&B run, best values and thresholds that name them, `plot --metric`, and
Lightning's own `ModelCheckpoint` / `EarlyStopping` monitoring them."""

from __future__ import annotations

import csv
import math
import os
import sys
from pathlib import Path

import lightning as L
import pytest
from cli_server import run_command
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint
from wandb_reader import read_wandb_records, wandb_history

from areal_lightning.tracking.history import eval_rows, read_history

EXAMPLE = Path(__file__).resolve().parents[1] / "areal_lightning" / "app" / "configs" / "arithmetic_grpo.yaml"
SMALL = [
    "trainer.max_steps=4",
    "trainer.log_every_n_steps=1",
    "trainer.enable_progress_bar=false",
    "policy.d_model=32",
    "policy.n_heads=2",
    "grpo.warmup_steps=10",
    "grpo.prompts_per_step=4",
    "grpo.group_size=4",
    "task.train_size=16",
    "eval_sets.easy.size=6",
    "eval_sets.easy.ks=[1,2,4]",
    "eval_sets.hard.size=3",
    "evaluator.freq_steps=2",
    "evaluator.freq_epochs=null",
    "evaluator.freq_secs=null",
]
COMPLETION = [
    "length/mean",
    "length/p50",
    "length/p95",
    "length/max",
    "truncated",
    "stopped",
    "no_answer",
    "logprob",
    "entropy",
]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("stats")
    run = tmp / "run"
    env = dict(os.environ, WANDB_SILENT="true", WANDB_CONFIG_DIR=str(tmp / "wbc"), WANDB_CACHE_DIR=str(tmp / "wbk"))
    args = [
        *SMALL,
        "logger.wandb.mode=offline",
        "evaluator.best_metrics={completion/length/mean: min, pass^2: max}",
        "evaluator.metric_thresholds={pass@2: 0.99}",
        f"output_dir={run}",
    ]
    proc = run_command(
        [sys.executable, "-m", "areal_lightning", "fit", "-c", str(EXAMPLE), *args], timeout=300, env=env
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run / "fit.log").write_text(proc.stdout + proc.stderr)
    return run


@pytest.mark.slow
def test_every_round_of_the_history_has_the_completion_statistics_and_every_k(run_dir: Path) -> None:
    rows = eval_rows(read_history(run_dir))
    assert sorted({r["step"] for r in rows}) == [0, 2, 4]
    for row in rows:
        names = set(row["metrics"])
        assert {f"completion/{c}" for c in COMPLETION} <= names, row["step"]
        ks = [1, 2, 4] if row["dataset"] == "easy" else [1, 4]
        assert row["sampling"]["ks"] == ks
        assert {f"{m}{k}{s}" for m in ("pass@", "pass^", "maj@") for k in ks for s in ("", "/stderr")} <= names
    easy = [r["metrics"] for r in rows if r["dataset"] == "easy"]
    assert all(
        m["completion/length/mean/best"] == min(e["completion/length/mean"] for e in easy[: i + 1])
        for i, m in enumerate(easy)
    )
    assert "pass^2/best" in easy[-1]


@pytest.mark.slow
def test_each_rounds_summary_line_shows_the_tasks_metrics_not_the_statistics(run_dir: Path) -> None:
    lines = [line for line in (run_dir / "fit.log").read_text().splitlines() if "evaluation at step" in line]
    assert len(lines) == 3
    for line in lines:  # a log file: one line a round, arithmetic's accuracy and reward
        assert "easy: accuracy=" in line and "reward/mean=" in line and "hard: accuracy=" in line
        assert "completion/" not in line


@pytest.mark.slow
def test_metrics_csv_and_wandb_have_them_for_eval_and_training(run_dir: Path) -> None:
    (csv_path,) = run_dir.rglob("metrics.csv")
    with csv_path.open() as f:
        columns = set(next(csv.reader(f)))
    assert {f"eval/easy/completion/{c}" for c in COMPLETION} <= columns
    assert {f"train/completion/{c}" for c in COMPLETION} <= columns
    assert {"train/completion_len", "train/entropy"}.isdisjoint(columns)  # one name for one number
    logged = wandb_history(read_wandb_records(run_dir))
    ends = [row for row in logged if "eval/easy/completion/truncated" in row]
    assert [row["eval/step"] for row in ends] == [0, 2, 4]
    assert any("train/completion/length/p95" in row for row in logged)
    assert any("eval/easy/pass^2/stderr" in row for row in logged)


@pytest.mark.slow
def test_plot_draws_a_completion_statistic_alone_and_length_and_truncation_next_to_accuracy(run_dir: Path) -> None:
    from areal_lightning.viz.panels import build_panels

    plot = [sys.executable, "-m", "areal_lightning", "plot", str(run_dir)]
    proc = run_command([*plot, "--metric", "completion/truncated"], timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert Path(proc.stdout.strip()) == run_dir / "eval_completion_truncated.png"
    panels = ["accuracy", "completion/length/mean", "completion/truncated"]
    proc = run_command([*plot, *(a for m in panels for a in ("--metric", m))], timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = Path(proc.stdout.strip())
    assert out == run_dir / "eval_accuracy+completion_length_mean+completion_truncated.png"
    assert out.is_file() and out.stat().st_size > 20_000
    figure = build_panels({"run": read_history(run_dir)}, panels)
    assert [ax.get_ylabel() for ax in figure.axes] == panels
    assert all({line.get_label() for line in ax.get_lines()} >= {"easy", "hard"} for ax in figure.axes)
    assert figure.axes[2].get_ylim() == (0.0, 1.0)  # a share: the unit interval, as accuracy


@pytest.mark.slow
def test_lightning_monitors_select_by_a_completion_statistic_and_a_k(tmp_path: Path) -> None:
    from areal_lightning.app.builders import build_callback, build_module
    from areal_lightning.app.config import load_config

    cfg = load_config(str(EXAMPLE), [*SMALL, f"output_dir={tmp_path}", "logger.wandb.mode=disabled"])
    shortest = ModelCheckpoint(dirpath=tmp_path / "ckpt", monitor="eval/easy/completion/length/mean", mode="min")
    stop = EarlyStopping(monitor="eval/easy/pass^2", mode="max", patience=100)
    trainer = L.Trainer(
        max_steps=4, callbacks=[build_callback(cfg), shortest, stop], default_root_dir=tmp_path, log_every_n_steps=1
    )
    trainer.fit(build_module(cfg))
    easy = [r["metrics"] for r in eval_rows(read_history(tmp_path)) if r["dataset"] == "easy"]
    assert len(easy) == 3
    assert shortest.best_model_score is not None and stop.best_score is not None
    assert math.isclose(float(shortest.best_model_score), min(m["completion/length/mean"] for m in easy), rel_tol=1e-6)
    assert math.isclose(float(stop.best_score), max(m["pass^2"] for m in easy), rel_tol=1e-6)
