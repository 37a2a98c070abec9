"""How the commands talk to a person: one-line errors with exit status 2, our log lines only."""

from __future__ import annotations

import logging
import re
import sys
import warnings
from pathlib import Path

from areal_lightning.tracking.console_log import LineHandler

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


NOISE_FROM = {
    # Lightning's tips to install its cloud products, at every fit.
    "lightning.fabric.utilities.rank_zero": r"Tip: .*(litlogger|litmodels)",
    "lightning.pytorch.utilities.rank_zero": r"Tip: .*(litlogger|litmodels)",
    # vLLM at every weight push: a rotary embedding has no weights to load.
    "vllm.model_executor.model_loader.reload.layerwise": r"RotaryEmbedding: Failed to load weights",
}
"""Third-party log lines that are not the user's business: logger name -> message pattern. The
commands drop them; the library never hides anything (a Python user sees all of them)."""


class _DropMatching(logging.Filter):
    def __init__(self, pattern: str) -> None:
        super().__init__()
        self.pattern = re.compile(pattern)

    def filter(self, record: logging.LogRecord) -> bool:
        return not self.pattern.search(record.getMessage())


def quiet_lightning() -> None:
    """The commands' console: Lightning's possible-user warnings and the third-party noise of
    `NOISE_FROM` off; our own lines and Lightning's on stderr, each on a line of its own (never
    glued to the progress bar), without prefixes."""
    from lightning.pytorch.utilities import disable_possible_user_warnings

    # A CPU job needs no loader workers: each prompt batch is built in microseconds.
    disable_possible_user_warnings()
    # torch deprecated LeafSpec, and Lightning 2.6's _pytree still checks for it (FutureWarning).
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)", category=FutureWarning)
    for name, pattern in NOISE_FROM.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropMatching) for f in logger.filters):
            logger.addFilter(_DropMatching(pattern))
    for name in ("lightning.pytorch", "lightning.fabric"):  # Lightning's own handlers write like ours
        lightning_log = logging.getLogger(name)
        for handler in list(lightning_log.handlers):
            if type(handler) is logging.StreamHandler:
                lines = LineHandler(handler.level)
                lines.setFormatter(handler.formatter)
                lightning_log.removeHandler(handler)
                lightning_log.addHandler(lines)
    if not log.handlers:  # our own lines only: Lightning's loggers keep their handlers
        handler = LineHandler()  # never glued to the progress bar's last line
        handler.setFormatter(logging.Formatter("%(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False
