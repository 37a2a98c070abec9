"""The ``graders`` section: a reward model and a judge that grade evaluation rollouts beside the
task's own verifier (`rl.model_graders`; docs/model_graders.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

from areal_lightning.app.config_errors import ConfigError, at_least
from areal_lightning.rl.grader_checks import (
    DEFAULT_RUBRIC,
    DEFAULT_VERDICT,
    NEVER_DOWNLOADED,
    RM_ACCEPTED,
    classification_head_problem,
    model_dir_problem,
    template_problem,
    verdict_pattern_problem,
)

if TYPE_CHECKING:  # torch and transformers load only when the graders are built
    from areal_lightning.rl.model_graders import GradedTask, JudgeGrader, RewardModelGrader


YAML_BOOLS = ("True", "False")
"""What a YAML true or false becomes in a string field (``correct_word: yes`` is true)."""


def _check_model_dir(key: str, path: Optional[str], accepted: str) -> None:
    if path is None:
        raise ConfigError(f"{key} is required: {accepted} (models are never downloaded)")
    problem = model_dir_problem(path)
    if problem is not None:
        raise ConfigError(f"{key} {path!r}: {problem}; give {accepted}; {NEVER_DOWNLOADED}")


@dataclass
class RewardModelConfig:
    """A reward model (`RewardModelGrader`): its score becomes each evaluation sample's reward."""

    path: Optional[str] = None
    """Local directory of an AutoModelForSequenceClassification model and its tokenizer (save_pretrained)."""
    batch_size: int = 8
    """(prompt, completion) pairs scored per forward."""
    max_length: int = 1024
    """Tokens kept of each pair (the prompt's start is cut first)."""

    def check(self, key: str) -> None:
        at_least(f"{key}.batch_size", self.batch_size, 1)
        at_least(f"{key}.max_length", self.max_length, 1)
        _check_model_dir(f"{key}.path", self.path, RM_ACCEPTED)
        problem = classification_head_problem(str(self.path))
        if problem is not None:
            raise ConfigError(
                f"{key}.path {self.path!r}: {problem}; give {RM_ACCEPTED} (a causal LM can be a judge: graders.judge)"
            )

    def build(self) -> RewardModelGrader:
        from areal_lightning.rl.model_graders import RewardModelGrader

        assert self.path is not None  # `check` requires it
        return RewardModelGrader(self.path, batch_size=self.batch_size, max_length=self.max_length)


@dataclass
class JudgeConfig:
    """A judge (`JudgeGrader`): a causal LM whose verdict becomes each evaluation sample's correctness."""

    path: Optional[str] = None
    """Local directory of a causal LM and its tokenizer (save_pretrained), asked greedily."""
    template: str = DEFAULT_RUBRIC
    """The rubric: {prompt}, {completion} and optionally {answer} are filled in (a literal brace is written twice)."""
    verdict_pattern: str = DEFAULT_VERDICT
    """A regular expression whose first group is the verdict word; the last match in the reply counts."""
    correct_word: str = "CORRECT"
    """The verdict word that means correct (compared case-insensitively); any other word is incorrect."""
    max_new_tokens: int = 16
    """Tokens of the judge's reply."""

    def check(self, key: str) -> None:
        problem = template_problem(self.template)
        if problem is not None:
            raise ConfigError(f"{key}.template {self.template!r}: {problem}")
        problem = verdict_pattern_problem(self.verdict_pattern)
        if problem is not None:
            raise ConfigError(f"{key}.verdict_pattern {self.verdict_pattern!r}: {problem}")
        if not self.correct_word.strip():
            raise ConfigError(
                f"{key}.correct_word must be a word of the verdict (e.g. CORRECT), got {self.correct_word!r}"
            )
        if self.correct_word in YAML_BOOLS and self.correct_word.lower() not in self.verdict_pattern.lower():
            raise ConfigError(
                f"{key}.correct_word is {self.correct_word!r}, which {key}.verdict_pattern {self.verdict_pattern!r} "
                "never finds: YAML reads yes, no, on and off unquoted as true and false; quote the word ('yes')"
            )
        at_least(f"{key}.max_new_tokens", self.max_new_tokens, 1)
        _check_model_dir(f"{key}.path", self.path, "a local directory of a causal language model")

    def build(self) -> JudgeGrader:
        from areal_lightning.rl.model_graders import JudgeGrader

        assert self.path is not None  # `check` requires it
        return JudgeGrader(
            self.path,
            template=self.template,
            verdict_pattern=self.verdict_pattern,
            correct_word=self.correct_word,
            max_new_tokens=self.max_new_tokens,
        )


@dataclass
class GradersConfig:
    """Model graders of evaluation rollouts; neither given: the task's verifier alone grades."""

    reward_model: Optional[RewardModelConfig] = None
    """Its score is each evaluation sample's reward (reward/*); correctness stays the verifier's, or the judge's."""
    judge: Optional[JudgeConfig] = None
    """Its verdict is each evaluation sample's correctness (accuracy, pass@k), counted as judge/*."""

    @property
    def given(self) -> bool:
        return self.reward_model is not None or self.judge is not None

    def check(self, key: str) -> None:
        if self.reward_model is not None:
            self.reward_model.check(f"{key}.reward_model")
        if self.judge is not None:
            self.judge.check(f"{key}.judge")

    def wrap(self, task: Any) -> Any:
        """`task` graded by these graders (a `GradedTask`), or `task` itself when none is given."""
        if not self.given:
            return task
        from areal_lightning.rl.model_graders import GradedTask

        reward_model = self.reward_model.build() if self.reward_model is not None else None
        judge = self.judge.build() if self.judge is not None else None
        graded: GradedTask = GradedTask(task, reward_model=reward_model, judge=judge)
        return graded
