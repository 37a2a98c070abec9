"""Our log lines on a terminal: each on a line of its own, never glued to a progress bar.

A plain `logging.StreamHandler` holds the stderr it was created with, so a line written while
Lightning's progress bar is drawn lands after the bar's last characters. `LineHandler` writes
through ``tqdm.write`` to the stderr of the moment: a TQDM bar is cleared and redrawn below the
line, and a Rich bar (which redirects stderr while it is live) prints it above itself.
"""

from __future__ import annotations

import logging
import math
import os
import re
import sys
from collections.abc import Mapping, Sequence

from tqdm import tqdm

PACKAGE_LOGGER = "areal_lightning"

DEFAULT_COLUMNS = 80
"""The width of a terminal that reports none."""
CONTINUATION = "  "
"""The indent of a round line's continuation lines, when it is wrapped to the terminal's width."""


class LineHandler(logging.Handler):
    """Writes each record as one line on the current ``sys.stderr``, around any progress bar.

    Example:
        >>> handler = LineHandler()
        >>> handler.setFormatter(logging.Formatter("%(message)s"))
    """

    def emit(self, record: logging.LogRecord) -> None:
        try:
            tqdm.write(self.format(record), file=sys.stderr)
        except Exception:  # noqa: BLE001 - logging never raises into the caller
            self.handleError(record)


def show_package_lines() -> None:
    """Shows the package's INFO lines (one per round) when nothing else would, as Lightning does for
    its own logger: a `LineHandler` on the ``areal_lightning`` logger when neither it nor the root
    logger has a handler. A program that configured logging keeps its own setup."""
    logger = logging.getLogger(PACKAGE_LOGGER)
    if logger.handlers or logging.getLogger().handlers:
        return
    handler = LineHandler()
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger.addHandler(handler)
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.INFO)


def _pattern(name: str) -> re.Pattern[str]:
    # `*` stands for one name part without a slash: pass@* is pass@1, pass@10, never pass@10/stderr.
    return re.compile("[^/]*".join(re.escape(part) for part in name.split("*")) + r"\Z")


def summary_names(metrics: Mapping[str, float], summary: Sequence[str]) -> list[str]:
    """The names of `metrics` a round line shows: those `summary` names, in its order; in a name,
    ``*`` stands for one name part (``pass@*``: every pass@k, never ``pass@4/stderr``), k ascending.

    Example:
        >>> metrics = {"pass@10": 0.5, "pass@1": 0.2, "pass@1/stderr": 0.1, "code/passed": 3.0}
        >>> summary_names(metrics, ["pass@*", "code/passed"])
        ['pass@1', 'pass@10', 'code/passed']
    """
    out: list[str] = []
    for name in summary:
        pattern = _pattern(name)
        found = [k for k in metrics if pattern.match(k) and k not in out]
        out.extend(sorted(found, key=lambda k: [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", k)]))
    return out


def _value(name: str, value: float) -> str:
    # A count (code/passed=41) reads as one; a share never exceeds 1, and a mean keeps its decimals.
    if math.isfinite(value) and value == int(value) and abs(value) > 1 and "mean" not in name:
        return str(int(value))
    return f"{value:.3f}"


def round_line(head: str, sets: Mapping[str, Mapping[str, float]], summary: Sequence[str], width: int | None) -> str:
    """The console's line for a round: `head`, then each eval set's `summary` metrics
    (`summary_names`); wrapped to `width` columns at metric boundaries (a set's name stays with its
    first metric, continuation lines indented), or one line when `width` is None.

    Example:
        >>> sets = {"easy": {"accuracy": 0.5, "reward/mean": 0.5}, "hard": {"accuracy": 0.125}}
        >>> print(round_line("evaluation at step 8 (end):", sets, ["accuracy", "reward/mean"], None))
        evaluation at step 8 (end): easy: accuracy=0.500 reward/mean=0.500 | hard: accuracy=0.125
        >>> print(round_line("evaluation at step 8 (end):", sets, ["accuracy", "reward/mean"], 48))
        evaluation at step 8 (end): easy: accuracy=0.500
          reward/mean=0.500 | hard: accuracy=0.125
    """
    words = [head]
    for i, (name, metrics) in enumerate(sets.items()):
        shown = [f"{k}={_value(k, metrics[k])}" for k in summary_names(metrics, summary)] or ["(none of its metrics)"]
        words.append(("| " if i else "") + f"{name}: {shown[0]}")
        words.extend(shown[1:])
    if width is None:
        return " ".join(words)
    lines = [words[0]]
    for word in words[1:]:
        if len(lines[-1]) + 1 + len(word) <= width:
            lines[-1] += " " + word
        else:
            lines.append(CONTINUATION + word)
    return "\n".join(lines)


def terminal_width() -> int | None:
    """The columns of the terminal on stderr (``COLUMNS`` when set), None when stderr is no terminal
    (a log file keeps each round on one line, even where ``COLUMNS`` is set).

    Example:
        >>> width = terminal_width()
        >>> width is None or width > 0
        True
    """
    try:
        if not sys.stderr.isatty():  # a log file, whatever COLUMNS says (make and CI export it)
            return None
        columns = os.environ.get("COLUMNS", "")
        if columns.isdigit() and int(columns) > 0:
            return int(columns)
        # A terminal that reports no size (a pty made by `script`) is 80 wide, as Rich takes it.
        return os.get_terminal_size(sys.stderr.fileno()).columns or DEFAULT_COLUMNS
    except (AttributeError, OSError, ValueError):  # a stream without a file descriptor
        return None
