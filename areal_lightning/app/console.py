"""How the commands talk to a person: one-line errors with exit status 2, our log lines only."""

from __future__ import annotations

import logging
import sys
import warnings
from pathlib import Path

USAGE_ERROR = 2
"""Exit status of a command refused before any work: bad config, bad checkpoint, bad arguments."""
ROUNDS_FAILED = 1
"""Exit status of a command that ran but some of whose evaluation rounds failed."""

log = logging.getLogger("areal_lightning")


def fail(message: str) -> int:
    """Prints ``areal-lightning: error: <message>`` to stderr; returns `USAGE_ERROR`."""
    print(f"areal-lightning: error: {message}", file=sys.stderr)
    return USAGE_ERROR


def report_rounds(failed: int, total: int, history: Path) -> int:
    """The exit status of a command that ran `total` evaluation rounds, `failed` of which failed:
    0 when none failed, else `ROUNDS_FAILED` after one line on stderr that says where to look.

    Example:
        >>> report_rounds(0, 9, Path("eval_history.jsonl"))
        0
    """
    if not failed:
        return 0
    print(f"areal-lightning: {failed} of {total} rounds failed; see {history}", file=sys.stderr, flush=True)
    return ROUNDS_FAILED


def quiet_lightning() -> None:
    """Lightning's possible-user warnings off, and our own log lines on stderr without prefixes."""
    from lightning.pytorch.utilities import disable_possible_user_warnings

    # A CPU job needs no loader workers: each prompt batch is built in microseconds.
    disable_possible_user_warnings()
    # Lightning's tip that its `litlogger` is installable is a plain UserWarning: no category to filter on.
    warnings.filterwarnings("ignore", message=r".*litlogger.*")
    if not log.handlers:  # our own lines only: Lightning's loggers keep their handlers
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False
