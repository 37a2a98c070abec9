"""`FinalCheckpoint`: ``last.ckpt`` holds the step training ended at.

Lightning's `ModelCheckpoint(save_last=True)` writes ``last.ckpt`` beside each periodic checkpoint,
and at the end of training only when it never wrote one (Lightning 2.6, ``on_train_end``). A run
whose ``max_steps`` is not a multiple of ``checkpoint_every_n_steps`` would end with ``last.ckpt``
some steps behind its final weights: `evaluate --ckpt last.ckpt` would evaluate older weights and
`fit --ckpt last.ckpt` would train those steps again.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Checkpoint
from typing_extensions import override


def save_atomically(trainer: L.Trainer, path: Path) -> None:
    """`trainer.save_checkpoint` to `path` (written beside, then renamed: a kill during the save
    leaves the previous file whole). Every rank calls it; rank 0 writes; all wait for the name."""
    partial = path.with_name(f".{path.name}.partial")
    trainer.save_checkpoint(partial)  # every rank builds its state; rank 0 writes; all wait
    if trainer.is_global_zero:
        os.replace(partial, path)
    trainer.strategy.barrier("save_atomically")  # no rank goes on before the file has its name


class FinalCheckpoint(Checkpoint):
    """Writes `path` at the end of training unless the last checkpoint saved holds that step.

    A `Checkpoint`, so that Lightning runs its hooks after every other callback's (the evaluation
    callback's end round included): the file holds the state training ended with.

    Args:
        path: the run's ``last.ckpt``.

    Example:
        >>> FinalCheckpoint("runs/demo/checkpoints/last.ckpt").saved_step is None
        True
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.saved_step: int | None = None
        """The global step of the newest checkpoint written during this fit (any callback's), or None."""

    @override
    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        self.saved_step = trainer.global_step

    @override
    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.global_step > 0 and self.saved_step != trainer.global_step:
            save_atomically(trainer, self.path)
