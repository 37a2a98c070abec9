"""`Config`: a whole run, one section per concern, and the checks that span sections."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from areal_lightning.app.config_errors import ConfigError, at_least, owned_by_key
from areal_lightning.app.episode_checks import episode_config_problem
from areal_lightning.app.file_checks import has_chat_template
from areal_lightning.app.lightning_names import check_lightning_names
from areal_lightning.app.metric_checks import check_metric_names
from areal_lightning.app.sections.eval_sets import EvalSetConfig
from areal_lightning.app.sections.evaluator import EvaluatorConfig
from areal_lightning.app.sections.graders import GradersConfig
from areal_lightning.app.sections.logger import LoggerConfig
from areal_lightning.app.sections.policy import EvalEngine, PolicyConfig, PolicyKind
from areal_lightning.app.sections.task import TaskConfig, TaskName
from areal_lightning.app.sections.trainer import TrainerConfig
from areal_lightning.rl.episodes.settings import EpisodeSettings
from areal_lightning.rl.grpo.config import GRPOConfig
from areal_lightning.tasks.math import PromptStyle


@dataclass
class Config:
    """A whole run: experiment identity, then one section per concern."""

    experiment_name: str = "arith-grpo"
    """Name of the experiment; part of output_dir."""
    trial_name: str = "trial0"
    """Name of this trial of the experiment; part of output_dir."""
    seed: int = 1
    """Seeds the model, the data and every evaluation sample."""
    output_dir: str = "runs/${experiment_name}/${trial_name}"
    """Where the run writes config.yaml, eval_history.jsonl, checkpoints and logs."""
    run_id: Optional[str] = None
    """The run's identity, decided by `fit` (a new id for a new run, the checkpoint's when resuming)
    and written here in config.yaml; a value given on input is replaced."""
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    graders: GradersConfig = field(default_factory=GradersConfig)
    """A reward model and/or a judge grading evaluation rollouts beside the task's verifier (docs/model_graders.md)."""
    grpo: GRPOConfig = field(default_factory=GRPOConfig)
    episodes: Optional[EpisodeSettings] = None
    """Multi-turn episodes for training and evaluation, e.g. {max_turns: 4}; null: one prompt, one completion."""
    eval_sets: dict[str, EvalSetConfig] = field(default_factory=dict)
    evaluator: EvaluatorConfig = field(default_factory=EvaluatorConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)

    def __post_init__(self) -> None:
        at_least("seed", self.seed, 0)
        for section in ("trainer", "policy", "task", "graders"):
            getattr(self, section).check(section)
        with owned_by_key("grpo"):
            self.grpo.validate()
        self.evaluator.check("evaluator")
        if not self.eval_sets:
            raise ConfigError("eval_sets is empty; define at least one, e.g. eval_sets: {easy: {digits: 1, size: 200}}")
        for name, eval_set in self.eval_sets.items():
            eval_set.check(f"eval_sets.{name}", self.task.name)
        self._check_kinds_agree()
        self._check_training_left()
        if self.episodes is not None:
            with owned_by_key("episodes"):
                self.episodes.validate()
            problem = episode_config_problem(self)
            if problem:
                raise ConfigError(problem)
            if self.graders.given:
                raise ConfigError(
                    "graders grade single-turn evaluation rollouts, and an episodes section is scored turn by "
                    "turn by the task's verifier: remove the graders section or the episodes section"
                )
        self._check_sequence_lengths()
        check_metric_names(
            self.evaluator.decisions,
            self.eval_sets,
            self.task.name,
            self.episodes,
            judge=self.graders.judge is not None,
        )
        check_lightning_names(self.trainer, "trainer")  # last: it imports Lightning

    def _check_training_left(self) -> None:
        """Eval sets held out of training (``task.hold_out_eval``) must leave training some problems."""
        from areal_lightning.app.eval_prompts import held_out_prompts
        from areal_lightning.tasks.arithmetic import ArithmeticTask, distinct_problems

        if self.task.name is not TaskName.ARITHMETIC or not self.task.hold_out_eval:
            return
        digits = self.task.train_digits
        same = {n: es for n, es in self.eval_sets.items() if es.arithmetic_digits == digits}
        if sum(es.arithmetic_size() for es in same.values()) < distinct_problems(digits):
            return  # they cannot hold every problem out
        try:
            ArithmeticTask(digits, self.task.train_size, self.seed, held_out_prompts(same, digits, self.seed))
        except ValueError:
            sizes = ", ".join(f"eval_sets.{n}.size={es.arithmetic_size()}" for n, es in same.items())
            raise ConfigError(
                f"the eval sets of {digits}-digit additions ({sizes}) hold every one of the "
                f"{distinct_problems(digits)} problems out of training (task.hold_out_eval: true): give them "
                "smaller sizes, or set task.hold_out_eval: false to train on the eval prompts too"
            ) from None

    def _check_sequence_lengths(self) -> None:
        """The longest prompt plus its completion must fit policy.max_len, or every round would fail."""
        from areal_lightning.tasks.arithmetic import ArithmeticTask, operand_range

        if self.policy.kind is not PolicyKind.TINY or self.task.name is not TaskName.ARITHMETIC:
            return  # a loaded model's context length is the model's own

        tokenizer = ArithmeticTask().tokenizer
        uses = [("task.train_digits", self.task.train_digits, "grpo.max_new_tokens", self.grpo.max_new_tokens)]
        for name, es in self.eval_sets.items():
            key = f"eval_sets.{name}.max_new_tokens" if es.max_new_tokens is not None else "grpo.max_new_tokens"
            digits = es.digits or 1  # an arithmetic set's default digits
            uses.append((f"eval_sets.{name}.digits", digits, key, es.max_new_tokens or self.grpo.max_new_tokens))
        for digits_key, digits, tokens_key, new_tokens in uses:
            high = operand_range(digits)[1]
            needed = len(tokenizer.encode(f"{high}+{high}=")) + new_tokens
            if needed > self.policy.max_len:
                raise ConfigError(
                    f"policy.max_len must be at least {needed} for {digits_key}={digits} and {tokens_key}={new_tokens} "
                    f"(longest prompt plus completion, in tokens), got {self.policy.max_len}"
                )

    def _check_harness_runs(self, name: str) -> None:
        """A harness set is generated by a transformers model through the policy (its tokenizer encodes the prompts)."""
        if self.policy.kind is not PolicyKind.HF:
            raise ConfigError(
                f"eval_sets.{name}.harness needs policy.kind: hf (a transformers model and its tokenizer); "
                f"got policy.kind: {self.policy.kind.value}"
            )
        harness = self.eval_sets[name].harness
        if self.policy.eval_engine is not EvalEngine.POLICY and harness is not None and harness.scores_choices():
            raise ConfigError(
                f"eval_sets.{name}.harness is a multiple-choice task: it scores each choice's log-probability "
                f"after the prompt, which policy.eval_engine: {self.policy.eval_engine.value} does not give "
                "(it returns sampled tokens' log-probabilities only); "
                "set policy.eval_engine: policy (the HF model scores them)"
            )
        if self.episodes is not None:
            raise ConfigError(
                f"eval_sets.{name}.harness runs single-turn requests: remove the episodes section "
                "(episodes do not run harness tasks)"
            )

    def _check_kinds_agree(self) -> None:
        if self.task.name.reads_files and self.policy.kind is PolicyKind.TINY:
            raise ConfigError(
                f"task.name: {self.task.name.value} needs policy.kind: hf (the tiny policy's tokenizer knows only "
                "digits, '+' and '='); set policy.kind: hf and policy.path"
            )
        chat = self.task.name.reads_files and self.task.prompt_style is PromptStyle.CHAT
        for key in ("chat_template", "system_prompt"):
            if not chat and getattr(self.policy, key) is not None:
                raise ConfigError(
                    f"policy.{key} is used only with chat prompts (task.name: math or code, "
                    "task.prompt_style: chat); remove it or set task.prompt_style: chat"
                )
        if (
            chat
            and self.policy.path is not None
            and self.policy.chat_template is None
            and not has_chat_template(Path(self.policy.path).expanduser())
        ):
            raise ConfigError(
                f"task.prompt_style: chat needs a chat template, and the tokenizer in policy.path "
                f"{self.policy.path!r} has none; set policy.chat_template or task.prompt_style: plain"
            )
        # Every eval set is scored by the task's reward: exact match for arithmetic, a math verifier for math.
        wanted_file_sets = self.task.name.reads_files
        for name, eval_set in self.eval_sets.items():
            if eval_set.harness is not None:
                self._check_harness_runs(name)
            elif eval_set.is_file_set != wanted_file_sets:
                given = (
                    f"path {eval_set.path!r} (a file set)" if eval_set.is_file_set else "no path (an arithmetic set)"
                )
                needed = "a path to a file of problems" if wanted_file_sets else "digits and size, no path"
                raise ConfigError(
                    f"eval_sets.{name} has {given}, but task.name is {self.task.name.value}; give it {needed}"
                )
