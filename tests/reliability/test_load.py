"""A smaller `benchmarks/load_rounds.py`: 300 steps with a round every 10 leave exactly one history
record per eval set per round, in order (the benchmark's 10,000 steps report memory as well)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from procs import run_in_group

from areal_lightning.tracking.history import eval_rows, read_history

pytestmark = pytest.mark.process

BENCHMARK = Path(__file__).resolve().parents[2] / "benchmarks" / "load_rounds.py"


def test_300_steps_with_a_round_every_10_record_exactly_60_rounds(tmp_path: Path) -> None:
    proc = run_in_group(
        [sys.executable, str(BENCHMARK), "--steps", "300", "--every", "10", "--json", "--out", str(tmp_path)],
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.splitlines()[-1])
    assert (result["records"], result["exact"]) == (60, True)
    rows = eval_rows(read_history(tmp_path))  # read back here too, not only the script's own count
    assert [(r["step"], r["dataset"]) for r in rows] == [(s, d) for s in range(10, 301, 10) for d in ("easy", "hard")]
    assert {r["num_prompts"] for r in rows if r["dataset"] == "hard"} == {8}
