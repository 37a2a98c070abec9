"""Our log lines on a terminal: each on a line of its own, never glued to a progress bar.

A plain `logging.StreamHandler` holds the stderr it was created with, so a line written while
Lightning's progress bar is drawn lands after the bar's last characters. `LineHandler` writes
through ``tqdm.write`` to the stderr of the moment: a TQDM bar is cleared and redrawn below the
line, and a Rich bar (which redirects stderr while it is live) prints it above itself.
"""

from __future__ import annotations

import logging
import sys

from tqdm import tqdm

PACKAGE_LOGGER = "areal_lightning"


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
