"""How the commands talk to a person: one-line errors with exit status 2, our log lines only."""

from __future__ import annotations

import logging
import os
import re
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from areal_lightning.tracking.console_log import LineHandler

if TYPE_CHECKING:
    from lightning.pytorch.loggers import Logger

    from areal_lightning.app.config import Config

USAGE_ERROR = 2
"""Exit status of a command refused before any work: bad config, bad checkpoint, bad arguments."""
ROUNDS_FAILED = 1
"""Exit status of a command that ran but some of whose evaluation rounds failed."""

log = logging.getLogger("areal_lightning")


def task_summary_metrics(cfg: Config) -> tuple[str, ...]:
    """The metrics each round's console line shows for the config's task: what the task names
    (episodes: success within t turns and turns).

    Example:
        >>> from areal_lightning.app.config import load_config
        >>> task_summary_metrics(load_config(None, ["eval_sets.easy.size=5"]))
        ('accuracy', 'reward/mean')
    """
    from areal_lightning.app.sections.task import TaskName

    if cfg.episodes is not None:
        from areal_lightning.rl.episodes.metrics import EPISODE_SUMMARY_METRICS

        return EPISODE_SUMMARY_METRICS
    if cfg.task.name is TaskName.CODE:
        from areal_lightning.tasks.code import CodeTask

        return CodeTask.summary_metrics
    from areal_lightning.tasks.arithmetic import ArithmeticTask
    from areal_lightning.tasks.math import MathTask

    return (MathTask if cfg.task.name is TaskName.MATH else ArithmeticTask).summary_metrics


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


LIGHTNING_NOISE = r"Tip: .*(litlogger|litmodels)|^(GPU|TPU|HPU) available: |^LOCAL_RANK: \d+ - CUDA_VISIBLE_DEVICES"
"""Lightning's tips to install its cloud products, and its accelerator lines, at every fit."""
NOISE_FROM = {
    "lightning.fabric.utilities.rank_zero": LIGHTNING_NOISE,
    "lightning.pytorch.utilities.rank_zero": LIGHTNING_NOISE,
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
    `NOISE_FROM` off, W&B silent (`wandb_where` says where its run is), no weight-loading bars of
    transformers; our own lines and Lightning's on stderr, each on a line of its own (never glued
    to the progress bar), without prefixes. A variable the user set wins."""
    from lightning.pytorch.utilities import disable_possible_user_warnings

    # W&B's banner and its 30-line summary at the end; its failures still reach our log.
    os.environ.setdefault("WANDB_SILENT", "true")
    # Read by transformers (through huggingface_hub) when it is imported: its "Loading weights" bars.
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    if "transformers" in sys.modules and os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "1":
        sys.modules["transformers"].utils.logging.disable_progress_bar()

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


def wandb_where(loggers: Sequence[Logger]) -> str | None:
    """One line on where each started W&B run among `loggers` is: its page, or for an offline run its
    directory and how to upload it; None without one. The commands print it, as W&B is silent there.

    Example:
        >>> wandb_where([]) is None
        True
    """
    from lightning.pytorch.loggers import WandbLogger

    from areal_lightning.tracking.wandb_logger import started_run

    lines = []
    for logger in loggers:
        run = started_run(logger) if isinstance(logger, WandbLogger) else None
        if run is None:
            continue
        if run.offline:
            where = run.settings.sync_dir
            lines.append(f"W&B: offline run in {where}; upload it with: wandb sync {where}")
        else:
            lines.append(f"W&B: {run.url}")
    return "\n".join(lines) or None
