"""The default `evaluate_fn` of `GRPOModule`: roll out each eval prompt `n_samples` times, score, update metrics."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from areal_lightning.config import Config
from areal_lightning.data.eval_sets import EvalSet
from areal_lightning.data.tasks import CORRECT_REWARD, ArithmeticTask, Sample
from areal_lightning.eval_round import EvalBatch, EvalContext
from areal_lightning.metrics import AccuracyMetric, MajAtK, PassAtK, RewardMetric
from areal_lightning.rl.grpo import GRPOModule

DEFAULT_N_SAMPLES = 4
DEFAULT_EVAL_TEMPERATURE = 0.6


def arithmetic_eval_sets(cfg: Config, task: ArithmeticTask) -> list[EvalSet]:
    """The config's eval sets, in config order; a sample's cost is its prompt length."""
    out = []
    for name, es in cfg.eval_sets.items():
        options = {"n_samples": es.n_samples, "temperature": es.temperature,
                   "max_new_tokens": es.max_new_tokens or cfg.grpo.max_new_tokens}
        out.append(EvalSet(name=name, samples=task.make_samples(name, es.digits, es.size), batch_size=es.batch_size,
                           cost_fn=lambda s: float(len(s.prompt)), key_fn=lambda s: s.key,
                           max_batch_cost=es.max_batch_cost, options=options))
    return out


def rollout_evaluate(module: GRPOModule, batches: Sequence[EvalBatch], ctx: EvalContext) -> dict[str, Any]:
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
        for metric in pass_at.values():
            metric.update(correct)
        maj.update(answer_ids, correct)
        ctx.num_samples += rewards.numel()
        for row, (index, sample) in enumerate(zip(batch.indices, samples)):
            ctx.record_sample(index, prompt=sample.prompt, completion=texts[row * n], answer=sample.answer,
                              reward=float(rewards[row, 0]), correct=bool(correct[row, 0]))
    return {}
