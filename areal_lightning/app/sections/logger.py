"""The ``logger`` section: where metrics go besides the eval history file."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Optional


class WandbMode(str, Enum):
    """``online``, ``offline`` (writes under save_dir, sync later) or ``disabled``."""

    ONLINE = "online"
    OFFLINE = "offline"
    DISABLED = "disabled"


@dataclass
class WandbConfig:
    """Weights & Biases, through Lightning's `WandbLogger`."""

    mode: WandbMode = WandbMode.DISABLED
    """online, offline (writes under save_dir, sync later) or disabled."""
    project: str = "areal-lightning"
    """W&B project."""
    entity: Optional[str] = None
    """W&B entity (user or team); null: your default."""
    name: Optional[str] = None
    """Run name; null: <experiment_name>/<trial_name>."""
    group: Optional[str] = None
    """Run group, e.g. the experiment name."""
    tags: list[str] = field(default_factory=list)
    """Run tags."""
    save_dir: Optional[str] = None
    """Where W&B writes; null: <output_dir>."""


@dataclass
class LoggerConfig:
    """Where metrics go besides the eval history file."""

    wandb: WandbConfig = field(default_factory=WandbConfig)
    """Weights & Biases."""
    csv: bool = True
    """Also write Lightning's CSV logs under <output_dir>/csv."""
