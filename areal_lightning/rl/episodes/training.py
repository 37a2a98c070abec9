"""GRPO on episodes: ``group_size`` episodes per training prompt, one advantage per episode.

The advantage is group-relative over the episodes of a prompt (the discounted episode rewards);
every token the policy wrote in the episode (all its turns) carries its episode's advantage, and
the observations and feedback between the turns carry no loss at all: the loss mask is True on
the policy's own tokens only, and the loss is their token mean over the batch, as single-turn
GRPO takes the token mean of its completions.

A step logs the completion statistics of its episodes as the evaluation does, per turn
(``train/turn<t>/completion/...``) and over all turns (``train/completion/...``), from the
completions the rollout generated and the log-probabilities and entropies of the loss's forward.

Each training step draws its episodes from (run seed, global step, prompt index): a resumed run
(same step, same prompts, `ResumableLoader`) rolls out the same episodes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from areal_lightning.eval_round import SamplingParams
from areal_lightning.eval_round.sharding import sample_seed
from areal_lightning.metrics.functional import group_advantages
from areal_lightning.rl.episodes.completions import step_episode_completion_stats
from areal_lightning.rl.episodes.runner import Episode, run_episodes
from areal_lightning.rl.grpo.objective import k3_kl, policy_gradient

TRAIN_EPISODE_STREAM = "train-episodes"
"""Names the training episodes' seeds, apart from single-turn rollouts and every eval set."""


def training_seeds(seed: int, global_step: int, indices: Sequence[int]) -> list[int]:
    """Each training prompt's episode seed at `global_step`, from the run seed and its index alone.

    Example:
        >>> training_seeds(1, 5, [3, 4])[0] == training_seeds(1, 5, [9, 3])[1]
        True
    """
    step_seed = sample_seed(seed, TRAIN_EPISODE_STREAM, global_step)
    return [sample_seed(step_seed, "prompt", int(i)) for i in indices]


def pad_right(rows: Sequence[Sequence[Any]], fill: Any, dtype: torch.dtype) -> Tensor:
    """[B, longest] tensor of `rows`, each filled with `fill` after its end."""
    width = max(len(r) for r in rows)
    return torch.tensor([[*r, *([fill] * (width - len(r)))] for r in rows], dtype=dtype)


def episode_batch(episodes: Sequence[Episode], tokenizer: Any, device: Any) -> dict[str, Tensor]:
    """Left-padded prompts, right-padded actions (completions and observations after the prompt),
    the loss mask (True on the tokens the policy wrote, False on observations and padding) and each
    action token's turn (from 1; 0 on observations and padding)."""
    prompt_ids, prompt_mask = tokenizer.pad_left([e.prompt_ids for e in episodes])
    actions = [e.action_ids() for e in episodes]
    return {
        "prompt_ids": prompt_ids.to(device),
        "prompt_mask": prompt_mask.to(device),
        "action_ids": pad_right([ids for ids, _ in actions], tokenizer.pad_id, torch.long).to(device),
        "loss_mask": pad_right([mine for _, mine in actions], False, torch.bool).to(device),
        "action_turns": pad_right([e.action_turns() for e in episodes], 0, torch.long).to(device),
    }


def roll_out(module: Any, batch: Mapping[str, Any], samples: Mapping[int, Any]) -> list[Episode]:
    """`group_size` episodes of each prompt of a training batch (by its samples' indices)."""
    hp, settings = module.grpo, module.episodes
    indices = batch["index"].tolist()
    return run_episodes(
        module.policy,
        module.tokenizer,
        module.environment,
        [samples[i] for i in indices],
        training_seeds(module.seed, module.global_step, indices),
        n=hp.group_size,
        settings=settings,
        sampling=SamplingParams(n_samples=hp.group_size, temperature=hp.temperature),
        max_new_tokens=hp.max_new_tokens,
        device=module.device,
    )


def episode_loss(module: Any, episodes: Sequence[Episode], rewards: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
    """The GRPO loss of `episodes` (grouped by prompt, `group_size` each, with their discounted
    `rewards`) and what a step logs about it (the completion statistics over every rank's episodes:
    every rank must call it)."""
    hp = module.grpo
    advantages = group_advantages(rewards.view(-1, hp.group_size), scale=hp.scale_advantages, std=hp.advantage_std)
    b = episode_batch(episodes, module.tokenizer, module.device)
    logp, entropy = module.policy.completion_logprobs(
        b["prompt_ids"], b["prompt_mask"], b["action_ids"], temperature=hp.temperature
    )
    per_token = policy_gradient(logp, advantages.reshape(-1, 1))
    kl = torch.zeros_like(per_token)
    if module.reference is not None:
        with torch.no_grad():
            ref_logp, _ = module.reference.completion_logprobs(
                b["prompt_ids"], b["prompt_mask"], b["action_ids"], temperature=hp.temperature
            )
        kl = k3_kl(ref_logp, logp)
        per_token = per_token + hp.kl_coef * kl
    mine = b["loss_mask"].float()  # the policy's own tokens: observations and padding carry no loss
    n_tokens = mine.sum().clamp(min=1)
    loss = (per_token * mine).sum() / n_tokens
    token_mean = lambda x: (x.detach() * mine).sum() / n_tokens  # noqa: E731
    logged = step_episode_completion_stats(
        module.train_completions,
        episodes,
        module.episodes.max_turns,
        module.policy.eos_id,
        module.task.answer_id,
        (logp, entropy, b["action_turns"]),
    )
    return loss, {
        "train/kl": token_mean(kl),
        "train/loss": loss.detach(),
        **logged,
    }


def _episode_stats(episodes: Sequence[Episode], max_turns: int) -> dict[str, Tensor]:
    first = torch.tensor([e.success_turn or 0 for e in episodes])
    stats = {"train/turns": torch.tensor([float(e.turns) for e in episodes]).mean()}
    for t in range(1, max_turns + 1):
        stats[f"train/success@{t}"] = ((first >= 1) & (first <= t)).float().mean()
    return stats


def episode_training_step(module: Any, batch: Mapping[str, Any], samples: Mapping[int, Any]) -> Tensor:
    """`GRPOModule.training_step` with episodes: roll out, score, one policy-gradient loss.

    Args:
        module: a `GRPOModule` built with ``episodes=EpisodeSettings(...)``.
        batch: a training batch (its ``index`` names the prompts).
        samples: the training samples by index.
    """
    settings = module.episodes
    episodes = roll_out(module, batch, samples)
    rewards = torch.tensor([e.reward(settings) for e in episodes], dtype=torch.float32, device=module.device)
    loss, logged = episode_loss(module, episodes, rewards)
    reward_stats = module.train_reward(rewards)
    adv_stats = module.train_advantage(rewards.view(-1, module.grpo.group_size))
    module.log("train/reward", reward_stats["mean"], prog_bar=True, batch_size=len(episodes))
    logged.update(_episode_stats(episodes, settings.max_turns))
    logged.update(
        {
            "train/reward_std": reward_stats["std"],
            "train/advantage_abs_mean": adv_stats["abs_mean"],
            "train/zero_std_frac": adv_stats["zero_std_frac"],
        }
    )
    module.log_dict(logged, batch_size=len(episodes))
    return loss
