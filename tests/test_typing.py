"""The public API's types catch a wrong `evaluate_fn` before anything runs (what a user's IDE shows).

mypy checks `tests/typecheck/check_public_api.py` (correct uses: no error) and a file of wrong uses
written here (each must be reported on its line, with the words in its `# expect:` comment). It runs
from the repository root, so it reads the project's mypy settings and reuses the cache `make lint`
leaves.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mypy")

pytestmark = pytest.mark.process

ROOT = Path(__file__).resolve().parents[1]
CORRECT = ROOT / "tests" / "typecheck" / "check_public_api.py"
TIMEOUT_S = 600  # a cold mypy cache analyses torch and Lightning: about 90 s on 2 CPU cores

WRONG = """\
from collections.abc import Sequence
from typing import Any

import torch

from areal_lightning import EvalBatch, EvalContext, EvalSet, EvaluationCallback, run_round


def two_arguments(module: Any, batches: Sequence[EvalBatch]) -> dict[str, float]:
    return {}


def returns_a_number(module: Any, batches: Sequence[EvalBatch], ctx: EvalContext) -> float:
    return 0.0


def batches_of_strings(module: Any, batches: list[str], ctx: EvalContext) -> dict[str, float]:
    return {}


linear, sets = torch.nn.Linear(1, 1), [EvalSet("easy", [1])]
EvaluationCallback({"easy": [1]}, two_arguments)  # expect: Argument 2 to "EvaluationCallback"
EvaluationCallback({"easy": [1]}, returns_a_number)  # expect: Argument 2 to "EvaluationCallback"
run_round(linear, sets, batches_of_strings, seed=0, global_step=0, epoch=0)  # expect: Argument 3 to "run_round"
EvaluationCallback({"easy": [1]}, lambda m, b, ctx: {}, freq_stepz=3)  # expect: keyword argument "freq_stepz"
"""


def _mypy(*files: Path) -> list[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-error-summary", "--hide-error-context", *map(str, files)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr  # 2: mypy itself failed
    return [line for line in proc.stdout.splitlines() if ": error: " in line]


def test_a_wrong_evaluate_fn_is_a_type_error_and_correct_uses_are_not(tmp_path: Path) -> None:
    # A name of its own each run: mypy's cache would otherwise answer for a file of the same
    # module name and contents from an earlier run, with that run's path.
    wrong = tmp_path / f"wrong_uses_{tmp_path.name.replace('-', '_')}_{os.getpid()}.py"
    wrong.write_text(WRONG)
    expected = {n: line.split("# expect: ")[1] for n, line in enumerate(WRONG.splitlines(), 1) if "# expect: " in line}
    errors = _mypy(CORRECT, wrong)
    assert [e for e in errors if not e.startswith(str(wrong))] == []  # the correct uses, and the package, are clean
    by_line = {int(m.group(1)): e for e in errors if (m := re.match(rf"{re.escape(str(wrong))}:(\d+): ", e))}
    assert sorted(by_line) == sorted(expected), errors  # every wrong use is reported, and nothing else
    for n, words in expected.items():
        assert words in by_line[n], by_line[n]
    # A signature mismatch names the protocol, so the user sees what is expected.
    assert all("EvaluateFn" in by_line[n] for n, words in expected.items() if words.startswith("Argument"))
