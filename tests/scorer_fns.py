"""Scorers for `SafeScorer`'s tests, in a module of their own that imports nothing heavy: each
scorer worker imports the scorer's module, and a worker is started again after every hang or
death the tests provoke, so a test module that imports torch would cost seconds per start."""

from __future__ import annotations

import os
import time


def exact(completion: str, answer: str) -> float | None:
    """1 for a match, 0 otherwise; None (unparseable) for an empty completion; hangs on "hang",
    raises on "raise", kills its process on "die"."""
    if completion == "hang":
        while True:
            time.sleep(60)
    if completion == "raise":
        raise ZeroDivisionError("bad expression")
    if completion == "die":
        os._exit(3)
    if not completion:
        return None
    return 1.0 if completion == answer else 0.0
