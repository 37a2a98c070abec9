"""Where evaluation results go: the eval history file, every Trainer logger, and Weights & Biases."""

from typing import TYPE_CHECKING

from areal_lightning.lazy import lazy_exports as _lazy_exports
from areal_lightning.tracking.history import (
    HISTORY_FILENAME,
    EvalHistory,
    TruncatedHistoryWarning,
    drop_superseded,
    eval_rows,
    event_rows,
    history_path,
    is_standalone,
    new_run_id,
    read_history,
    split_runs,
)
from areal_lightning.tracking.records import EVAL_MODES, EVENT_KINDS, RECORD_SOURCES, eval_record, event_record

__all__ = [
    "EVAL_MODES",
    "EVENT_KINDS",
    "HISTORY_FILENAME",
    "RECORD_SOURCES",
    "EvalHistory",
    "TruncatedHistoryWarning",
    "drop_superseded",
    "eval_record",
    "eval_rows",
    "event_record",
    "event_rows",
    "history_path",
    "is_standalone",
    "new_run_id",
    "read_history",
    "split_runs",
]

if TYPE_CHECKING:  # type checkers see these; at run time `__getattr__` loads them on first use
    from areal_lightning.tracking.loggers import (
        eval_metric_dict as eval_metric_dict,
        log_eval_results as log_eval_results,
        send_alert as send_alert,
    )
    from areal_lightning.tracking.wandb_logger import (
        EVAL_STEP_KEY as EVAL_STEP_KEY,
        SafeWandbLogger as SafeWandbLogger,
        finish_wandb as finish_wandb,
    )

# The logger fan-out and the W&B logger import Lightning: loaded on first use (PEP 562), so
# reading a history does not pay for it.
_LAZY_EXPORTS = {
    "EVAL_STEP_KEY": "areal_lightning.tracking.wandb_logger",
    "eval_metric_dict": "areal_lightning.tracking.loggers",
    "finish_wandb": "areal_lightning.tracking.wandb_logger",
    "log_eval_results": "areal_lightning.tracking.loggers",
    "send_alert": "areal_lightning.tracking.loggers",
    "SafeWandbLogger": "areal_lightning.tracking.wandb_logger",
}
__all__ += sorted(_LAZY_EXPORTS)


__getattr__, __dir__ = _lazy_exports(__name__, _LAZY_EXPORTS, globals())
