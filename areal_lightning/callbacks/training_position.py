"""Where training stands, as the callback reads it off the Trainer: the same on every rank."""

from __future__ import annotations

import lightning as L

WEIGHTS_EPOCH_KEY = "weights_epoch"
"""A checkpoint's entry (and the callback's state) holding the epoch of the step whose weights it
saved: Lightning's own ``epoch`` counts the epochs begun, one more at the end of training."""


def is_last_step(trainer: L.Trainer, step: int, last_batch: bool) -> bool:
    """Training stops after `step`: `max_steps` is reached, or the last batch of the last epoch ran."""
    if trainer.max_steps is not None and 0 <= trainer.max_steps <= step:
        return True
    max_epochs = trainer.max_epochs
    return last_batch and max_epochs is not None and 0 <= max_epochs <= trainer.current_epoch + 1


def fast_dev_run(trainer: L.Trainer) -> bool:
    """`Trainer(fast_dev_run=...)` is on (an attribute the Trainer sets but does not declare)."""
    return bool(getattr(trainer, "fast_dev_run", False))


def epoch_ran_to_end(trainer: L.Trainer) -> bool:
    """The epoch loop consumed its last batch (or its `limit_train_batches`), the same on every rank."""
    progress = trainer.fit_loop.epoch_loop.batch_progress
    return bool(progress.is_last_batch) or progress.current.ready == trainer.num_training_batches
