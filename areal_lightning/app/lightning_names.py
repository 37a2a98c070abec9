"""Lightning's own lists (accelerators, strategies, precisions), checked at load time so that a typo
fails there and not as a traceback from `Trainer(...)`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from areal_lightning.app.config_errors import ConfigError

if TYPE_CHECKING:
    from lightning.fabric.connector import _PRECISION_INPUT

    from areal_lightning.app.sections.trainer import TrainerConfig


LIGHTNING_PRECISIONS = ("32-true", "16-mixed", "bf16-mixed", "16-true", "bf16-true", "64-true")
"""The precisions a message suggests (Lightning also takes its aliases, such as ``32``)."""


def lightning_precision(precision: str) -> _PRECISION_INPUT:
    """`precision` typed as the Trainer and Fabric take it; `TrainerConfig.check` has run Lightning's parser on it."""
    return cast("_PRECISION_INPUT", precision)


def check_lightning_names(trainer: TrainerConfig, path: str) -> None:
    """Refuses an accelerator, strategy or precision Lightning does not know, naming its choices.

    It imports Lightning (seconds): `Config` runs it after every other check, so that a config
    refused for another reason is refused at once.
    """
    from lightning.fabric.connector import _convert_precision_to_unified_args
    from lightning.pytorch.accelerators import AcceleratorRegistry
    from lightning.pytorch.strategies import StrategyRegistry

    accelerators = ["auto", "gpu", *sorted(AcceleratorRegistry.available_accelerators())]
    if trainer.accelerator not in accelerators:
        raise ConfigError(f"{path}.accelerator must be one of {', '.join(accelerators)}; got {trainer.accelerator!r}")
    strategies = ["auto", *StrategyRegistry.available_strategies()]
    if trainer.strategy.lower() not in strategies:
        raise ConfigError(f"{path}.strategy must be one of {', '.join(strategies)}; got {trainer.strategy!r}")
    try:
        _convert_precision_to_unified_args(lightning_precision(trainer.precision))
    except ValueError:
        raise ConfigError(
            f"{path}.precision must be one of {', '.join(LIGHTNING_PRECISIONS)} (Lightning's "
            f"names); got {trainer.precision!r}"
        ) from None
