"""The code sandbox: runs untrusted Python programs and says how each ended.

`run_program(source)` runs one program; `grade_program(program, tests, entry_point)` runs a
program against a problem's tests; both return a `SandboxResult` whose `status` is one
`ProgramStatus`. `Sandbox` (`pool`) is the pool behind them: pre-started worker processes
(`worker`) that fork each program (`processes`) from an interpreter already running, under
resource limits (`SandboxLimits`, `results`), a wall clock, and the isolation the kernel allows
(`isolation.Isolation`). docs/code_evaluation.md says what holds where.

A program never runs in the caller's process, and nothing of the caller's environment reaches it.
Pure standard library: the plugin and every task may import it.
"""

from areal_lightning.scoring.sandbox.pool import Sandbox, grade_program, program_with_tests, run_program
from areal_lightning.scoring.sandbox.results import ProgramStatus, SandboxLimits, SandboxResult

__all__ = [
    "ProgramStatus",
    "Sandbox",
    "SandboxLimits",
    "SandboxResult",
    "grade_program",
    "program_with_tests",
    "run_program",
]
