"""GRPO: `GRPOModule` (module.py), its options `GRPOConfig` (config.py), the loss (objective.py), the
format-only warm-up (warmup.py) and the training data a resume continues (train_data.py)."""

from areal_lightning.lazy import lazy_exports

__getattr__, __dir__ = lazy_exports(
    __name__,
    {"GRPOModule": "areal_lightning.rl.grpo.module", "GRPOConfig": "areal_lightning.rl.grpo.config"},
    globals(),
)
