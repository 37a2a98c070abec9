"""The CLI: configuration mistakes exit with status 2 and one readable paragraph, no traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from procs import run_in_group

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
