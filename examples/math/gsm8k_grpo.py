"""GRPO of a local Hugging Face model on GSM8K with a custom `evaluate_fn` in four steps.

The config is `examples/math/gsm8k_grpo.yaml` (overrides as ``key=value`` arguments); the module,
the eval sets, the callback and the Trainer come from our builders, and only the evaluation is
the user's: besides reward and accuracy it records how long completions are and how often no
final answer can be found (a model that rambles past max_new_tokens shows up there first).

Run:
    python examples/math/gsm8k_grpo.py policy.path=/models/qwen2.5-0.5b-instruct \
        task.path=data/gsm8k/train.jsonl eval_sets.gsm8k.path=data/gsm8k/test.jsonl
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torchmetrics import MeanMetric

from areal_lightning.app.builders import build_callback, build_eval_sets, build_module, build_trainer
from areal_lightning.app.config import load_config, save_config
from areal_lightning.app.runs import RunDirError, start_run
from areal_lightning.eval_round import EvalBatch, EvalContext
from areal_lightning.metrics import AccuracyMetric, RewardMetric
from areal_lightning.rl.grpo import GRPOModule
from areal_lightning.rl.policy import completion_mask
from areal_lightning.rl.protocols import seeded_generators
from areal_lightning.rl.rollout_eval import sampling_of
from areal_lightning.tasks.math_answers import final_answer

CONFIG = Path(__file__).with_name("gsm8k_grpo.yaml")


def evaluate_gsm8k(module: GRPOModule, batches: Sequence[EvalBatch], ctx: EvalContext) -> dict[str, Any]:
    """Prepare data, run inference, compute rewards, record metrics (the callback has already put
    the module in eval mode under `torch.no_grad()`, and reduces the metrics across ranks)."""
    sampling = sampling_of(ctx)  # the eval set's n_samples, temperature, top_p, top_k, max_new_tokens
    n = sampling.n_samples
    reward = ctx.metric("reward", RewardMetric)  # reduced exactly across ranks
    accuracy = ctx.metric("accuracy", AccuracyMetric)
    tokens = ctx.metric("completion_tokens", MeanMetric)
    no_answer = ctx.metric("no_answer_frac", MeanMetric)
    tok = module.tokenizer
    for batch in batches:
        # 1. prepare data: n rows per prompt, one generator per prompt seeded with its own seed
        ids, mask = tok.pad_left([tok.encode(s.prompt) for s in batch.samples])
        ids, mask = ids.repeat_interleave(n, 0).to(ctx.device), mask.repeat_interleave(n, 0).to(ctx.device)
        generators = [g for g in seeded_generators(batch.seeds, ctx.device) for _ in range(n)]
        # 2. run inference
        completions = module.policy.generate(
            ids,
            mask,
            max_new_tokens=sampling.max_new_tokens or module.grpo.max_new_tokens,
            temperature=sampling.temperature,
            generators=generators,
            top_p=sampling.top_p,
            top_k=sampling.top_k,
        )
        # 3. compute rewards
        texts = [tok.decode(row) for row in completions.cpu()]
        answers = [s.answer for s in batch.samples for _ in range(n)]
        rewards = torch.tensor(
            [module.task.reward(t, a) for t, a in zip(texts, answers, strict=True)], device=ctx.device
        )
        # 4. record metrics
        reward.update(rewards)
        accuracy.update(rewards)  # correct: reward above the metric's threshold
        tokens.update(completion_mask(completions, module.policy.eos_id).sum(dim=1).float())
        no_answer.update(torch.tensor([final_answer(t) is None for t in texts], dtype=torch.float32, device=ctx.device))
        ctx.num_samples += len(texts)
        for row, (index, sample) in enumerate(zip(batch.indices, batch.samples, strict=True)):
            ctx.record_sample(
                index,
                prompt=sample.prompt,
                completion=texts[row * n],
                answer=sample.answer,
                reward=float(rewards[row * n]),
            )
    return {}


def main(overrides: Sequence[str]) -> int:
    cfg = load_config(CONFIG, list(overrides))
    try:
        cfg = start_run(cfg)  # one run id: config.yaml, history, checkpoints, W&B (as `fit` does)
    except RunDirError as err:
        print(f"gsm8k_grpo.py: error: {err}", file=sys.stderr)
        return 2
    module = build_module(cfg)
    callback = build_callback(cfg, build_eval_sets(cfg), evaluate_fn=evaluate_gsm8k)
    trainer = build_trainer(cfg, [callback])
    if trainer.is_global_zero:
        save_config(cfg, cfg.output_dir)
    trainer.fit(module)
    print(f"run {cfg.run_id}; eval history: {Path(cfg.output_dir) / 'eval_history.jsonl'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
