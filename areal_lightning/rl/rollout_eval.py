"""The default `evaluate_fn` of `GRPOModule`: roll out each eval prompt `n_samples` times, score, update metrics."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import torch
from torch import Tensor

from areal_lightning.eval_round import EvalBatch, EvalContext
from areal_lightning.metrics import AccuracyMetric, MajAtK, PassAtK, RewardMetric
from areal_lightning.rl.policy import Policy
from areal_lightning.tasks.arithmetic import CORRECT_REWARD, ArithmeticTask, Sample

DEFAULT_N_SAMPLES = 4
DEFAULT_EVAL_TEMPERATURE = 0.6


class RolloutModule(Protocol):
    """What the default evaluation needs of a module; `GRPOModule` has it."""

    policy: Policy
    task: ArithmeticTask

    @property
    def grpo(self) -> Any: ...

    def score(self, completions: Tensor, answers: Sequence[str]) -> tuple[list[str], Tensor]: ...


def rollout_evaluate(module: RolloutModule, batches: Sequence[EvalBatch], ctx: EvalContext) -> dict[str, Any]:
    """Samples `n_samples` completions per prompt, each prompt from its own seed, and updates
    reward, accuracy, pass@1, pass@n and maj@n."""
    n = int(ctx.options.get("n_samples", DEFAULT_N_SAMPLES))
    temperature = float(ctx.options.get("temperature", DEFAULT_EVAL_TEMPERATURE))
    max_new_tokens = int(ctx.options.get("max_new_tokens", module.grpo.max_new_tokens))
    reward = ctx.metric("reward", RewardMetric)
    accuracy = ctx.metric("accuracy", AccuracyMetric)
    pass_at = {k: ctx.metric(f"pass@{k}", lambda k=k: PassAtK(k)) for k in sorted({1, n})}
    maj = ctx.metric(f"maj@{n}", lambda: MajAtK(n))
    tok = module.task.tokenizer
    for batch in batches:
        samples: list[Sample] = batch.samples
        ids, mask = tok.pad_left([tok.encode(s.prompt) for s in samples])
        ids, mask = ids.repeat_interleave(n, 0).to(ctx.device), mask.repeat_interleave(n, 0).to(ctx.device)
        # One generator per prompt, repeated for its n rows: its completions depend on its seed only.
        generators = [g for seed in batch.seeds for g in [torch.Generator().manual_seed(seed)] * n]
        completions = module.policy.generate(ids, mask, max_new_tokens=max_new_tokens, temperature=temperature,
                                             generators=generators)
        answers = [s.answer for s in samples for _ in range(n)]
        texts, rewards = module.score(completions, answers)
        rewards = rewards.view(len(samples), n)
        correct = rewards >= CORRECT_REWARD
        answer_ids = torch.tensor([module.task.answer_id(t) for t in texts], device=ctx.device).view(len(samples), n)
        reward.update(rewards)
        accuracy.update(rewards)
        # Per-prompt outcomes pair this round with earlier ones (eval/<set>/accuracy/delta).
        ctx.record_outcomes("accuracy", batch.indices, correct.double().mean(1))
        ctx.record_outcomes("reward/mean", batch.indices, rewards.double().mean(1))
        for metric in pass_at.values():
            metric.update(correct)
        maj.update(answer_ids, correct)
        ctx.num_samples += rewards.numel()
        for row, (index, sample) in enumerate(zip(batch.indices, samples)):
            ctx.record_sample(index, prompt=sample.prompt, completion=texts[row * n], answer=sample.answer,
                              reward=float(rewards[row, 0]), correct=bool(correct[row, 0]))
    return {}
