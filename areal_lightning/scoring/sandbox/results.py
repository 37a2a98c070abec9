"""What the code sandbox says about a program: its `ProgramStatus`, its `SandboxLimits`, its `SandboxResult`.

Exported by `scoring.sandbox`; the pool itself is in `pool`. Pure standard library.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import Enum
from typing import Any

from areal_lightning.errors import ArgumentError


class ProgramStatus(str, Enum):
    """How a program ended: exactly one per program."""

    PASSED = "passed"
    """It ran to its end (for a graded program: every test passed)."""
    FAILED = "failed"
    """It raised an exception (a failed assert, a `SystemExit`) that it did not catch."""
    TIMEOUT = "timeout"
    """It ran past its wall-clock or CPU limit and was killed."""
    CRASHED = "crashed"
    """It ended otherwise: killed by a signal, or exited (``os._exit``) before its end."""
    SYNTAX_ERROR = "syntax_error"
    """It does not compile."""
    OUT_OF_MEMORY = "out_of_memory"
    """It raised `MemoryError` (its address-space limit)."""


@dataclass(frozen=True)
class SandboxLimits:
    """What one program may use. Defaults suit test-graded programming problems.

    Raises:
        ArgumentError: for a limit that is not a positive number (integer where noted).
    """

    wall_s: float = 10.0
    """Wall-clock seconds, set-up excluded; then every process of the program is killed (``timeout``)."""
    cpu_s: int = 10
    """CPU seconds (RLIMIT_CPU), an integer."""
    memory_bytes: int = 1 << 30
    """Address space of each process (RLIMIT_AS); past it allocations fail (``out_of_memory``)."""
    max_processes: int = 4
    """Processes the program may have at once, itself included (RLIMIT_NPROC, counted per program
    where a user namespace holds; docs/code_evaluation.md)."""
    max_file_bytes: int = 8 << 20
    """Largest file it may write (RLIMIT_FSIZE), its captured output included."""
    max_open_files: int = 64
    """Open file descriptors (RLIMIT_NOFILE)."""
    max_output_bytes: int = 64 << 10
    """stdout and stderr kept in `SandboxResult.output` (the rest is dropped, `truncated` set)."""
    max_disk_bytes: int = 64 << 20
    """Space of the temporary directory, a tmpfs of each worker's own where the kernel allows it
    (set per `Sandbox`: a `run_many` with other limits keeps its sandbox's)."""

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            whole = f.type in (int, "int")
            if isinstance(value, bool) or not isinstance(value, int if whole else (int, float)) or not value > 0:
                raise ArgumentError(
                    "SandboxLimits", f.name, value, "a positive integer" if whole else "a positive number"
                )

    def as_job(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class SandboxResult:
    """How one program ended, and what it printed.

    Attributes:
        status: its `ProgramStatus`.
        output: stdout and stderr together, at most `SandboxLimits.max_output_bytes` (decoded, bad
            bytes replaced); a failure's traceback is here.
        truncated: whether output was dropped.
        exit_code: the program process's exit code, or None when a signal ended it.
        signal: the signal that ended it, or None.
        wall_s: seconds from its start to its end.
        error: the program's uncaught exception in one line (``AssertionError``,
            ``OSError: [Errno 27] File too large``), or None.
        limit: for a ``timeout``, the `SandboxLimits` field that ended it (``"wall_s"`` or
            ``"cpu_s"``; None when the worker itself stopped answering).
        isolation: the `Isolation` protections that held (docs/code_evaluation.md).
    """

    status: ProgramStatus
    output: str = ""
    truncated: bool = False
    exit_code: int | None = None
    signal: int | None = None
    wall_s: float = 0.0
    error: str | None = None
    limit: str | None = None
    isolation: tuple[str, ...] = ()

    @property
    def passed(self) -> bool:
        return self.status is ProgramStatus.PASSED

    @classmethod
    def from_report(cls, report: dict[str, Any]) -> SandboxResult:
        return cls(
            status=ProgramStatus(report["status"]),
            output=report.get("output") or "",
            truncated=bool(report.get("truncated", False)),
            exit_code=report.get("exit_code"),
            signal=report.get("signal"),
            wall_s=float(report.get("wall_s", 0.0)),
            error=report.get("error"),
            limit=report.get("limit"),
            isolation=tuple(report.get("isolation", ())),
        )
