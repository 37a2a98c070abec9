"""The real GRPOModule under a real Trainer: what a training step logs, its KL and loss, and what the
format warm-up teaches. That GRPO learns the arithmetic task is shown on the demo's own run
(tests/test_demo.py: one process) and on two DDP processes (tests/test_ddp_learning.py)."""

from __future__ import annotations

import torch
from callback_helpers import make_trainer

from areal_lightning.app.builders import build_eval_sets, build_module
from areal_lightning.app.config import load_config
from areal_lightning.eval_round import run_round
from areal_lightning.rl.grpo.objective import policy_gradient
from areal_lightning.rl.rollout_eval import rollout_evaluate


def test_training_step_logs_the_grpo_statistics(tmp_path):
    cfg = load_config(
        None,
        [
            "trainer.max_steps=2",
            "eval_sets.easy.size=4",
            "grpo.warmup_steps=2",
            "grpo.kl_coef=0.1",
            "grpo.prompts_per_step=4",
            "grpo.group_size=4",
        ],
    )
    module = build_module(cfg)
    trainer = make_trainer(tmp_path, [], 2)
    trainer.fit(module)
    logged = trainer.callback_metrics
    for name in (
        "train/reward",
        "train/advantage_mean",
        "train/advantage_std",
        "train/zero_std_frac",
        "train/kl",
        "train/completion/length/mean",
        "train/completion/length/p95",
        "train/completion/entropy",
        "train/completion/logprob",
        "train/loss",
    ):
        assert name in logged and torch.isfinite(logged[name]), name
    assert "train/clip_frac" not in logged  # one update per batch: nothing to clip, nothing to log
    assert 0.0 <= float(logged["train/zero_std_frac"]) <= 1.0
    # completions are 2 digits + EOS for one-digit sums, at most max_new_tokens
    assert 1.0 <= float(logged["train/completion/length/mean"]) <= cfg.grpo.max_new_tokens
    assert float(logged["train/completion/length/max"]) <= cfg.grpo.max_new_tokens
    for share in ("truncated", "stopped", "no_answer"):
        assert 0.0 <= float(logged[f"train/completion/{share}"]) <= 1.0
    assert float(logged["train/completion/entropy"]) > 0 > float(logged["train/completion/logprob"])


def test_kl_to_a_reference_that_differs_is_positive(tmp_path):
    # At the first steps of a fresh run the policy still equals its frozen copy (KL 0 whatever the
    # formula); a reference moved away from it must show a positive KL in the logged statistics.
    cfg = load_config(
        None,
        [
            "trainer.max_steps=1",
            "eval_sets.easy.size=4",
            "grpo.warmup_steps=0",
            "grpo.kl_coef=0.1",
            "grpo.prompts_per_step=4",
            "grpo.group_size=4",
        ],
    )
    module = build_module(cfg)
    with torch.no_grad():
        for param in module.reference.parameters():
            param.add_(0.5 * torch.randn_like(param))
    trainer = make_trainer(tmp_path, [], 1)
    trainer.fit(module)
    assert float(trainer.callback_metrics["train/kl"]) > 0.01


def test_warmup_teaches_the_format_but_not_the_answers():
    # Every one of the 100 one-digit problems, so not held out of training (the warm-up sees no answer anyway).
    cfg = load_config(None, ["eval_sets.easy.size=100", "task.hold_out_eval=false", "grpo.warmup_steps=150"])
    module = build_module(cfg)
    from areal_lightning.rl.grpo.warmup import format_warmup

    format_warmup(module.policy, module.task, steps=cfg.grpo.warmup_steps, lr=cfg.grpo.warmup_lr, seed=cfg.seed)
    (result,) = run_round(
        module, build_eval_sets(cfg, module.task), rollout_evaluate, seed=3, global_step=0, epoch=0, max_table_rows=100
    )
    completions = [row["completion"] for row in result.table_rows]
    well_formed = [c for c in completions if len(c) == 2 and c.isdigit()]
    assert len(well_formed) >= 0.9 * len(completions)  # the format is learnt
    assert result.metrics["accuracy"] < 0.15  # the answers are not


def test_the_loss_is_the_policy_gradient_of_one_update_per_batch():
    # The ratio to the sampling policy is 1 in value: the loss is -advantage per token and its
    # gradient -advantage per log-probability (the clipped objective had the same value and gradient).
    logp = torch.tensor([[-1.0, -2.0, -0.5], [-0.1, -3.0, -1.5]], requires_grad=True)
    advantages = torch.tensor([[0.5], [-1.5]])
    loss = policy_gradient(logp, advantages)
    loss.sum().backward()
    assert torch.equal(loss.detach(), -advantages.expand(2, 3))
    assert logp.grad is not None and torch.equal(logp.grad, -advantages.expand(2, 3))
