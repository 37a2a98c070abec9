"""`make demo`'s own command, as a user runs it in a terminal: the progress bar on, every default of
the main job's config (W&B offline, CSV, checkpoints), only the output directory moved to tmp.

It is the user's first contact with the project: every scheduled round (before training, every
100 steps, at the end) must yield metrics, `easy` accuracy must rise from chance to >= 0.8, no
round may fail, and the plot must be drawn. About 2-4 minutes on 2 CPU cores.
"""

from __future__ import annotations

import contextlib
import os
import pty
import re
import shlex
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from procs import kill_group

from areal_lightning.tracking.history import eval_rows, event_rows, read_history

ROOT = Path(__file__).resolve().parents[1]
DEMO_TIMEOUT_S = 1500
SCHEDULED_STEPS = list(range(0, 801, 100))
START_MAX_ACCURACY = 0.3
END_MIN_ACCURACY = 0.8


def demo_command() -> list[str]:
    """The `demo` target's command line in the Makefile, with `$(VENV)/bin/` as this interpreter's."""
    makefile = (ROOT / "Makefile").read_text()
    line = re.search(r"^demo:.*\n\t(?P<cmd>.+)$", makefile, re.MULTILINE)
    assert line is not None, "the Makefile has no demo target"
    argv = shlex.split(line["cmd"])
    assert argv[0] == "$(VENV)/bin/areal-lightning", argv
    return [str(Path(sys.executable).parent / "areal-lightning"), *argv[1:]]


def run_on_a_terminal(argv: list[str], timeout: float, cwd: Path) -> tuple[int, str]:
    """Runs `argv` with stdout and stderr on a pseudo-terminal (as a shell would), in its own process
    group that a timeout ends as a whole; returns (exit status, what the terminal showed)."""
    controller, terminal = pty.openpty()
    proc = subprocess.Popen(
        argv, cwd=cwd, stdin=subprocess.DEVNULL, stdout=terminal, stderr=terminal, start_new_session=True
    )
    os.close(terminal)
    shown: list[bytes] = []

    def read() -> None:
        with contextlib.suppress(OSError):  # EIO once the command and its children closed the terminal
            while chunk := os.read(controller, 65536):
                shown.append(chunk)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        status = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        pytest.fail(f"`{shlex.join(argv)}` ran past {timeout} s:\n" + b"".join(shown).decode(errors="replace")[-3000:])
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 9)  # nothing the command started outlives the test
        reader.join(timeout=10)
        os.close(controller)
    return status, b"".join(shown).decode(errors="replace")


@pytest.mark.slow
@pytest.mark.timeout(DEMO_TIMEOUT_S + 60)
def test_make_demo_records_every_scheduled_round_and_learns(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    status, shown = run_on_a_terminal([*demo_command(), f"output_dir={out}"], DEMO_TIMEOUT_S, ROOT)
    assert status == 0, shown[-3000:]
    assert "it/s" in shown or "s/it" in shown  # the progress bar was on, as in a terminal

    records = read_history(out)
    assert event_rows(records, "error") == []
    rows = eval_rows(records)
    for dataset in ("easy", "hard"):
        steps = sorted({r["step"] for r in rows if r["dataset"] == dataset})
        assert set(SCHEDULED_STEPS) <= set(steps), (dataset, steps)
        assert all("accuracy" in r["metrics"] for r in rows if r["dataset"] == dataset)
    easy = {r["step"]: r["metrics"]["accuracy"] for r in rows if r["dataset"] == "easy"}
    assert easy[0] <= START_MAX_ACCURACY, easy
    assert easy[max(easy)] >= END_MIN_ACCURACY, easy
    assert (out / "eval_accuracy.png").stat().st_size > 0
    assert "rounds failed" not in shown
