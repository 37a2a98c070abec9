"""Lightning callbacks: the evaluation callback and its pure scheduler.

`EvaluationCallback` loads Lightning on first use (PEP 562); the trigger, the thresholds and the
option Enums are pure Python and import without it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from areal_lightning.callbacks.options import DEFAULT_TABLE_ROWS, ErrorPolicy, EvalMode, OnBusy, ThresholdAction
from areal_lightning.callbacks.thresholds import Alert, ThresholdMonitor
from areal_lightning.callbacks.trigger import Cause, HybridTrigger

if TYPE_CHECKING:  # type checkers see the class; at run time `__getattr__` loads it (and Lightning)
    from areal_lightning.callbacks.evaluation_callback import EvaluationCallback

__all__ = [
    "DEFAULT_TABLE_ROWS",
    "Alert",
    "Cause",
    "ErrorPolicy",
    "EvalMode",
    "EvaluationCallback",
    "HybridTrigger",
    "OnBusy",
    "ThresholdAction",
    "ThresholdMonitor",
]


def __getattr__(name: str) -> Any:
    if name != "EvaluationCallback":
        raise AttributeError(f"module 'areal_lightning.callbacks' has no attribute {name!r}")
    value = importlib.import_module("areal_lightning.callbacks.evaluation_callback").EvaluationCallback
    globals()[name] = value
    return value
