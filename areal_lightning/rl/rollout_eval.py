"""The default `evaluate_fn` of `GRPOModule`: roll out each eval prompt `n_samples` times, score, update metrics."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch
from torchmetrics import Metric

from areal_lightning.eval_round import EvalBatch, EvalContext, SamplingParams, cut_at_stop
from areal_lightning.metrics import AccuracyMetric, MajAtK, PassAtK, RewardMetric, Score, ScoringMetric
from areal_lightning.rl.policy import Policy
from areal_lightning.rl.task import PromptTokenizer, RLTask, seeded_generators
from areal_lightning.tasks.arithmetic import CORRECT_REWARD


class RolloutModule(Protocol):
    """What the default evaluation needs of a module; `GRPOModule` has it."""

    # Read-only members (properties): the evaluation only reads them, so a module may hold a
    # narrower type (GRPOModule's policy is a Policy that is also an nn.Module).
    @property
    def policy(self) -> Policy: ...

    @property
    def task(self) -> RLTask: ...

    @property
    def tokenizer(self) -> PromptTokenizer: ...

    @property
    def grpo(self) -> Any: ...

def sampling_of(ctx: EvalContext) -> SamplingParams:
    """The eval set's sampling settings; an `EvalSet` built without them may give n_samples,
    temperature and max_new_tokens in its options (the older way)."""
    if ctx.sampling is not None:
        return ctx.sampling
    keys = ("n_samples", "temperature", "max_new_tokens")
    return SamplingParams(**{k: ctx.options[k] for k in keys if k in ctx.options})

def score_texts(task: Any, texts: Sequence[str], answers: Sequence[str]) -> list[Score]:
    """The task's `score_many` where it has one (statuses for timeouts and parse failures), else its `reward`."""
    if callable(getattr(task, "score_many", None)):
        return task.score_many(list(texts), list(answers))
    return [Score(float(task.reward(t, a))) for t, a in zip(texts, answers, strict=True)]

def default_metrics(n_samples: int) -> dict[str, Callable[[], Metric]]:
    """The metrics the default evaluation keeps for `n_samples` completions per prompt, by name."""
    factories: dict[str, Callable[[], Metric]] = {"reward": RewardMetric, "accuracy": AccuracyMetric}
    for k in sorted({1, n_samples}):
        factories[f"pass@{k}"] = functools.partial(PassAtK, k)
    factories[f"maj@{n_samples}"] = lambda: MajAtK(n_samples)
    return factories

def metric_names(n_samples: int) -> list[str]:
    """Every name a round of the default evaluation logs for an eval set (``reward/mean``, ``pass@4`` ...),
    known before any round runs, so that a threshold on a metric it never logs is refused up front.

    Example:
        >>> metric_names(4)[3:6], "reward/mean" in metric_names(4)
        (['maj@4', 'pass@1', 'pass@4'], True)
    """
    names = []
    for name, factory in default_metrics(n_samples).items():
        metric = factory()
        correct = torch.ones(1, n_samples)
        if isinstance(metric, MajAtK):
            metric.update(torch.zeros(1, n_samples, dtype=torch.long), correct.bool())
        elif isinstance(metric, PassAtK):
            metric.update(correct.bool())
        else:
            metric.update(correct)
        value = metric.compute()
        keys = value.keys() if isinstance(value, dict) else [name]
        names += [key if key == name else f"{name}/{key}" for key in keys]
    return sorted(names)

def rollout_evaluate(module: RolloutModule, batches: Sequence[EvalBatch], ctx: EvalContext) -> dict[str, Any]:
    """Samples `n_samples` completions per prompt, each prompt from its own seed, with the eval
    set's `SamplingParams`; cuts each completion at its first stop string; updates reward,
    accuracy, pass@1, pass@n, maj@n and the scoring failures (``scoring/timeouts``,
    ``scoring/parse_failures``, ``scoring/errors``)."""
    sp = sampling_of(ctx)
    n, temperature = sp.n_samples, sp.temperature
    max_new_tokens = sp.max_new_tokens or module.grpo.max_new_tokens
    metrics = {name: ctx.metric(name, factory) for name, factory in default_metrics(n).items()}
    reward, accuracy, maj = metrics["reward"], metrics["accuracy"], metrics[f"maj@{n}"]
    pass_at = {k: metrics[f"pass@{k}"] for k in sorted({1, n})}
    scoring = ctx.metric("scoring", ScoringMetric)
    tok = module.tokenizer
    for batch in batches:
        samples = batch.samples
        ids, mask = tok.pad_left([tok.encode(s.prompt) for s in samples])
        ids, mask = ids.repeat_interleave(n, 0).to(ctx.device), mask.repeat_interleave(n, 0).to(ctx.device)
        # One generator per prompt, repeated for its n rows: its completions depend on its seed only
        # (on a GPU the generator lives there, seeded alike, so the rows' noise is drawn in place).
        generators = [g for g in seeded_generators(batch.seeds, ctx.device) for _ in range(n)]
        completions = module.policy.generate(ids, mask, max_new_tokens=max_new_tokens, temperature=temperature,
                                             generators=generators, top_p=sp.top_p, top_k=sp.top_k,
                                             stop_at_eos=not ctx.lockstep)
        answers = [s.answer for s in samples for _ in range(n)]
        texts = [cut_at_stop(tok.decode(row), sp.stop) for row in completions.cpu()]
        scores = score_texts(module.task, texts, answers)
        scoring.update(scores)
        rewards = torch.tensor([s.reward for s in scores], dtype=torch.float32, device=ctx.device).view(len(samples), n)
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
        for row, (index, sample) in enumerate(zip(batch.indices, samples, strict=True)):
            ctx.record_sample(index, prompt=sample.prompt, completion=texts[row * n], answer=sample.answer,
                              reward=float(rewards[row, 0]), correct=bool(correct[row, 0]))
    return {}
