"""The run's configuration: `Config` and the functions that read and write it.

The schema is one dataclass per section (`app/sections/`, `app/schema.py`); `load_config` merges
the YAML file over its defaults, then the `key=value` overrides, and validates
(`app/config_loading.py`). Every problem is a `ConfigError` naming the key path, the value and what
is accepted, raised before any training starts.

Example:
    >>> cfg = load_config(None, ["eval_sets.easy.size=10", "evaluator.schedule.freq_steps=50"])
    >>> cfg.evaluator.schedule.freq_steps, cfg.output_dir
    (50, 'runs/arith-grpo/trial0')
"""

from __future__ import annotations

from areal_lightning.app.config_errors import ConfigError
from areal_lightning.app.config_loading import CONFIG_FILENAME, load_config, save_config, to_dict, to_yaml
from areal_lightning.app.lightning_names import lightning_precision
from areal_lightning.app.schema import Config
from areal_lightning.app.sections.eval_sets import EvalSetConfig
from areal_lightning.app.sections.evaluator import EvaluatorConfig
from areal_lightning.app.sections.logger import WandbMode
from areal_lightning.app.sections.policy import EvalEngine, PolicyKind
from areal_lightning.app.sections.task import TaskName

__all__ = [
    "CONFIG_FILENAME",
    "Config",
    "ConfigError",
    "EvalEngine",
    "EvalSetConfig",
    "EvaluatorConfig",
    "PolicyKind",
    "TaskName",
    "WandbMode",
    "lightning_precision",
    "load_config",
    "save_config",
    "to_dict",
    "to_yaml",
]
