"""Lightning callbacks: the evaluation callback and its pure scheduler."""

from areal_lightning.callbacks.evaluation import EvaluationCallback
from areal_lightning.callbacks.thresholds import Alert, ThresholdMonitor
from areal_lightning.callbacks.trigger import (
    CAUSE_BEFORE_TRAIN,
    CAUSE_END,
    CAUSE_EPOCHS,
    CAUSE_SECS,
    CAUSE_STEPS,
    HybridTrigger,
)

__all__ = [
    "EvaluationCallback", "HybridTrigger", "ThresholdMonitor", "Alert",
    "CAUSE_BEFORE_TRAIN", "CAUSE_END", "CAUSE_EPOCHS", "CAUSE_SECS", "CAUSE_STEPS",
]
