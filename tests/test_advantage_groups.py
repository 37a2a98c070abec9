"""Each rollout's advantage comes from its own prompt's group only, in single-turn GRPO and in
episode training, with 3 prompts a step and 4 samples a prompt (neither divides the other: a step's
rewards split into groups the wrong way round give other advantages, which a 4-by-4 step hides).

The advantages are read back from the gradient the loss sends into the policy's logits: for a token
``a`` the policy wrote, ``d loss / d logit[a] = -A * (1 - p[a]) / (n * T)``, ``A`` its rollout's
advantage, ``p`` the softmax at temperature ``T`` and ``n`` the loss's token count. So a prompt
whose rollouts all earned the same reward must show zero gradient on all its rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from callback_helpers import QUIET_WARNINGS, make_trainer

from areal_lightning.metrics import ADVANTAGE_EPS
from areal_lightning.rl.episodes.environments import EpisodeView, Feedback
from areal_lightning.rl.episodes.settings import EpisodeSettings
from areal_lightning.rl.episodes.training import episode_batch, episode_loss, roll_out
from areal_lightning.rl.grpo.config import GRPOConfig
from areal_lightning.rl.grpo.module import GRPOModule
from areal_lightning.rl.policy import TinyPolicy, completion_mask
from areal_lightning.tasks.arithmetic import ArithmeticTask, Score

pytestmark = [pytest.mark.filterwarnings(w) for w in QUIET_WARNINGS]

PROMPTS, GROUP = 3, 4
FLAT_ANSWER = "05"
"""The answer of the training prompt (of three: 2+3, 7+9, 4+7) whose rollouts all earn 0.5."""


class LogitGradient:
    """The ids and logits of the policy's forwards that carry a gradient, and that gradient."""

    def __init__(self, policy: torch.nn.Module) -> None:
        self.ids = self.logits = self.grad = torch.empty(0)
        self.handle = policy.register_forward_hook(self._keep)

    def _keep(self, module: torch.nn.Module, args: Any, logits: torch.Tensor) -> None:
        if logits.requires_grad:  # the loss's forward, not the rollouts' sampling
            self.ids, self.logits = args[0].detach(), logits.detach()
            logits.register_hook(self._keep_grad)

    def _keep_grad(self, grad: torch.Tensor) -> None:
        self.grad = grad

    def advantages(self, prompt_len: int, loss_mask: torch.Tensor, temperature: float) -> torch.Tensor:
        """[rows, actions] advantage of each token the loss counts (NaN elsewhere), from the gradient."""
        actions = self.ids[:, prompt_len:, None]
        logits, grad = self.logits[:, prompt_len - 1 : -1], self.grad[:, prompt_len - 1 : -1]
        p = torch.softmax(logits.double() / temperature, dim=-1).gather(-1, actions).squeeze(-1)
        g = grad.double().gather(-1, actions).squeeze(-1)
        per_token = -g * loss_mask.sum() * temperature / (1 - p)
        return torch.where(loss_mask, per_token, torch.nan)


def own_group_advantages(rewards: Sequence[float]) -> torch.Tensor:
    """GRPO's advantages of one prompt's rewards: minus their mean, over their sample std (+ eps)."""
    r = torch.tensor(rewards, dtype=torch.float64)
    return (r - r.mean()) / (r.std() + ADVANTAGE_EPS)


def check_rows(advantages: torch.Tensor, grad: torch.Tensor, rewards: Sequence[float], flat_rows: list[int]) -> None:
    """Each row's advantage (one value on all its tokens) is its own prompt's group advantage; the
    flat prompt's rows get no gradient at all; each prompt's best rollout a positive advantage."""
    assert len(rewards) == PROMPTS * GROUP and len(flat_rows) == GROUP
    expected = torch.cat([own_group_advantages(rewards[p * GROUP : (p + 1) * GROUP]) for p in range(PROMPTS)])
    for row in range(len(rewards)):
        got = advantages[row][~advantages[row].isnan()]
        assert len(got) > 0 and torch.allclose(got, expected[row].expand_as(got), rtol=1e-4, atol=1e-6), (row, got)
    assert grad[flat_rows].abs().max() == 0.0
    assert grad[[r for r in range(len(rewards)) if r not in flat_rows]].abs().max() > 0
    for p in range(PROMPTS):
        group = rewards[p * GROUP : (p + 1) * GROUP]
        if len(set(group)) > 1:
            best = p * GROUP + max(range(GROUP), key=lambda g: group[g])
            assert expected[best] > 0 and advantages[best][~advantages[best].isnan()].min() > 0


def _policy(task: ArithmeticTask) -> TinyPolicy:
    torch.manual_seed(3)
    tok = task.tokenizer
    return TinyPolicy(
        tok.vocab_size, d_model=32, n_layers=1, n_heads=2, max_len=40, pad_id=tok.pad_id, eos_id=tok.eos_id
    )


def _config() -> GRPOConfig:
    return GRPOConfig(group_size=GROUP, prompts_per_step=PROMPTS, warmup_steps=0, max_new_tokens=3, lr=1e-3)


