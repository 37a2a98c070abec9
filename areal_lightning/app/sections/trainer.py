"""The ``trainer`` section: the arguments of Lightning's `Trainer` a run needs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from areal_lightning.app.config_errors import at_least


@dataclass
class TrainerConfig:
    """Arguments of Lightning's `Trainer` that a run needs."""

    max_steps: int = 200
    """Optimizer steps to train for."""
    max_epochs: Optional[int] = None
    """Epochs to train for at most; null means limited by max_steps only."""
    accelerator: str = "cpu"
    """Lightning accelerator: cpu, gpu, auto."""
    devices: int = 1
    """Devices (processes) to train on."""
    num_nodes: int = 1
    """Machines to train on, `devices` processes each; launch one copy per node (torchrun, SLURM; docs/scale_out.md)."""
    strategy: str = "auto"
    """Lightning strategy: auto, ddp, fsdp ..."""
    precision: str = "32-true"
    """Lightning precision, e.g. 32-true or bf16-mixed."""
    log_every_n_steps: int = 10
    """How often train metrics go to the loggers."""
    enable_progress_bar: bool = True
    """Show Lightning's progress bar."""
    checkpoint_every_n_steps: Optional[int] = None
    """Save a checkpoint under <output_dir>/checkpoints every N steps (and the last one); null: only at the end."""

    def check(self, path: str) -> None:
        at_least(f"{path}.max_steps", self.max_steps, 1)
        at_least(f"{path}.max_epochs", self.max_epochs, 1, allow_none=True)
        at_least(f"{path}.devices", self.devices, 1)
        at_least(f"{path}.num_nodes", self.num_nodes, 1)
        at_least(f"{path}.log_every_n_steps", self.log_every_n_steps, 1)
        at_least(f"{path}.checkpoint_every_n_steps", self.checkpoint_every_n_steps, 1, allow_none=True)
