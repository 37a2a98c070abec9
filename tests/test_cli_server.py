"""tests/cli_server.py, how the docs runners run a documented command: in the caller's directory and
environment, with the command's own exit status and output, and a timeout that ends its whole
process group, leaving no process behind."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest
from cli_server import run_cli

CONFIG = Path(__file__).resolve().parents[1] / "areal_lightning" / "app" / "configs" / "arithmetic_grpo.yaml"


@pytest.mark.process
def test_the_command_runs_where_and_with_what_the_caller_says_and_reports_its_status(tmp_path: Path) -> None:
    env = dict(os.environ)
    done = run_cli(["example", "arithmetic_grpo", "-o", "mine.yaml"], 120, tmp_path, env)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "mine.yaml").read_text() == CONFIG.read_text()
    assert done.cpu_s > 0
    bad = run_cli(["fit", "-c", "absent.yaml"], 120, tmp_path, env)
    assert bad.returncode == 2 and "absent.yaml" in bad.stderr, (bad.returncode, bad.stderr)


@pytest.mark.process
@pytest.mark.waits  # 20 s of the command's timeout
def test_a_command_past_its_timeout_is_ended_with_its_group(tmp_path: Path) -> None:
    (tmp_path / "ckpts").mkdir()
    (tmp_path / "run.yaml").write_text(CONFIG.read_text())
    argv = ["evaluate", "-c", "run.yaml", "--watch", "ckpts", "--poll-secs", "0.2", "logger.wandb.mode=disabled"]
    started = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        run_cli(argv, 20, tmp_path, dict(os.environ))
    assert time.monotonic() - started < 120
    assert _processes_in(tmp_path) == []


def _processes_in(directory: Path) -> list[str]:
    """The processes whose current directory is `directory` (the command's, and whatever it started)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and Path(os.readlink(proc / "cwd")) == directory:
                found.append(proc.name)
        except OSError:  # gone, or another user's
            continue
    return found