# ---------------------------------------------------------------------------------- single-turn
class RewardsByPrompt(ArithmeticTask):
    """Three prompts; every completion of the flat prompt earns 0.5, any other completion a reward
    from its characters (it varies within a group). Keeps what it scored, in order."""

    def __init__(self) -> None:
        super().__init__(train_digits=1, train_size=PROMPTS, seed=0)
        self.scored: list[tuple[str, str, float]] = []

    def score_many(self, completions: list[str], answers: list[str]) -> list[Score]:
        pairs = zip(completions, answers, strict=True)
        rewards = [0.5 if a == FLAT_ANSWER else sum(map(ord, c)) % 4 / 3 for c, a in pairs]
        self.scored += list(zip(completions, answers, rewards, strict=True))
        return [Score(r) for r in rewards]


def test_single_turn_advantages_come_from_each_prompts_own_completions(tmp_path: Path) -> None:
    task = RewardsByPrompt()
    module = GRPOModule(_policy(task), task, _config(), seed=3)
    captured = LogitGradient(module.policy)
    prompt_len: list[int] = []

    class PromptLength(L.Callback):
        def on_train_batch_start(self, trainer: L.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
            prompt_len.append(batch["prompt_ids"].shape[1])

    trainer = make_trainer(tmp_path, [PromptLength()], max_steps=1)
    trainer.fit(module)
    captured.handle.remove()
    answers = [a for _, a, _ in task.scored]
    rewards = [r for *_, r in task.scored]
    # Rows are prompt-major: prompt p's completions are rows p*4 .. p*4+3, one prompt each.
    assert [len(set(answers[p * GROUP : (p + 1) * GROUP])) for p in range(PROMPTS)] == [1] * PROMPTS
    assert len(set(answers)) == PROMPTS and FLAT_ANSWER in answers
    flat_rows = [i for i, a in enumerate(answers) if a == FLAT_ANSWER]
    assert all(len(set(rewards[p * GROUP : (p + 1) * GROUP])) > 1 for p in range(PROMPTS) if p * GROUP not in flat_rows)
    (p_len,) = prompt_len
    mask = completion_mask(captured.ids[:, p_len:], module.policy.eos_id)
    advantages = captured.advantages(p_len, mask, module.grpo.temperature)
    check_rows(advantages, captured.grad[:, p_len - 1 : -1], rewards, flat_rows)
    assert float(trainer.callback_metrics["train/zero_std_frac"]) == pytest.approx(1 / PROMPTS)


# ---------------------------------------------------------------------------------- episodes
class FlatPromptOddFirstDigit:
    """Every episode of the flat prompt ends at once with 0.5; on the others, a completion that starts
    with an odd digit is right (1), otherwise "=" and another try (about a third right per turn)."""

    uses_tools = False

    def first_prompt(self, sample: Any) -> str:
        return sample.prompt

    def respond(self, views: Sequence[EpisodeView]) -> list[Feedback]:
        answers = []
        for v in views:
            if v.sample.answer == FLAT_ANSWER:
                answers.append(Feedback(0.5, done=True, observation="=", correct=False))
            else:
                right = v.completion[:1] in ("1", "3", "5", "7", "9")
                answers.append(Feedback(float(right), done=right, observation="=", correct=right))
        return answers


def test_episode_advantages_come_from_each_prompts_own_episodes(tmp_path: Path) -> None:
    task = ArithmeticTask(train_digits=1, train_size=PROMPTS, seed=0)
    settings = EpisodeSettings(max_turns=3, turn_discount=0.5)
    module = GRPOModule(
        _policy(task), task, _config(), seed=3, episodes=settings, environment=FlatPromptOddFirstDigit()
    )
    batch = next(iter(module.train_dataloader()))
    episodes = roll_out(module, batch, module._train_samples)
    rewards = [e.reward(settings) for e in episodes]
    assert [e.sample.index for e in episodes] == [i for i in batch["index"].tolist() for _ in range(GROUP)]
    flat_rows = [i for i, e in enumerate(episodes) if e.sample.answer == FLAT_ANSWER]
    assert len({rewards[i] for i in flat_rows}) == 1
    assert all(len(set(rewards[p * GROUP : (p + 1) * GROUP])) > 1 for p in range(PROMPTS) if p * GROUP not in flat_rows)

    captured = LogitGradient(module.policy)
    loss, _ = episode_loss(module, episodes, torch.tensor(rewards))
    loss.backward()
    captured.handle.remove()
    b = episode_batch(episodes, module.tokenizer, "cpu")
    p_len = b["prompt_ids"].shape[1]
    advantages = captured.advantages(p_len, b["loss_mask"], module.grpo.temperature)
    check_rows(advantages, captured.grad[:, p_len - 1 : -1], rewards, flat_rows)

    # The step as training runs it logs the same groups: one prompt of three had no spread.
    trainer = make_trainer(tmp_path, [], max_steps=1)
    trainer.fit(module)
    assert float(trainer.callback_metrics["train/zero_std_frac"]) == pytest.approx(1 / PROMPTS)
