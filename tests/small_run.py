"""Command-line overrides that turn the main job's config into a fit of a few seconds (a narrow
policy, a short warm-up, small eval sets, W&B offline), for the tests that run `fit` as a command."""

from __future__ import annotations

SMALL_FIT = [
    "trainer.log_every_n_steps=1",
    "trainer.enable_progress_bar=false",
    "policy.d_model=32",
    "policy.n_heads=2",
    "grpo.warmup_steps=30",
    "grpo.prompts_per_step=4",
    "task.train_size=16",
    "eval_sets.easy.size=6",
    "eval_sets.easy.n_samples=2",
    "eval_sets.hard.size=4",
    "eval_sets.hard.n_samples=2",
    "evaluator.freq_epochs=null",
    "evaluator.freq_secs=null",
    "logger.wandb.mode=offline",
]
