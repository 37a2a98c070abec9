"""The commands' progress bar: Lightning's Rich bar, with the epoch shown as Lightning should."""

from __future__ import annotations

from lightning.pytorch.callbacks import RichProgressBar
from lightning.pytorch.utilities.imports import _RICH_AVAILABLE
from typing_extensions import override


class EpochBar(RichProgressBar):
    """Lightning's Rich bar (its default where rich is installed), showing ``Epoch N`` when no
    ``max_epochs`` is set: Lightning 2.6 shows ``Epoch N/-2`` there (its issue #21925)."""

    @override
    def _get_train_description(self, current_epoch: int) -> str:
        max_epochs = self.trainer.max_epochs
        if max_epochs is not None and max_epochs >= 0:
            return super()._get_train_description(current_epoch)
        return f"{f'Epoch {current_epoch}':{len(self.validation_description)}}"


def progress_bar(enabled: bool) -> list[RichProgressBar]:
    """The commands' progress bar: an `EpochBar`, or none when the bar is off or rich is missing
    (then Lightning picks its own)."""
    return [EpochBar()] if enabled and _RICH_AVAILABLE else []
