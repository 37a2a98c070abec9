"""areal-lightning: AReaL-style evaluation for RL training of language models, as a Lightning plugin.

The public API below is imported lazily (PEP 562), so `import areal_lightning` stays cheap and a
subpackage can be used without importing Lightning or W&B.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from areal_lightning.lazy import lazy_exports as _lazy_exports

__version__ = "0.2.0.dev0"

if TYPE_CHECKING:  # what type checkers and IDEs see; at run time `__getattr__` imports on first use
    from areal_lightning.app.config import Config as Config, ConfigError as ConfigError, load_config as load_config
    from areal_lightning.callbacks import (
        EvaluationCallback as EvaluationCallback,
        HybridTrigger as HybridTrigger,
        ThresholdMonitor as ThresholdMonitor,
    )
    from areal_lightning.callbacks.settings import (
        AdaptiveSettings as AdaptiveSettings,
        Decisions as Decisions,
        Execution as Execution,
        RewardWatchSettings as RewardWatchSettings,
        RoundSettings as RoundSettings,
        Schedule as Schedule,
    )
    from areal_lightning.eval_round import (
        EvalBatch as EvalBatch,
        EvalContext as EvalContext,
        EvalRoundError as EvalRoundError,
        EvalSet as EvalSet,
        EvalSetMismatchError as EvalSetMismatchError,
        EvaluateFn as EvaluateFn,
        SetResult as SetResult,
        run_round as run_round,
    )
    from areal_lightning.metrics import (
        AccuracyMetric as AccuracyMetric,
        AdvantageMetric as AdvantageMetric,
        MajAtK as MajAtK,
        PassAtK as PassAtK,
        RewardMetric as RewardMetric,
        group_advantages as group_advantages,
        maj_at_k as maj_at_k,
        pass_at_k as pass_at_k,
        wilson_interval as wilson_interval,
    )
    from areal_lightning.rl.grpo.module import GRPOModule as GRPOModule
    from areal_lightning.rl.policy import Policy as Policy, TinyPolicy as TinyPolicy
    from areal_lightning.tasks.arithmetic import ArithmeticTask as ArithmeticTask
    from areal_lightning.tracking import EvalHistory as EvalHistory, read_history as read_history
    from areal_lightning.viz import plot_runs as plot_runs

_EXPORTS = {
    # the plugin
    "EvaluationCallback": "areal_lightning.callbacks",
    "HybridTrigger": "areal_lightning.callbacks",
    "ThresholdMonitor": "areal_lightning.callbacks",
    "Schedule": "areal_lightning.callbacks.settings",
    "Execution": "areal_lightning.callbacks.settings",
    "RoundSettings": "areal_lightning.callbacks.settings",
    "Decisions": "areal_lightning.callbacks.settings",
    "AdaptiveSettings": "areal_lightning.callbacks.settings",
    "RewardWatchSettings": "areal_lightning.callbacks.settings",
    "EvalBatch": "areal_lightning.eval_round",
    "EvalContext": "areal_lightning.eval_round",
    "EvalRoundError": "areal_lightning.eval_round",
    "EvalSet": "areal_lightning.eval_round",
    "EvalSetMismatchError": "areal_lightning.eval_round",
    "EvaluateFn": "areal_lightning.eval_round",
    "SetResult": "areal_lightning.eval_round",
    "run_round": "areal_lightning.eval_round",
    "AccuracyMetric": "areal_lightning.metrics",
    "AdvantageMetric": "areal_lightning.metrics",
    "MajAtK": "areal_lightning.metrics",
    "PassAtK": "areal_lightning.metrics",
    "RewardMetric": "areal_lightning.metrics",
    "group_advantages": "areal_lightning.metrics",
    "maj_at_k": "areal_lightning.metrics",
    "pass_at_k": "areal_lightning.metrics",
    "wilson_interval": "areal_lightning.metrics",
    "EvalHistory": "areal_lightning.tracking",
    "read_history": "areal_lightning.tracking",
    "plot_runs": "areal_lightning.viz",
    # the app
    "Config": "areal_lightning.app.config",
    "ConfigError": "areal_lightning.app.config",
    "load_config": "areal_lightning.app.config",
    "ArithmeticTask": "areal_lightning.tasks.arithmetic",
    "GRPOModule": "areal_lightning.rl.grpo.module",
    "Policy": "areal_lightning.rl.policy",
    "TinyPolicy": "areal_lightning.rl.policy",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = _lazy_exports(__name__, _EXPORTS, globals())
