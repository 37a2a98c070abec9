"""What an engine's round evaluates, with the engine's policy in the module's place: a harness
task's requests (`harness_evaluate`), multi-turn episodes (`episode_evaluate`), or the default
evaluation (`rollout_evaluate`) — the functions the policy's own rounds run, so an engine changes
who generates and nothing else."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

from areal_lightning.eval_round import EvalBatch, EvalContext
from areal_lightning.rl.episodes.evaluation import EpisodeModule, episode_evaluate
from areal_lightning.rl.harness.evaluation import harness_evaluate, harness_spec
from areal_lightning.rl.rollout_eval import RolloutModule, rollout_evaluate


def engine_round(view: Any, batches: Sequence[EvalBatch], ctx: EvalContext) -> dict[str, Any]:
    """The round of `view` (the module, its ``policy`` the engine's) on `batches`."""
    if harness_spec(getattr(ctx, "options", None)) is not None:
        return harness_evaluate(view, batches, ctx)  # an lm-evaluation-harness task (docs/harness.md)
    if getattr(view, "episodes", None) is not None:
        return episode_evaluate(cast("EpisodeModule", view), batches, ctx)
    return rollout_evaluate(cast("RolloutModule", view), batches, ctx)
