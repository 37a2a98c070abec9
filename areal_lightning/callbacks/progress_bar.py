"""A round's progress on the Trainer's own progress bar, as Lightning shows validation.

`TQDMProgressBar`: a bar below the training bar, built by the bar's own `init_validation_tqdm`
(so a subclass that customises validation customises evaluation too). `RichProgressBar`: a task
in its live display, or, before the display has started (a round before the first step), a
transient bar of its own. Any other progress bar, a disabled one or a rank other than 0: nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import lightning as L
from lightning.pytorch.callbacks import RichProgressBar, TQDMProgressBar

from areal_lightning.eval_round.progress import TqdmProgress, progress_label

if TYPE_CHECKING:
    from areal_lightning.eval_round.progress import RoundProgress


def trainer_progress(trainer: L.Trainer) -> RoundProgress | None:
    """What shows a round's batches under `trainer`'s progress bar; None where nothing should."""
    bar = trainer.progress_bar_callback
    if not trainer.is_global_zero or not isinstance(bar, (TQDMProgressBar, RichProgressBar)) or bar.is_disabled:
        return None
    return _validation_like_bar(bar) if isinstance(bar, TQDMProgressBar) else _RichProgress(bar)


def _validation_like_bar(owner: TQDMProgressBar) -> TqdmProgress:
    def make_bar(dataset: str, total: int) -> Any:
        bar = owner.init_validation_tqdm()
        bar.reset(total=total)
        bar.set_description(progress_label(dataset))
        return bar

    return TqdmProgress(make_bar)


class _RichProgress:
    def __init__(self, bar: RichProgressBar) -> None:
        self._owner = bar
        self._progress: Any = None
        self._task: Any = None
        self._own = False

    def start(self, dataset: str, total: int) -> None:
        progress: Any = self._owner.progress
        self._own = progress is None or not progress.live.is_started
        if self._own:
            # Rich allows one live display at a time: Lightning's is not running yet, so this one may.
            from rich.progress import Progress

            progress = Progress(transient=True)
            progress.start()
        self._progress = progress
        self._task = progress.add_task(progress_label(dataset), total=total)

    def advance(self) -> None:
        if self._progress is not None:
            self._progress.update(self._task, advance=1)
            if not self._own:
                self._owner.refresh()

    def close(self) -> None:
        if self._progress is None:
            return
        self._progress.remove_task(self._task)
        if self._own:
            self._progress.stop()
        else:
            self._owner.refresh()
        self._progress = None
