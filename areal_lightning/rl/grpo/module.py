"""`GRPOModule`: group-relative policy optimisation of a language-model policy, as a LightningModule."""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Sequence
from dataclasses import asdict
from enum import Enum
from typing import Any

import lightning as L
import torch
from torch import Tensor
from typing_extensions import override

from areal_lightning.errors import ArgumentError
from areal_lightning.eval_round.sharding import sample_seed
from areal_lightning.metrics import AdvantageMetric, RewardMetric
from areal_lightning.metrics.functional import group_advantages
from areal_lightning.rl.completion_stats import completion_metrics, step_completion_stats
from areal_lightning.rl.engines.generation import Generation, generate_scored
from areal_lightning.rl.episodes.completions import episode_completion_metrics
from areal_lightning.rl.episodes.environments import Environment
from areal_lightning.rl.episodes.evaluation import episode_evaluate
from areal_lightning.rl.episodes.make_environment import episode_parts, episode_values
from areal_lightning.rl.episodes.settings import EpisodeSettings
from areal_lightning.rl.episodes.training import episode_training_step
from areal_lightning.rl.grpo.config import GRPOConfig
from areal_lightning.rl.grpo.objective import k3_kl, policy_gradient
from areal_lightning.rl.grpo.train_data import EpochShuffle, ResumableLoader
from areal_lightning.rl.grpo.warmup import format_warmup
from areal_lightning.rl.harness.evaluation import harness_evaluate, harness_grade, harness_reference, harness_spec
from areal_lightning.rl.harness.tasks import HarnessDoc
from areal_lightning.rl.policy import Policy, TinyPolicy, completion_mask
from areal_lightning.rl.protocols import PromptTokenizer, RLTask, seeded_generators
from areal_lightning.rl.rollout_eval import rollout_evaluate, score_texts
from areal_lightning.tasks.arithmetic import CORRECT_REWARD, ArithmeticTask

log = logging.getLogger(__name__)
TRAIN_STREAM = "train"  # names the per-step rollout seeds, apart from every eval set's


def collate_prompts(samples: Sequence[Any], tokenizer: PromptTokenizer) -> dict[str, Any]:
    """Left-padded prompt ids and mask, plus the samples' answers and indices."""
    ids, mask = tokenizer.pad_left([tokenizer.encode(s.prompt) for s in samples])
    return {
        "prompt_ids": ids,
        "prompt_mask": mask,
        "answers": [s.answer for s in samples],
        "index": torch.tensor([s.index for s in samples]),
    }


