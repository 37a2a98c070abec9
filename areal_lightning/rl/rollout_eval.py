"""The default `evaluate_fn` of `GRPOModule`: roll out each eval prompt `n_samples` times, score, update metrics.

Bad data, as the round sees it:

* a reward that is NaN or infinite is counted in ``reward/non_finite`` (every round logs it, 0
  when all rewards are finite) and reported in a warning naming the samples; ``reward/*`` are over
  the finite rewards only, and accuracy, pass@k and maj@k count the sample as incorrect;
* a task's `reward` that raises fails the round (then ``on_error`` applies) with a `RewardError`
  naming the function, the eval set, the sample, its prompt and the completion (a task scored by
  a `SafeScorer` counts such samples in ``scoring/errors`` instead);
* a completion is never longer than ``max_new_tokens``; a prompt plus ``max_new_tokens`` beyond
  the policy's ``max_len`` fails the round before any generation, naming both numbers;
* completions of any length vote in maj@k (answer ids are renumbered per prompt, so a long run
  of digits is still one answer).
"""

from __future__ import annotations

import functools
import logging
import traceback
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import Tensor
from torchmetrics import Metric, SumMetric

from areal_lightning.errors import ArgumentError
from areal_lightning.eval_round import EvalBatch, EvalContext, SamplingParams, cut_at_stop
from areal_lightning.eval_round.sampling_params import check_ks
from areal_lightning.metrics import (
    AccuracyMetric,
    LabelCountMetric,
    MajAtK,
    PassAtK,
    PassHatK,
    RewardMetric,
    ScoringMetric,
)
from areal_lightning.rl.completion_stats import completion_metrics, update_completion_metrics
from areal_lightning.rl.engines.generation import Generation, generate_scored
from areal_lightning.rl.policy import Policy
from areal_lightning.rl.protocols import PromptTokenizer, RLTask, seeded_generators
from areal_lightning.scoring import Score, ScoreLabels, ScorerFailingError
from areal_lightning.tasks.arithmetic import CORRECT_REWARD, NO_ANSWER_ID, WRONG_REWARD

TOKEN_SCORES_OPTION = "token_scores"
"""`EvalSet.options` key: False skips the engine's per-token scores (completion/logprob and /entropy are NaN)."""
NON_FINITE_KEY = "reward/non_finite"
"""Samples of a round whose reward was NaN or infinite (left out of ``reward/*``, counted incorrect)."""
MAX_INDICES_SHOWN = 5

log = logging.getLogger(__name__)


