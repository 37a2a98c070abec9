"""Lightning callbacks: the evaluation callback and its pure scheduler.

`EvaluationCallback` loads Lightning on first use (PEP 562); the trigger, the thresholds and the
option Enums are pure Python and import without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from areal_lightning.callbacks.choices import DEFAULT_TABLE_ROWS, ErrorPolicy, EvalMode, OnBusy, ThresholdAction
from areal_lightning.callbacks.thresholds import Alert, ThresholdMonitor
from areal_lightning.callbacks.trigger import Cause, HybridTrigger
from areal_lightning.lazy import lazy_exports as _lazy_exports

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


__getattr__, __dir__ = _lazy_exports(
    __name__, {"EvaluationCallback": "areal_lightning.callbacks.evaluation_callback"}, globals()
)
