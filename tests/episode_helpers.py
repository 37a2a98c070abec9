"""A user's own environment and a small `GRPOModule` with episodes, for the episode tests."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from areal_lightning.rl.episodes.environments import EpisodeView, Feedback
from areal_lightning.rl.episodes.settings import EpisodeSettings
from areal_lightning.rl.grpo.config import GRPOConfig
from areal_lightning.rl.grpo.module import GRPOModule
from areal_lightning.rl.policy import TinyPolicy
from areal_lightning.tasks.arithmetic import ArithmeticTask, Sample


class OddFirstDigit:
    """A completion that starts with an odd digit is right (about a third of a random policy's);
    otherwise the feedback "=" and another try. Outcomes vary within every group of episodes."""

    uses_tools = False

    def first_prompt(self, sample: Sample) -> str:
        return sample.prompt

    def respond(self, views: Sequence[EpisodeView]) -> list[Feedback]:
        right = [v.completion[:1] in ("1", "3", "5", "7", "9") for v in views]
        return [Feedback(float(r), done=r, observation="=", correct=r) for r in right]


def episode_module(max_turns: int = 3, seed: int = 3, **grpo: object) -> GRPOModule:
    """A one-layer tiny policy on one-digit addition, episodes of `OddFirstDigit`."""
    task = ArithmeticTask(train_digits=1, train_size=16, seed=0)
    tok = task.tokenizer
    torch.manual_seed(seed)
    policy = TinyPolicy(
        tok.vocab_size, d_model=32, n_layers=1, n_heads=2, max_len=40, pad_id=tok.pad_id, eos_id=tok.eos_id
    )
    settings = {"group_size": 4, "prompts_per_step": 4, "warmup_steps": 0, "max_new_tokens": 3, "lr": 1e-3, **grpo}
    return GRPOModule(
        policy,
        task,
        GRPOConfig(**settings),  # type: ignore[arg-type]
        seed=seed,
        episodes=EpisodeSettings(max_turns=max_turns),
        environment=OddFirstDigit(),
    )
