"""The CLI: configuration mistakes exit with status 2 and one readable paragraph, no traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from procs import run_in_group

from areal_lightning.app.config import load_config
from areal_lightning.tracking.history import read_history

pytestmark = pytest.mark.process

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "areal_lightning" / "app" / "configs" / "arithmetic_grpo.yaml"


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return run_in_group([sys.executable, "-m", "areal_lightning", *args], timeout=120, cwd=cwd)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["fit", "-c", str(EXAMPLE), "evaluator.freq_stpes=5"], "unknown config key `evaluator.freq_stpes`"),
        (["fit", "-c", str(EXAMPLE), "trainer.max_steps=abc"], "`trainer.max_steps`"),
        (["fit", "-c", str(EXAMPLE), "grpo.group_size=1"], "grpo.group_size must be at least 2"),
        (["fit", "-c", "missing.yaml"], "config file 'missing.yaml' does not exist"),
        (["fit", "-c", str(EXAMPLE), "--ckpt", "nope.ckpt"], "--ckpt 'nope.ckpt' does not exist"),
    ],
)
def test_config_errors_exit_2_without_traceback(tmp_path, args, message):
    proc = _cli(*args, cwd=tmp_path)
    assert proc.returncode == 2
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "runs").exists()  # rejected before any work started


def test_malformed_yaml_exits_2(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("trainer: {max_steps: 5\n")
    proc = _cli("fit", "-c", str(bad), cwd=tmp_path)
    assert proc.returncode == 2 and "is not valid YAML" in proc.stderr and "Traceback" not in proc.stderr


def test_help_lists_the_three_commands(tmp_path):
    proc = _cli("--help", cwd=tmp_path)
    assert proc.returncode == 0
    for command in ("fit", "evaluate", "plot"):
        assert command in proc.stdout


def test_a_mapping_written_whole_on_the_command_line_replaces_the_yaml_mapping(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text(
        "trainer: {max_steps: 1, enable_progress_bar: false}\n"
        "policy: {d_model: 16, n_layers: 1}\n"
        "grpo: {warmup_steps: 0, prompts_per_step: 2, group_size: 2}\n"
        "eval_sets:\n  easy: {digits: 1, size: 4}\n  hard: {digits: 2, size: 4}\n"
        "evaluator:\n  metric_thresholds: {accuracy: 0.7, reward: 0.85}\n  best_metrics: {accuracy: max}\n"
    )
    proc = _cli(
        "fit", "-c", str(config), "output_dir=run", "evaluator.metric_thresholds={}", "evaluator.best_metrics={}",
        "eval_sets={probe: {digits: 1, size: 3}}", "eval_sets.probe.n_samples=2", cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    saved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    decisions = saved["evaluator"]["decisions"]  # config.yaml holds the grouped form
    assert decisions["metric_thresholds"] == {} and decisions["best_metrics"] == {}
    assert list(saved["eval_sets"]) == ["probe"] and saved["eval_sets"]["probe"]["n_samples"] == 2
    records = read_history(tmp_path / "run")
    assert {r["dataset"] for r in records if "event" not in r} == {"probe"}
    assert not any("/best" in name for r in records for name in r.get("metrics", {}))  # best values off
    # A single key still merges into the file's mapping, and a section of fixed keys merges too.
    cfg = load_config(config, ["evaluator.metric_thresholds.accuracy=0.5", "trainer={max_steps: 3}"])
    assert cfg.evaluator.decisions.metric_thresholds == {"accuracy": 0.5, "reward": 0.85}
    assert (cfg.trainer.max_steps, cfg.trainer.enable_progress_bar) == (3, False)
