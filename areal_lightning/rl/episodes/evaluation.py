"""The default `evaluate_fn` of a `GRPOModule` with episodes: ``n_samples`` episodes per eval prompt.

Logged per eval set (exact under DDP, see episode_metrics.py): ``reward/*`` of the discounted
episode rewards, ``accuracy`` and ``pass@k`` of success within ``max_turns``, ``success@t`` for
each t up to ``max_turns``, ``turns/mean``, and for a tool environment ``tool/calls``,
``tool/errors`` and ``tool/timeouts``, and the completion statistics of docs/round_statistics.md
per turn (``turn<t>/completion/...``, over the episodes that reached turn t) and over all turns
(``completion/...``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import torch

from areal_lightning.eval_round import EvalBatch, EvalContext
from areal_lightning.rl.episodes.completions import update_episode_completion_metrics
from areal_lightning.rl.episodes.environments import Environment
from areal_lightning.rl.episodes.metrics import TOOL_KEYS, TURNS_KEY, episode_metrics, success_key
from areal_lightning.rl.episodes.runner import Episode, run_episodes
from areal_lightning.rl.episodes.settings import EpisodeSettings
from areal_lightning.rl.rollout_eval import TOKEN_SCORES_OPTION, RolloutModule, sampling_of


class EpisodeModule(RolloutModule, Protocol):
    """What the episode evaluation needs of a module; `GRPOModule(episodes=...)` has it."""

    @property
    def episodes(self) -> EpisodeSettings | None: ...

    @property
    def environment(self) -> Environment | None: ...


def _update(
    metrics: dict[str, Any], episodes: Sequence[Episode], settings: EpisodeSettings, n: int, ctx: EvalContext
) -> None:
    prompts = len(episodes) // n
    rewards = torch.tensor([e.reward(settings) for e in episodes], dtype=torch.float64, device=ctx.device)
    first = torch.tensor([e.success_turn or 0 for e in episodes], device=ctx.device)
    solved = (first > 0).view(prompts, n)
    metrics["reward"].update(rewards)
    metrics["accuracy"].update(solved.double())
    for k in sorted({1, n}):
        metrics[f"pass@{k}"].update(solved)
    for t in range(1, settings.max_turns + 1):
        metrics[success_key(t)].update(first.view(prompts, n))
    metrics[TURNS_KEY].update(torch.tensor([float(e.turns) for e in episodes], dtype=torch.float64))
    if TOOL_KEYS[0] in metrics:
        for key, attr in zip(TOOL_KEYS, ("called", "error", "timeout"), strict=True):
            count = sum(getattr(f.tool, attr) for e in episodes for f in e.feedback)
            metrics[key].update(torch.tensor(float(count), dtype=torch.float64))


def episode_evaluate(module: EpisodeModule, batches: Sequence[EvalBatch], ctx: EvalContext) -> dict[str, Any]:
    """Runs `n_samples` episodes per prompt of each batch with the eval set's sampling settings (the
    module's environment and episode settings) and updates the episode metrics.

    Raises:
        ValueError: the module has no episode settings, a turn does not fit the policy's
            ``max_len``, or the environment answered wrongly.
    """
    settings, env = module.episodes, module.environment
    if settings is None or env is None:
        raise ValueError("episode_evaluate needs a module built with episodes=EpisodeSettings(...)")
    sp = sampling_of(ctx)
    n = sp.n_samples
    max_new_tokens = sp.max_new_tokens or module.grpo.max_new_tokens
    metrics = {
        name: ctx.metric(name, factory)
        for name, factory in episode_metrics(n, settings.max_turns, env.uses_tools, max_new_tokens).items()
    }
    for batch in batches:
        episodes = run_episodes(
            module.policy,
            module.tokenizer,
            env,
            batch.samples,
            batch.seeds,
            n=n,
            settings=settings,
            sampling=sp,
            max_new_tokens=max_new_tokens,
            device=ctx.device,
            lockstep=ctx.lockstep,
            scores=bool(ctx.options.get(TOKEN_SCORES_OPTION, True)),
        )
        _update(metrics, episodes, settings, n, ctx)
        update_episode_completion_metrics(
            metrics, episodes, settings.max_turns, module.policy.eos_id, module.task.answer_id
        )
        solved = torch.tensor([e.success_turn is not None for e in episodes], dtype=torch.float64).view(-1, n)
        rewards = torch.tensor([e.reward(settings) for e in episodes], dtype=torch.float64).view(-1, n)
        ctx.record_outcomes("accuracy", batch.indices, solved.mean(1))
        ctx.record_outcomes("reward/mean", batch.indices, rewards.mean(1))
        ctx.num_samples += len(episodes)
        for row, (index, sample) in enumerate(zip(batch.indices, batch.samples, strict=True)):
            first = episodes[row * n]
            ctx.record_sample(
                index,
                prompt=sample.prompt,
                completion=first.transcript(),
                answer=sample.answer,
                reward=float(rewards[row, 0]),
                correct=first.success_turn is not None,
                turns=first.turns,
            )
    return {}