class RewardError(RuntimeError):
    """The task's reward function raised on one completion; `row` is the completion's row in the batch."""

    def __init__(self, message: str, row: int | None = None) -> None:
        super().__init__(message)
        self.row = row


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
    temperature and max_new_tokens in its `options` instead."""
    if ctx.sampling is not None:
        return ctx.sampling
    keys = ("n_samples", "temperature", "max_new_tokens", "ks")
    try:
        return SamplingParams(**{k: ctx.options[k] for k in keys if k in ctx.options})
    except ArgumentError as err:
        raise ArgumentError(
            "EvalSet", f"options[{err.arg!r}]", err.value, err.accepted, f"eval set {ctx.dataset!r}: {err}"
        ) from None


def _score_all(task: Any, texts: Sequence[str], answers: Sequence[str], prompts: Sequence[str] | None) -> list[Score]:
    if prompts is not None and callable(getattr(task, "score_rollouts", None)):  # a grader that reads the prompt
        return task.score_rollouts(list(prompts), list(texts), list(answers))
    if callable(getattr(task, "score_many", None)):
        return task.score_many(list(texts), list(answers))
    return [Score(float(task.reward(t, a))) for t, a in zip(texts, answers, strict=True)]


def _where_raised(err: BaseException) -> str:
    """The function that raised, with its file and line (the innermost frame of the traceback)."""
    frames = traceback.extract_tb(err.__traceback__)
    if not frames:
        return ""
    frame = frames[-1]
    return f" in {frame.name} ({Path(frame.filename).name}:{frame.lineno})"


def score_texts(
    task: Any, texts: Sequence[str], answers: Sequence[str], prompts: Sequence[str] | None = None
) -> list[Score]:
    """The task's `score_rollouts` (given `prompts`) or `score_many` where it has one (statuses for
    timeouts and parse failures), else its `reward`.

    Raises:
        RewardError: the scoring raised; it names the task, the function that raised and, found by
            scoring the completions one at a time, the first completion it raises on (its `row`).
        ScorerFailingError: as the task's `SafeScorer` raised it (it is not scored again sample by sample).
    """
    try:
        return _score_all(task, texts, answers, prompts)
    except ScorerFailingError:
        raise  # a broken scorer, already worded; scoring again would wait on its time limits again
    except Exception as err:
        for row, (text, answer) in enumerate(zip(texts, answers, strict=True)):  # the failure path only
            try:
                _score_all(task, [text], [answer], None if prompts is None else [prompts[row]])
            except Exception as one:
                raise RewardError(
                    f"{type(task).__name__}'s scoring raised {type(one).__name__}: {one}"
                    f"{_where_raised(one)} on completion {text!r} (answer {answer!r})",
                    row,
                ) from one
        raise RewardError(
            f"{type(task).__name__}'s scoring raised {type(err).__name__}: {err}{_where_raised(err)}"
        ) from err


def default_metrics(
    n_samples: int, ks: Sequence[int] | None = None, max_new_tokens: int = 1
) -> dict[str, Callable[[], Metric]]:
    """The metrics the default evaluation keeps for `n_samples` completions per prompt, by name:
    pass@k, pass^k and maj@k (each with its standard error) for every k of `ks` (None: 1 and
    `n_samples`), and the completion statistics of completions of at most `max_new_tokens`."""
    factories: dict[str, Callable[[], Metric]] = {"reward": RewardMetric, "accuracy": AccuracyMetric}
    for k in check_ks(ks, n_samples) if ks is not None else sorted({1, n_samples}):
        for cls in (PassAtK, PassHatK, MajAtK):
            factories[f"{cls.symbol}{k}"] = functools.partial(cls, k, stderr=True)
    factories[NON_FINITE_KEY] = lambda: SumMetric(nan_strategy="disable").set_dtype(torch.float64)
    factories.update(completion_metrics(max_new_tokens))
    return factories


def _never() -> bool:
    return False


OUTCOME_METRICS = ("accuracy", "reward/mean")
"""The metrics whose per-prompt outcomes the default evaluation records (``ctx.record_outcomes``):
the only ones a noise-aware ``best_rule`` (lcb, paired) can rank."""


def metric_names_of(factories: Mapping[str, Callable[[], Metric]]) -> list[str]:
    """The names the metrics of `factories` log (a mapping result logs ``<name>/<key>`` for each key)."""
    names = []
    for name, factory in factories.items():
        metric = factory()
        # Local names only: config checks run on one rank at times (a resumed run's copy of the config
        # on rank 0, the watcher's W&B config on rank 0), where a synced compute() would wait in a
        # collective the other ranks never join. `sync_on_compute = False` set after construction is
        # not enough (torchmetrics reads it at construction); no process group means no sync at all.
        metric.distributed_available_fn = _never
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "compute before update": only the names are wanted
            value = metric.compute()
        keys = value.keys() if isinstance(value, dict) else [name]
        names += [key if key == name else f"{name}/{key}" for key in keys]
    return names


def metric_names(n_samples: int, labels: Sequence[ScoreLabels] = (), ks: Sequence[int] | None = None) -> list[str]:
    """Every name a round of the default evaluation logs for an eval set (``reward/mean``, ``pass@4`` ...,
    ``completion/length/mean`` ..., and the counts of a task's `labels`), for the eval set's `ks`, known
    before any round runs, so that a threshold on a metric it never logs is refused up front.

    Example:
        >>> metric_names(4)[:3], "pass@4/stderr" in metric_names(4), "pass@2" in metric_names(4, ks=[2, 4])
        (['accuracy', 'accuracy/ci_high', 'accuracy/ci_low'], True, True)
    """
    names = metric_names_of(default_metrics(n_samples, ks))
    return sorted(names + [name for group in labels for name in group.names()])


def _per_prompt_answer_ids(answer_ids: Sequence[int], n: int) -> list[int]:
    """Each prompt's answers renumbered 0, 1, ... in order of first appearance (``NO_ANSWER_ID`` kept).

    maj@k only compares answers within a prompt, and first appearance is its tie-break too, so the
    vote is unchanged; the ids stay small whatever the completions hold (``int("7" * 30)`` does not
    fit a tensor).

    Example:
        >>> _per_prompt_answer_ids([10**30, 5, 10**30, -1, 7, 7], n=3)
        [0, 1, 0, -1, 0, 0]
    """
    out = []
    for start in range(0, len(answer_ids), n):
        seen: dict[int, int] = {}
        for answer in answer_ids[start : start + n]:
            out.append(NO_ANSWER_ID if answer == NO_ANSWER_ID else seen.setdefault(answer, len(seen)))
    return out


def _check_fits(module: RolloutModule, prompt_ids: Tensor, max_new_tokens: int, ctx: EvalContext) -> None:
    """Refuses, before any forward, a prompt plus completion longer than the policy's positions."""
    max_len = getattr(module.policy, "max_len", None)
    needed = prompt_ids.shape[1] + max_new_tokens
    if isinstance(max_len, int) and needed > max_len:
        raise ValueError(
            f"eval set {ctx.dataset!r}: its longest prompt ({prompt_ids.shape[1]} tokens) plus max_new_tokens="
            f"{max_new_tokens} is {needed} tokens, more than the policy's max_len={max_len}; lower the eval set's "
            "max_new_tokens or raise policy.max_len"
        )


def _score(task: Any, texts: list[str], answers: list[str], batch: EvalBatch, n: int, ctx: EvalContext) -> list[Score]:
    try:
        return score_texts(task, texts, answers, [s.prompt for s in batch.samples for _ in range(n)])
    except Exception as err:
        row = getattr(err, "row", None)
        if row is None:
            where = f"one of the samples {batch.indices}"
        else:
            where = f"sample {batch.indices[row // n]} (prompt {batch.samples[row // n].prompt!r})"
        raise RewardError(f"the reward of eval set {ctx.dataset!r} failed on {where}: {err}", row) from err


def _report_non_finite(rewards: Tensor, batch: EvalBatch, ctx: EvalContext) -> Tensor:
    """The finite mask of `rewards` [P, n]; a warning names the samples with a NaN or infinite reward."""
    finite = torch.isfinite(rewards)
    if not bool(finite.all()):
        bad = [batch.indices[p] for p in (~finite).any(dim=1).nonzero().flatten().tolist()]
        shown = ", ".join(map(str, bad[:MAX_INDICES_SHOWN])) + (" ..." if len(bad) > MAX_INDICES_SHOWN else "")
        log.warning(
            "eval set %r, step %d, rank %d: %d NaN or infinite reward(s) on samples %s; counted in %s, left out "
            "of reward/*, counted incorrect",
            ctx.dataset,
            ctx.global_step,
            ctx.rank,
            int((~finite).sum()),
            shown,
            NON_FINITE_KEY,
        )
    return finite


def _count_outcomes(task: Any, scores: Sequence[Score], scoring: Metric, ctx: EvalContext) -> None:
    """Counts the scoring failures, and a task's own outcomes (``code/timeout``, ...) when it declares
    them (`ScoreLabels`)."""
    scoring.update(scores)
    for labels in getattr(task, "score_labels", ()):
        ctx.metric(labels.prefix, functools.partial(LabelCountMetric, labels)).update(scores)


def _correctness(scores: Sequence[Score], rewards: Tensor, finite: Tensor) -> tuple[Tensor, Tensor]:
    """Each sample's correctness [P, n] (``Score.correct``, else ``reward >= 1``, and finite), and
    what accuracy counts: the rewards, or the correctness when a score states it (a continuous reward)."""
    verdicts = [s.reward >= CORRECT_REWARD if s.correct is None else s.correct for s in scores]
    correct = finite & torch.tensor(verdicts, device=rewards.device).view(rewards.shape)
    stated = any(s.correct is not None for s in scores)
    return correct, correct.float() if stated else rewards


def _generate(
    module: RolloutModule, batch: EvalBatch, ctx: EvalContext, sp: SamplingParams, max_new_tokens: int
) -> tuple[Generation, list[str]]:
    """The batch's `n_samples` completions per prompt and their decoded texts (before the stop-string cut)."""
    n, tok = sp.n_samples, module.tokenizer
    ids, mask = tok.pad_left([tok.encode(s.prompt) for s in batch.samples])
    _check_fits(module, ids, max_new_tokens, ctx)
    ids, mask = ids.repeat_interleave(n, 0).to(ctx.device), mask.repeat_interleave(n, 0).to(ctx.device)
    # One generator per prompt, repeated for its n rows: its completions depend on its seed only
    # (on a GPU the generator lives there, seeded alike, so the rows' noise is drawn in place).
    generators = [g for g in seeded_generators(batch.seeds, ctx.device) for _ in range(n)]
    generation = generate_scored(
        module.policy,
        ids,
        mask,
        stop=sp.stop,
        scores=bool(ctx.options.get(TOKEN_SCORES_OPTION, True)),
        max_new_tokens=max_new_tokens,
        temperature=sp.temperature,
        generators=generators,
        top_p=sp.top_p,
        top_k=sp.top_k,
        stop_at_eos=not ctx.lockstep,
    )
    return generation, [tok.decode(row) for row in generation.tokens.cpu()]


def _evaluate_batch(
    module: RolloutModule,
    batch: EvalBatch,
    ctx: EvalContext,
    sp: SamplingParams,
    max_new_tokens: int,
    metrics: dict[str, Any],
) -> None:
    n, samples = sp.n_samples, batch.samples
    generation, raw_texts = _generate(module, batch, ctx, sp, max_new_tokens)
    answers = [s.answer for s in samples for _ in range(n)]
    texts = [cut_at_stop(text, sp.stop) for text in raw_texts]
    scores = _score(module.task, texts, answers, batch, n, ctx)
    _count_outcomes(module.task, scores, metrics["scoring"], ctx)
    rewards = torch.tensor([s.reward for s in scores], dtype=torch.float32, device=ctx.device).view(len(samples), n)
    finite = _report_non_finite(rewards, batch, ctx)
    correct, judged = _correctness(scores, rewards, finite)
    raw_ids = [module.task.answer_id(t) for t in texts]
    answer_ids = _per_prompt_answer_ids(raw_ids, n)
    metrics["reward"].update(rewards[finite])
    metrics["accuracy"].update(torch.where(finite, judged, torch.full_like(rewards, WRONG_REWARD)))
    metrics[NON_FINITE_KEY].update((~finite).sum().double())
    # Per-prompt outcomes pair this round with earlier ones (eval/<set>/accuracy/delta).
    accuracy, reward = OUTCOME_METRICS
    ctx.record_outcomes(accuracy, batch.indices, correct.double().mean(1))
    scored = torch.where(finite, rewards, torch.full_like(rewards, WRONG_REWARD))
    ctx.record_outcomes(reward, batch.indices, scored.double().mean(1))
    for k in sp.at_ks:
        metrics[f"{PassAtK.symbol}{k}"].update(correct)
        metrics[f"{PassHatK.symbol}{k}"].update(correct)
        metrics[f"{MajAtK.symbol}{k}"].update(
            torch.tensor(answer_ids, device=ctx.device).view(len(samples), n), correct
        )
    stop_in_text = torch.tensor([len(c) < len(r) for c, r in zip(texts, raw_texts, strict=True)], dtype=torch.bool)
    update_completion_metrics(metrics, generation, module.policy.eos_id, raw_ids, stop_in_text)
    ctx.num_samples += rewards.numel()
    for row, (index, sample) in enumerate(zip(batch.indices, samples, strict=True)):
        ctx.record_sample(
            index,
            prompt=sample.prompt,
            completion=texts[row * n],
            answer=sample.answer,
            reward=float(rewards[row, 0]),
            correct=bool(correct[row, 0]),
        )


def rollout_evaluate(module: RolloutModule, batches: Sequence[EvalBatch], ctx: EvalContext) -> dict[str, Any]:
    """Samples `n_samples` completions per prompt, each prompt from its own seed, with the eval
    set's `SamplingParams`; cuts each completion at its first stop string; updates reward,
    accuracy, pass@k, pass^k and maj@k for each of the set's `ks` (with standard errors), the
    completion statistics (``completion/length/...``, ``completion/truncated`` ...:
    `rl.completion_stats`), the scoring failures (``scoring/timeouts``, ``scoring/parse_failures``,
    ``scoring/errors``), a task's own outcome counts (``code/timeout`` ...: its `score_labels`) and the
    count of non-finite rewards (module docstring).

    Raises:
        RewardError: the task's reward raised; the message names the eval set, the sample and the cause.
        ValueError: a prompt plus ``max_new_tokens`` does not fit the policy's ``max_len``.
    """
    sp = sampling_of(ctx)
    max_new_tokens = sp.max_new_tokens or module.grpo.max_new_tokens
    factories = default_metrics(sp.n_samples, sp.at_ks, max_new_tokens)
    metrics: dict[str, Any] = {name: ctx.metric(name, factory) for name, factory in factories.items()}
    metrics["scoring"] = ctx.metric("scoring", ScoringMetric)
    for batch in batches:
        _evaluate_batch(module, batch, ctx, sp, max_new_tokens, metrics)
    return {}
