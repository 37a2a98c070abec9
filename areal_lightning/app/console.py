"""How the commands talk to a person: one-line errors with exit status 2, our log lines only."""

from __future__ import annotations

import logging
import sys
import warnings

USAGE_ERROR = 2
"""Exit status of a command refused before any work: bad config, bad checkpoint, bad arguments."""

log = logging.getLogger("areal_lightning")


def fail(message: str) -> int:
    """Prints ``areal-lightning: error: <message>`` to stderr; returns `USAGE_ERROR`."""
    print(f"areal-lightning: error: {message}", file=sys.stderr)
    return USAGE_ERROR


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
