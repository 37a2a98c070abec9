"""GRPO on episodes (rl/episodes/training.py): observations carry no gradient, advantages are per
episode within a prompt's group, and a resumed fit trains on the same episodes as one never stopped."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from callback_helpers import make_trainer
from episode_helpers import episode_module
from lightning.pytorch.callbacks import ModelCheckpoint

from areal_lightning.rl.episodes.training import episode_batch, episode_loss, roll_out


def test_observation_tokens_get_no_gradient_and_the_policys_tokens_do() -> None:
    module = episode_module(max_turns=3)
    module.train_dataloader()
    batch = next(iter(module.train_dataloader()))
    episodes = roll_out(module, batch, module._train_samples)
    rewards = torch.tensor([e.reward(module.episodes) for e in episodes])
    captured: list[torch.Tensor] = []

    def keep_grad(mod: torch.nn.Module, args: Any, logits: torch.Tensor) -> None:
        logits.register_hook(captured.append)

    hook = module.policy.head.register_forward_hook(keep_grad)
    loss, _ = episode_loss(module, episodes, rewards)
    loss.backward()
    hook.remove()
    (logits_grad,) = captured
    b = episode_batch(episodes, module.tokenizer, "cpu")
    start = b["prompt_ids"].shape[1] - 1  # the logits at start + i predict action token i
    per_action = logits_grad[:, start:-1].abs().sum(-1)  # [episodes, actions]
    advantage_rows = (rewards.view(-1, 4) != rewards.view(-1, 4).mean(1, keepdim=True)).flatten()
    observations = ~b["loss_mask"] & (b["action_ids"] != module.tokenizer.pad_id)
    # Episodes whose advantage is not zero have observations: unmasked, these would get gradient.
    assert (observations & advantage_rows[:, None]).sum() >= 10
    assert per_action[observations].abs().max() == 0.0
    assert (per_action[b["loss_mask"] & advantage_rows[:, None]] > 0).all()


def test_a_step_logs_the_completion_statistics_of_each_turn_from_its_episodes() -> None:
    module = episode_module(max_turns=3)
    batch = next(iter(module.train_dataloader()))
    episodes = roll_out(module, batch, module._train_samples)
    _, logged = episode_loss(module, episodes, torch.tensor([e.reward(module.episodes) for e in episodes]))
    b = episode_batch(episodes, module.tokenizer, "cpu")
    with torch.no_grad():
        _, entropy = module.policy.completion_logprobs(
            b["prompt_ids"], b["prompt_mask"], b["action_ids"], temperature=module.grpo.temperature
        )
    eos = module.policy.eos_id
    for turn in range(1, 4):
        written = [e.completion_ids[turn - 1] for e in episodes if e.turns >= turn]
        assert len(written) > 0 and float(logged[f"train/turn{turn}/completion/length/mean"]) == pytest.approx(
            sum(map(len, written)) / len(written), abs=1e-12
        )
        cut = [ids[-1] != eos for ids in written]
        assert float(logged[f"train/turn{turn}/completion/truncated"]) == pytest.approx(sum(cut) / len(cut))
        own = entropy[b["action_turns"] == turn].double().mean()
        assert float(logged[f"train/turn{turn}/completion/entropy"]) == pytest.approx(float(own), rel=1e-6)
    assert float(logged["train/completion/entropy"]) == pytest.approx(float(entropy[b["loss_mask"]].mean()), rel=1e-6)
    assert "train/entropy" not in logged  # one name for one number: train/completion/entropy


class RecordSteps(L.Callback):
    """Each step's training prompts and logged episode reward and turns."""

    def __init__(self) -> None:
        self.steps: list[tuple[int, list[int], float, float]] = []

    def on_train_batch_end(self, trainer: L.Trainer, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        logged = trainer.callback_metrics
        self.steps.append(
            (trainer.global_step, batch["index"].tolist(), float(logged["train/reward"]), float(logged["train/turns"]))
        )


def _fit(root: Path, max_steps: int, ckpt: Path | None = None) -> tuple[RecordSteps, dict[str, torch.Tensor]]:
    module = episode_module(max_turns=3)
    record = RecordSteps()
    saves = ModelCheckpoint(dirpath=root, filename="{step}", every_n_train_steps=1, save_top_k=-1)
    make_trainer(root, [record, saves], max_steps).fit(module, ckpt_path=ckpt)
    return record, module.policy.state_dict()


def test_a_resumed_fit_trains_on_the_episodes_of_the_uninterrupted_one(tmp_path: Path) -> None:
    # 16 prompts, 4 a step: the resume at step 5 is in the middle of the second epoch.
    reference, weights = _fit(tmp_path / "reference", 7)
    assert len({turns for *_, turns in reference.steps}) > 1  # the episodes differ from step to step
    resumed, resumed_weights = _fit(tmp_path / "resumed", 7, tmp_path / "reference" / "step=5.ckpt")
    assert resumed.steps == reference.steps[5:]
    assert all(torch.equal(weights[k], resumed_weights[k]) for k in weights)
