"""The environment `EpisodeSettings.env` names, built on the module's task."""

from __future__ import annotations

from dataclasses import asdict
from enum import Enum
from typing import Any

from areal_lightning.errors import ArgumentError
from areal_lightning.rl.episodes.environments import Environment, RetryEnvironment
from areal_lightning.rl.episodes.settings import EnvName, EpisodeSettings


def make_environment(settings: EpisodeSettings, task: Any) -> Environment:
    """`RetryEnvironment` or `PythonToolEnvironment` on `task`, as `settings.env` says.

    Example:
        >>> from areal_lightning.tasks.arithmetic import ArithmeticTask
        >>> make_environment(EpisodeSettings(), ArithmeticTask()).feedback
        '='
    """
    if EnvName(settings.env) is EnvName.PYTHON_TOOL:
        from areal_lightning.rl.episodes.tool_env import PythonToolEnvironment

        return PythonToolEnvironment(task, timeout_s=settings.tool_timeout_s, output_chars=settings.tool_output_chars)
    return RetryEnvironment(task, settings.feedback)


def episode_parts(
    episodes: EpisodeSettings | None, environment: Environment | None, task: Any
) -> tuple[EpisodeSettings | None, Environment | None]:
    """The checked settings and the environment of a `GRPOModule` (the named one when none is given).

    Raises:
        ArgumentError: an environment without episode settings, or settings out of range.
    """
    if episodes is None:
        if environment is not None:
            raise ArgumentError("GRPOModule", "environment", environment, "None unless episodes=EpisodeSettings(...)")
        return None, None
    episodes.validate()
    return episodes, environment if environment is not None else make_environment(episodes, task)


def episode_values(episodes: EpisodeSettings | None) -> dict[str, Any] | None:
    """Plain values of the settings for `save_hyperparameters` (checkpoints load with weights_only)."""
    if episodes is None:
        return None
    return {k: v.value if isinstance(v, Enum) else v for k, v in asdict(episodes).items()}
