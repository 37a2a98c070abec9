"""Ctrl-C and SIGTERM during `fit`: finish the current training step, checkpoint it, stop.

The first SIGINT or SIGTERM asks for a stop. The step in progress finishes (its evaluation round
and its periodic checkpoint included), then `StopOnSignal` writes a checkpoint of that step and
ends training the way Lightning ends it for that signal: ``KeyboardInterrupt`` for SIGINT
(Lightning's graceful shutdown), Lightning's ``SIGTERMException`` for SIGTERM. Every callback's
``on_exception`` runs, the eval history is complete (each record is flushed when written), and
``fit`` finishes W&B, prints the command that resumes the run and exits with 128 + the signal's
number (130, 143), as a shell reports a process a signal ended.

A checkpoint taken mid-step could hold half an optimizer update or a round's state half
concluded, so the stop waits for the step's end. A second signal stops at once, without a new
checkpoint: the latest checkpoint on disk is then the one to resume from.
"""

from __future__ import annotations

import logging
import signal
import threading
from pathlib import Path
from types import FrameType
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Checkpoint
from lightning.pytorch.utilities.exceptions import SIGTERMException
from typing_extensions import override

from areal_lightning.app.final_checkpoint import save_atomically

log = logging.getLogger("areal_lightning")

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
"""The signals that stop `fit` at the end of the current step."""
SIGNAL_EXIT_BASE = 128
"""A process that a signal ended exits with 128 + the signal's number (POSIX shells)."""


def signal_exit_status(sig: signal.Signals) -> int:
    """130 for SIGINT, 143 for SIGTERM.

    Example:
        >>> signal_exit_status(signal.SIGINT), signal_exit_status(signal.SIGTERM)
        (130, 143)
    """
    return SIGNAL_EXIT_BASE + int(sig)


class StopOnSignal(Checkpoint):
    """Turns the first SIGINT or SIGTERM into a checkpoint of the current step and a stop.

    A `Checkpoint` so that Lightning runs its ``on_train_batch_end`` after every other callback's,
    `ModelCheckpoint` included: the step is complete when it saves. Every rank checks for a stop
    request at every step end; under DDP the ranks agree (any rank's signal stops all of them at
    the same step, and every rank takes part in the checkpoint's save).

    Args:
        path: where the checkpoint goes (written beside, then renamed: a kill during the save
            leaves the previous file whole).

    Example:
        >>> stop = StopOnSignal("runs/demo/checkpoints/last.ckpt")
        >>> stop.requested is None and stop.saved_step is None
        True
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.requested: signal.Signals | None = None
        """The first stop signal received, or None."""
        self.stopped_by: signal.Signals | None = None
        """The signal that ended training (Lightning's ``on_exception`` saw its exception), or None."""
        self.saved_step: int | None = None
        """The global step of the checkpoint written on the stop, or None when none was written."""

    @override
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Python delivers signals to the main thread only, and only there may a handler be set.
        # Set after Lightning's signal connector took note of the process's handlers (it replaces
        # its own SIGTERM handler here): its teardown, on every way out of `fit`, restores them.
        if threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS:
                signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        sig = signal.Signals(signum)
        if self.requested is None:
            self.requested = sig
            log.warning(
                "%s received: training stops at the end of the current step, with a checkpoint of it "
                "(its evaluation round, if one runs, finishes first); send %s again to stop at once, "
                "without a new checkpoint",
                sig.name,
                sig.name,
            )
            return
        # A second signal: stop now, wherever the step is (Lightning runs on_exception either way).
        if sig is signal.SIGINT:
            raise KeyboardInterrupt
        raise SIGTERMException

    @override
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        code = int(self.requested or 0)
        if trainer.world_size > 1:
            # A signal reaches each rank on its own clock: a rank that stopped alone would leave the
            # others waiting in the next step's collectives. Any rank's request stops every rank
            # here, all for the same signal (SIGTERM, the larger number, wins over SIGINT).
            mine = torch.tensor(code, device=trainer.strategy.root_device)
            code = int(trainer.strategy.reduce(mine, reduce_op="max"))
        if not code:
            return
        sig = signal.Signals(code)
        self._save(trainer)
        if sig is signal.SIGINT:
            raise KeyboardInterrupt
        raise SIGTERMException

    def _save(self, trainer: L.Trainer) -> None:
        save_atomically(trainer, self.path)
        self.saved_step = trainer.global_step

    @override
    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        if isinstance(exception, KeyboardInterrupt):
            self.stopped_by = signal.SIGINT
        elif isinstance(exception, SIGTERMException):
            self.stopped_by = signal.SIGTERM


__all__ = ["STOP_SIGNALS", "StopOnSignal", "signal_exit_status"]
