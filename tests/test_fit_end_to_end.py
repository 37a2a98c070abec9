"""`areal-lightning fit` end to end: the real CLI, Trainer, GRPOModule, W&B offline, eval history
and plots, read back from the files a user would look at."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch
import yaml
from callback_helpers import round_metrics
from cli_server import run_command
from procs import evaluate_command
from wandb_reader import (
    read_wandb_records,
    read_wandb_tables,
    wandb_config,
    wandb_history,
    wandb_metric_definitions,
    wandb_step_metric,
)

from areal_lightning.callbacks.choices import DEFAULT_TABLE_ROWS
from areal_lightning.tracking.history import eval_rows, read_history
from areal_lightning.viz.plot import build_figure

MAX_STEPS = 7
EASY_SIZE = 12
SMALL = [
    f"trainer.max_steps={MAX_STEPS}",
    "trainer.log_every_n_steps=1",
    "trainer.enable_progress_bar=false",
    "policy.d_model=32",
    "policy.n_heads=2",
    "grpo.warmup_steps=30",
    "grpo.prompts_per_step=8",
    "task.train_size=24",
    f"eval_sets.easy.size={EASY_SIZE}",
    "eval_sets.easy.n_samples=2",
    "eval_sets.hard.size=6",
    "eval_sets.hard.n_samples=2",
    "evaluator.freq_steps=3",
    "evaluator.freq_epochs=null",
    "evaluator.freq_secs=null",
    "logger.wandb.mode=offline",
]
EXAMPLE = Path(__file__).resolve().parents[1] / "areal_lightning" / "app" / "configs" / "arithmetic_grpo.yaml"


def _fit(tmp_path: Path, trial: str, *extra: str) -> Path:
    env = dict(
        os.environ,
        WANDB_SILENT="true",
        WANDB_CONFIG_DIR=str(tmp_path / "wb-config"),
        WANDB_CACHE_DIR=str(tmp_path / "wb-cache"),
        WANDB_DATA_DIR=str(tmp_path / "wb-data"),
    )
    run_dir = tmp_path / "runs" / trial
    proc = run_command(
        [
            sys.executable,
            "-m",
            "areal_lightning",
            "fit",
            "-c",
            str(EXAMPLE),
            *SMALL,
            f"trial_name={trial}",
            f"output_dir={run_dir}",
            *extra,
        ],
        timeout=240,
        cwd=tmp_path,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"plot: {run_dir / 'eval_accuracy.png'}" in proc.stderr + proc.stdout  # the job says where its plot is
    return run_dir


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> tuple[Path, Path]:
    tmp = tmp_path_factory.mktemp("fit")
    return _fit(tmp, "mt2", "grpo.group_size=2"), _fit(tmp, "mt4", "grpo.group_size=4")


@pytest.mark.slow
def test_history_has_every_round_of_both_eval_sets(runs):
    run_dir = runs[0]
    rows = eval_rows(read_history(run_dir))
    steps = {d: [r["step"] for r in rows if r["dataset"] == d] for d in ("easy", "hard")}
    assert steps["easy"] == steps["hard"] == [0, 3, 6, 7]  # before training, steps 3 and 6, the end
    assert [r["trigger"] for r in rows if r["dataset"] == "easy"] == [["before_train"], ["steps"], ["steps"], ["end"]]
    assert {r["num_prompts"] for r in rows if r["dataset"] == "easy"} == {12}
    assert {r["num_samples"] for r in rows if r["dataset"] == "easy"} == {24}
    assert (run_dir / "config.yaml").is_file() and (run_dir / "checkpoints" / "last.ckpt").is_file()
    # One run id: in config.yaml, in every record, in the checkpoint, and as the W&B run's id.
    run_id = yaml.safe_load((run_dir / "config.yaml").read_text())["run_id"]
    assert len(run_id) == 8 and {r["run_id"] for r in read_history(run_dir)} == {run_id}
    assert {r["source"] for r in rows} == {"training"}
    assert torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["run_id"] == run_id
    (wandb_run,) = [r["run"] for r in read_wandb_records(run_dir) if r["type"] == "run"]
    assert wandb_run["run_id"] == run_id


@pytest.mark.slow
def test_wandb_offline_run_has_eval_metrics_on_their_own_axis_and_a_table(runs):
    run_dir = runs[0]
    history = eval_rows(read_history(run_dir))
    records = read_wandb_records(run_dir)
    config = wandb_config(records)
    assert config["grpo"]["group_size"] == 2 and config["output_dir"] == str(run_dir)  # the resolved config
    definitions = wandb_metric_definitions(records)
    assert wandb_step_metric(definitions, "eval/easy/accuracy") == "eval/step"
    rows = wandb_history(records)
    for record in history:
        key = f"eval/{record['dataset']}/accuracy"
        logged = [row for row in rows if key in row]
        match = [row for row in logged if row["eval/step"] == record["step"]]
        assert len(match) == 1, (key, record["step"], [r["eval/step"] for r in logged])
        assert match[0][key] == pytest.approx(record["metrics"]["accuracy"])
    tables = read_wandb_tables(run_dir, key="eval/easy/samples")
    assert tables and set(tables[0].columns) >= {"prompt", "completion", "reward", "correct"}
    # One row per prompt (its first sample) for the first max_table_rows prompts: all 12 of easy.
    assert len(tables[0].data) == min(EASY_SIZE, DEFAULT_TABLE_ROWS) == EASY_SIZE
    prompts = [row[tables[0].columns.index("prompt")] for row in tables[0].data]
    assert len(set(prompts)) == EASY_SIZE


@pytest.mark.slow
def test_plot_draws_both_figures_from_real_histories(runs, tmp_path):
    mt2, mt4 = runs
    single = build_figure({"mt2": read_history(mt2)}, metric="accuracy")
    assert sorted(line.get_label() for line in single.axes[0].get_lines() if not line.get_label().startswith("_")) == [
        "easy",
        "hard",
    ]
    out = tmp_path / "compare.png"
    proc = run_command(
        [
            sys.executable,
            "-m",
            "areal_lightning",
            "plot",
            str(mt2),
            str(mt4),
            "--metric",
            "reward/mean",
            "--out",
            str(out),
        ],
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert out.is_file() and out.stat().st_size > 10_000
    compare = build_figure({"mt2": read_history(mt2), "mt4": read_history(mt4)}, metric="reward/mean")
    labels = {line.get_label() for line in compare.axes[0].get_lines()}
    assert {"mt2: easy", "mt4: easy", "mt2: hard", "mt4: hard"} <= labels
    assert "mt2" in compare.axes[0].get_title() and "mt4" in compare.axes[0].get_title()


@pytest.mark.slow
@pytest.mark.ddp
def test_evaluating_the_saved_checkpoint_on_two_processes_reproduces_the_in_training_round(runs):
    run_dir = runs[0]
    end = {r["dataset"]: r for r in eval_rows(read_history(run_dir)) if r["step"] == MAX_STEPS}
    history = run_dir / "reevaluated.jsonl"
    proc = run_command(
        evaluate_command(
            run_dir / "config.yaml",
            run_dir / "checkpoints" / "last.ckpt",
            "--history",
            str(history),
            "trainer.devices=2",
            "trainer.strategy=ddp",
            "logger.wandb.mode=disabled",
        ),
        timeout=240,
        cwd=run_dir.parent,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    again = {r["dataset"]: r for r in eval_rows(read_history(history))}
    assert set(again) == set(end) == {"easy", "hard"}
    for dataset, record in again.items():
        assert record["step"] == MAX_STEPS and record["world_size"] == 2 and record["trigger"] == ["evaluate"]
        assert record["run_id"] == end[dataset]["run_id"] and record["source"] == "standalone"
        assert record["num_prompts"] == end[dataset]["num_prompts"]
        # same weights, same per-sample seeds: the same numbers, whatever the number of processes
        # (the in-training record also has the paired changes since earlier rounds: `<metric>/delta...`)
        in_training = round_metrics(end[dataset]["metrics"])
        assert record["metrics"] == in_training  # bit for bit