class GRPOModule(L.LightningModule):
    """Samples `group_size` completions per prompt, scores them, and optimises the policy-gradient
    objective with group-relative advantages (one update per batch of rollouts).

    Args:
        policy: a `Policy` (`TinyPolicy`, `HFPolicy`).
        task: an `RLTask` (`ArithmeticTask`, `MathTask`): training prompts, reward, answer ids.
        grpo: the GRPO settings (group size, lr, kl_coef, ...).
        seed: seeds warm-up and rollouts; each step's rollouts use their own derived seed, so
            evaluating in between does not change what training samples.
        tokenizer: encodes prompts and decodes completions; None: the policy's `tokenizer`
            (an `HFPolicy`'s), else the task's (the arithmetic task's).
        engine_evaluate_fn: the `evaluate_fn` of an inference engine of its own (`VLLMEvaluator`),
            which `evaluate` hands rounds to; None: `rollout_evaluate` with the policy's `generate`.
        episodes: multi-turn episodes (`EpisodeSettings`) for training and the default evaluation;
            None: one prompt, one completion (docs/multi_turn.md).
        environment: the episodes' `Environment`; None: the one `episodes.env` names, on `task`.

    Raises:
        ValueError: when no tokenizer is given and neither the policy nor the task has one;
            `ArgumentError` (a ValueError) for an impossible `grpo` value.

    Example:
        >>> task = ArithmeticTask()
        >>> tok = task.tokenizer
        >>> policy = TinyPolicy(tok.vocab_size, 32, 1, 2, 16, pad_id=tok.pad_id, eos_id=tok.eos_id)
        >>> GRPOModule(policy, task, GRPOConfig(group_size=4)).grpo.group_size
        4
    """

    def __init__(
        self,
        policy: Policy,
        task: RLTask,
        grpo: GRPOConfig | None = None,
        seed: int = 0,
        tokenizer: PromptTokenizer | None = None,
        engine_evaluate_fn: Callable[[Any, Sequence[Any], Any], dict[str, Any]] | None = None,
        episodes: EpisodeSettings | None = None,
        environment: Environment | None = None,
    ) -> None:
        super().__init__()
        # A policy is also an nn.Module: its parameters are trained, a frozen copy is the KL reference.
        if not isinstance(policy, torch.nn.Module):
            raise ArgumentError("GRPOModule", "policy", policy, "a torch.nn.Module that implements Policy")
        self.policy = policy
        self.task = task
        # The policy's own tokenizer (an HFPolicy's) wins over the task's (the arithmetic task's).
        tokenizer = tokenizer or getattr(policy, "tokenizer", None) or getattr(task, "tokenizer", None)
        if tokenizer is None:
            raise ValueError(
                f"`GRPOModule(tokenizer=None)`: neither {type(policy).__name__} nor {type(task).__name__} "
                "has a `tokenizer`; pass tokenizer=..."
            )
        self.tokenizer: PromptTokenizer = tokenizer
        self.grpo = grpo or GRPOConfig()
        self.grpo.validate()
        self.seed = seed
        # Plain values only: checkpoints must load with torch.load(weights_only=True).
        grpo_values = {k: v.value if isinstance(v, Enum) else v for k, v in asdict(self.grpo).items()}
        self.episodes, self.environment = episode_parts(episodes, environment, task)
        self.save_hyperparameters({"grpo": grpo_values, "seed": seed, "episodes": episode_values(episodes)})
        # The frozen policy of the KL penalty: a registered submodule, so a resume restores it.
        self.reference = copy.deepcopy(policy).requires_grad_(False) if self.grpo.kl_coef > 0 else None
        self.warmed_up = False
        self.engine_evaluate_fn = engine_evaluate_fn
        self.train_reward = RewardMetric()
        self.train_advantage = AdvantageMetric(scale=self.grpo.scale_advantages, std=self.grpo.advantage_std)
        # By their logged names; registered as submodules too (ModuleDict keys take no "/"), so they
        # follow the module to its device.
        # With episodes, per turn too (rl/episodes/completions.py).
        completions = (
            completion_metrics(self.grpo.max_new_tokens)
            if self.episodes is None
            else episode_completion_metrics(self.episodes.max_turns, self.grpo.max_new_tokens)
        )
        self.train_completions = {name: make() for name, make in completions.items()}
        self._train_completion_modules = torch.nn.ModuleDict(
            {name.replace("/", "_"): metric for name, metric in self.train_completions.items()}
        )

    @property
    def uses_format_warmup(self) -> bool:
        """The format warm-up teaches the tiny policy the arithmetic answer format; other policies skip it."""
        task = self._arithmetic_task()
        return isinstance(self.policy, TinyPolicy) and task is not None and self.grpo.warmup_steps > 0

    def _arithmetic_task(self) -> ArithmeticTask | None:
        """The arithmetic task the policy trains on, also where model graders grade it (`GradedTask.inner`)."""
        task = getattr(self.task, "inner", self.task)
        return task if isinstance(task, ArithmeticTask) else None

    @override
    def setup(self, stage: str) -> None:
        # Runs before the strategy wraps the module (no DDP hooks yet) and before a checkpoint is
        # restored; every rank runs the same seeded warm-up, so the weights agree. Lightning names
        # the checkpoint to the module only after this hook (`trainer.ckpt_path` is still None
        # here), so whoever resumes sets `warmed_up = True` first, as `areal-lightning fit --ckpt` does.
        if stage == "fit" and not self.warmed_up and self.uses_format_warmup:
            task = self._arithmetic_task()
            assert isinstance(self.policy, TinyPolicy) and task is not None
            self._announce_warmup()
            format_warmup(self.policy, task, steps=self.grpo.warmup_steps, lr=self.grpo.warmup_lr, seed=self.seed)
            if self.reference is not None:
                self.reference.load_state_dict(self.policy.state_dict())
        self.warmed_up = True

    def _announce_warmup(self) -> None:
        """Says that the format warm-up runs first, and warns when it is longer than the GRPO
        training that follows (``trainer.max_steps`` counts GRPO steps only)."""
        steps = self.grpo.warmup_steps
        max_steps = self.trainer.max_steps if self._trainer is not None else -1
        if 0 <= max_steps < steps:
            log.warning(
                "grpo.warmup_steps=%d format-only steps (no answers learned) run before GRPO step 1, and "
                "trainer.max_steps=%d counts GRPO steps only: most of this run is warm-up; raise "
                "trainer.max_steps or lower grpo.warmup_steps",
                steps,
                max_steps,
            )
        else:
            log.info("format warm-up: %d supervised steps (the answer format only) before GRPO step 1", steps)

    @override
    def train_dataloader(self) -> ResumableLoader:
        # Each epoch's order comes from (seed, epoch) and a checkpoint holds the epoch's position:
        # a resumed run trains on the prompts the uninterrupted one would have (train_data.py).
        samples = self.task.train_samples()
        self._train_samples = {s.index: s for s in samples}  # the prompts episodes are rolled out from
        return ResumableLoader(
            samples,
            batch_size=self.grpo.prompts_per_step,
            sampler=EpochShuffle(samples, self.seed),
            collate_fn=lambda samples: collate_prompts(samples, self.tokenizer),
        )

    @override
    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.policy.parameters(), lr=self.grpo.lr)

    def _rollout_generator(self) -> torch.Generator:
        stream = self.global_step * self.trainer.world_size + self.trainer.global_rank
        return seeded_generators([sample_seed(self.seed, TRAIN_STREAM, stream)], self.device)[0]

    def score(self, completions: Tensor, answers: Sequence[str]) -> tuple[list[str], Tensor]:
        """Decoded completions and their rewards (float32, one per row), scored together by the
        task's `score_many` where it has one (the code task runs its programs in parallel)."""
        texts = [self.tokenizer.decode(row) for row in completions.cpu()]
        scores = score_texts(self.task, texts, answers)
        rewards = torch.tensor([s.reward for s in scores], dtype=torch.float32)
        return texts, rewards.to(completions.device)

    def evaluate(self, batches: Sequence[Any], ctx: Any) -> dict[str, Any]:
        """The default `evaluate_fn` of `EvaluationCallback`: rollouts, reward, accuracy, pass@k, maj@k
        (generated by `engine_evaluate_fn` when the module has one); with `episodes`, `episode_evaluate`
        (through the engine where it runs episodes: ``runs_episodes``, the server engine).
        The sanity pass (``ctx.sanity``) generates with the policy itself: an engine is built where
        rounds run (an async worker), and at the first round in sync mode, not for one batch."""
        harness = harness_spec(getattr(ctx, "options", None)) is not None
        engine = None if getattr(ctx, "sanity", False) else self.engine_evaluate_fn
        # An engine runs what it says it runs (`rl.engines.rounds`); the policy runs the rest.
        kind = "runs_harness" if harness else "runs_episodes" if self.episodes is not None else None
        if engine is not None and (kind is None or getattr(engine, kind, False)):
            return engine(self, batches, ctx)
        if harness:
            return harness_evaluate(self, batches, ctx)  # an lm-evaluation-harness task (docs/harness.md)
        if self.episodes is not None:
            return episode_evaluate(self, batches, ctx)
        return rollout_evaluate(self, batches, ctx)

    @property
    def async_in_thread(self) -> bool:
        """Whether an async round of `evaluate` runs in a thread of the training process, not a
        worker: its engine waits on inference servers (`ServerEvaluator`)."""
        return bool(getattr(self.engine_evaluate_fn, "async_in_thread", False))

    # What the integrity checks at the start of fit read (`callbacks.integrity_checks.IntegritySource`).
    def integrity_train_prompts(self) -> list[str]:
        """Every training prompt of the task."""
        return [s.prompt for s in self.task.train_samples()]

    def integrity_prompt(self, sample: Any) -> str:
        """An eval sample's prompt (a harness document's: its first request's context)."""
        return str(sample.prompt)

    def integrity_reference(self, sample: Any) -> str | None:
        """The task's gold completion of an eval sample (its `reference_completion`); None when it has none."""
        if isinstance(sample, HarnessDoc):
            return harness_reference(sample)
        reference = getattr(self.task, "reference_completion", None)
        return reference(sample) if callable(reference) else None

    def integrity_null(self, sample: Any) -> str | None:
        """The task's null completion of an eval sample (its `null_completion`: a program that solves
        nothing); None when it has none."""
        null = getattr(self.task, "null_completion", None)
        return null(sample) if callable(null) else None

    def integrity_grade(self, completions: Sequence[str], samples: Sequence[Any]) -> list[bool]:
        """Whether the grader that decides correctness in evaluation (a judge where the task has one,
        else the verifier) scores each completion correct for its sample, given its prompt as there."""
        if samples and isinstance(samples[0], HarnessDoc):
            return harness_grade(completions, samples)
        prompts = [self.integrity_prompt(s) for s in samples]
        scores = score_texts(self.task, completions, [s.answer for s in samples], prompts)
        return [s.reward >= CORRECT_REWARD if s.correct is None else s.correct for s in scores]

    @override
    def training_step(self, batch: dict[str, Any], batch_idx: int) -> Tensor:
        if self.episodes is not None:
            return episode_training_step(self, batch, self._train_samples)
        hp = self.grpo
        g = hp.group_size
        ids = batch["prompt_ids"].repeat_interleave(g, dim=0)
        mask = batch["prompt_mask"].repeat_interleave(g, dim=0)
        answers = [a for a in batch["answers"] for _ in range(g)]
        generation = generate_scored(
            self.policy,
            ids,
            mask,
            scores=False,  # the loss's forward below gives them
            max_new_tokens=hp.max_new_tokens,
            temperature=hp.temperature,
            generators=self._rollout_generator(),
        )
        completions = generation.tokens
        texts, rewards = self.score(completions, answers)
        grouped = rewards.view(-1, g)
        advantages = group_advantages(grouped, scale=hp.scale_advantages, std=hp.advantage_std).reshape(-1, 1)

        logp, entropy = self.policy.completion_logprobs(ids, mask, completions, temperature=hp.temperature)
        tokens = completion_mask(completions, self.policy.eos_id).float()
        per_token = policy_gradient(logp, advantages)
        kl = torch.zeros_like(per_token)
        if self.reference is not None:
            with torch.no_grad():
                ref_logp, _ = self.reference.completion_logprobs(ids, mask, completions, temperature=hp.temperature)
            kl = k3_kl(ref_logp, logp)
            per_token = per_token + hp.kl_coef * kl
        n_tokens = tokens.sum().clamp(min=1)
        loss = (per_token * tokens).sum() / n_tokens  # token-mean over the whole batch

        reward_stats = self.train_reward(rewards)
        adv_stats = self.train_advantage(grouped)
        token_mean = lambda x: (x * tokens).sum() / n_tokens  # noqa: E731
        self.log("train/reward", reward_stats["mean"], prog_bar=True, batch_size=len(texts))
        self.log_dict(
            {
                "train/reward_std": reward_stats["std"],
                "train/advantage_mean": adv_stats["mean"],
                "train/advantage_std": adv_stats["std"],
                "train/advantage_abs_mean": adv_stats["abs_mean"],
                "train/zero_std_frac": adv_stats["zero_std_frac"],
                "train/kl": token_mean(kl.detach()),
                "train/loss": loss.detach(),
            },
            batch_size=len(texts),
        )
        self._log_completion_stats(generation, texts, (logp, entropy, tokens.bool()))
        return loss

    def _log_completion_stats(self, generation: Generation, texts: Sequence[str], scores: tuple[Tensor, ...]) -> None:
        """``train/completion/...``: the evaluation's completion statistics of this step's rollouts,
        over every rank's (the same on any number of ranks); log-probability and entropy are the
        loss's, at the training temperature."""
        answer_ids = [self.task.answer_id(t) for t in texts]
        logp, entropy, mask = scores
        values = step_completion_stats(
            self.train_completions, generation, self.policy.eos_id, answer_ids, scores=(logp, entropy, mask)
        )
        self.log_dict(values, batch_size=len(texts))

    @override
    def on_train_epoch_end(self) -> None:
        self.train_reward.reset()
        self.train_advantage.reset()

    @override
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["grpo_warmed_up"] = self.warmed_up

    @override
    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.warmed_up = checkpoint.get("grpo_warmed_up", True)
