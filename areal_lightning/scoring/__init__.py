"""Running reward functions: one sample's `Score` and `SafeScorer`, a scorer that cannot hang the run.

A task scores a completion against its answer; `Score` says what it got and how (``ok``,
``timeout``, ``parse_failure``, ``error``). `SafeScorer` runs a reward function in worker processes
with a per-call time limit. Pure Python (no torch): tasks and the app's config import it freely.
The counts of failed samples are a metric: `metrics.ScoringMetric`.

The code sandbox: `run_program` runs one untrusted program, `grade_program` runs a program against
a problem's tests; each returns a `SandboxResult` whose `status` is a `ProgramStatus`. `Sandbox`
is the pool of worker processes behind them (docs/code_evaluation.md).
"""

from areal_lightning.scoring.safe_scorer import SafeScorer, ScorerFailingError
from areal_lightning.scoring.sandbox import (
    ProgramStatus,
    Sandbox,
    SandboxLimits,
    SandboxResult,
    grade_program,
    program_with_tests,
    run_program,
)
from areal_lightning.scoring.score import DEFAULT_TIMEOUT_S, Score, ScoreLabels, ScoreStatus

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "ProgramStatus",
    "SafeScorer",
    "Sandbox",
    "SandboxLimits",
    "SandboxResult",
    "Score",
    "ScoreLabels",
    "ScoreStatus",
    "ScorerFailingError",
    "grade_program",
    "program_with_tests",
    "run_program",
]
