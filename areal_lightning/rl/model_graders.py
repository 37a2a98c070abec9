"""Graders that are models: a reward model and a generative judge, beside a task's own verifier.

`RewardModelGrader` scores (prompt, completion) pairs with a local
`AutoModelForSequenceClassification` directory; `JudgeGrader` asks a local causal LM (an
`HFPolicy`) for a verdict through a rubric template and parses it. `GradedTask` wraps a task:
the reward model's score becomes the sample's reward (``reward/*``, continuous) while
correctness (accuracy, pass@k) stays the verifier's, or becomes the judge's verdict; the judge's
verdicts are counted per round as ``judge/correct``, ``judge/incorrect``, ``judge/unparsed`` with
their shares.

`GradedTask` is a `torch.nn.Module`: assigned to `GRPOModule.task`, its graders become submodules,
so they move to the evaluation's device with the module, their weights key the result cache
(`eval_round.cache`) and are saved in checkpoints. Scores depend only on an eval batch's own
completions (scored in order, `batch_size` at a time), and eval batches do not depend on the
number of ranks: the same on 1, 2 or 3 ranks.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from areal_lightning.errors import ArgumentError
from areal_lightning.rl.engines.hf.policy import HFPolicy
from areal_lightning.rl.grader_checks import (
    DEFAULT_RUBRIC,
    DEFAULT_VERDICT,
    JUDGE_LABELS,
    NEVER_DOWNLOADED,
    RM_ACCEPTED,
    classification_head_problem,
    model_dir_problem,
    template_problem,
    verdict_pattern_problem,
)
from areal_lightning.scoring import Score, ScoreStatus

CORRECT_REWARD = 1.0


class RewardModelGrader(nn.Module):
    """A local sequence-classification model that scores (prompt, completion) pairs.

    Args:
        path: a local directory written by `save_pretrained` (model and tokenizer) of a model with a
            sequence-classification head; never downloaded, a hub name is refused.
        batch_size: pairs per forward.
        max_length: tokens kept of each pair (the prompt's start is cut first).

    Raises:
        ArgumentError: for a path that is not a local model directory, a model without a
            sequence-classification head (a plain language model would get a random one), or a batch
            size or length that is not a positive integer.
    """

    def __init__(self, path: str | Path, *, batch_size: int = 8, max_length: int = 1024) -> None:
        super().__init__()
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        for name, value in (("batch_size", batch_size), ("max_length", max_length)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ArgumentError("RewardModelGrader", name, value, "a positive integer")
        directory = _model_dir("RewardModelGrader", "path", path)
        _check_classification_head(directory)
        self.model, info = AutoModelForSequenceClassification.from_pretrained(
            directory, local_files_only=True, output_loading_info=True
        )
        if info["missing_keys"]:  # weights transformers would initialise at random: no trained head
            missing = sorted(info["missing_keys"])
            why = f"{_call(path)}: {RM_ACCEPTED}; its weights lack {missing[:3]}, which would be random"
            raise ArgumentError("RewardModelGrader", "path", str(path), RM_ACCEPTED, why)
        self.model.requires_grad_(False).eval()
        self.tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
        self.tokenizer.truncation_side = "left"
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model.config.pad_token_id = self.tokenizer.pad_token_id
        self.batch_size, self.max_length = batch_size, max_length

    @torch.no_grad()
    def score(self, prompts: Sequence[str], completions: Sequence[str]) -> list[float]:
        """The model's score (its first logit) of each pair, in order."""
        device = next(self.model.parameters()).device
        out: list[float] = []
        for start in range(0, len(prompts), self.batch_size):
            texts = [p + c for p, c in zip(prompts[start : start + self.batch_size], completions[start:], strict=False)]
            batch = self.tokenizer(
                texts, return_tensors="pt", padding=True, truncation=True, max_length=self.max_length
            ).to(device)
            out += self.model(**batch).logits[:, 0].float().cpu().tolist()
        return out


def _call(path: str | Path, owner: str = "RewardModelGrader", arg: str = "path") -> str:
    return f"`{owner}({arg}={str(path)!r})`"


def _model_dir(owner: str, arg: str, path: str | Path) -> Path:
    """`path` as a local directory holding a saved model and tokenizer; a hub name is refused, never fetched."""
    problem = model_dir_problem(path)
    if problem is not None:
        why = f"{_call(path, owner, arg)}: {problem}; {NEVER_DOWNLOADED}"
        raise ArgumentError(owner, arg, str(path), "a local model directory", why)
    return Path(path).expanduser()


def _check_classification_head(directory: Path) -> None:
    """Refuses a model saved as anything but sequence classification (read from its config.json)."""
    problem = classification_head_problem(directory)
    if problem is not None:
        why = f"{_call(directory)}: {RM_ACCEPTED}; {problem} (a causal LM can be a judge: JudgeGrader)"
        raise ArgumentError("RewardModelGrader", "path", str(directory), RM_ACCEPTED, why)


class JudgeGrader(nn.Module):
    """A causal LM asked, greedily, whether each completion is correct; its verdict parsed.

    Args:
        policy: the judge: an `HFPolicy` (``HFPolicy.from_pretrained(path)``) or the path of a local
            causal-LM directory, loaded with ``HFPolicy.from_pretrained`` (never downloaded).
        template: the rubric; must contain ``{prompt}`` and ``{completion}`` (``{answer}`` optional).
        verdict_pattern: a regular expression whose first group is the verdict word; the last
            match in the judge's reply counts.
        correct_word: the verdict word that means correct (compared case-insensitively).
        max_new_tokens: tokens of the judge's reply.

    Raises:
        ArgumentError: for a judge that is neither a policy nor a local model directory, a template
            without its fields or with another one, a pattern without a group or that does not
            compile, an empty `correct_word`, or a token count that is not a positive integer.
    """

    def __init__(
        self,
        policy: HFPolicy | str | Path,
        *,
        template: str = DEFAULT_RUBRIC,
        verdict_pattern: str = DEFAULT_VERDICT,
        correct_word: str = "CORRECT",
        max_new_tokens: int = 16,
    ) -> None:
        super().__init__()
        problem = template_problem(template)
        if problem is not None:
            accepted = "a string containing {prompt} and {completion}"
            why = f"`JudgeGrader(template=...)` must be {accepted}: {problem}"
            raise ArgumentError("JudgeGrader", "template", template, accepted, why)
        if verdict_pattern_problem(verdict_pattern) is not None:
            raise ArgumentError("JudgeGrader", "verdict_pattern", verdict_pattern, "a regular expression with a group")
        if not correct_word:
            raise ArgumentError("JudgeGrader", "correct_word", correct_word, "a non-empty word")
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise ArgumentError("JudgeGrader", "max_new_tokens", max_new_tokens, "a positive integer")
        if isinstance(policy, str | Path):
            policy = HFPolicy.from_pretrained(_model_dir("JudgeGrader", "policy", policy))
        elif not (isinstance(policy, nn.Module) and callable(getattr(policy, "generate", None))):
            raise ArgumentError("JudgeGrader", "policy", policy, "an HFPolicy or the path of a local model directory")
        self.policy = policy.requires_grad_(False)
        self.template, self.pattern, self.correct_word = template, re.compile(verdict_pattern), correct_word.lower()
        self.max_new_tokens = max_new_tokens

    @torch.no_grad()
    def judge(self, prompts: Sequence[str], completions: Sequence[str], answers: Sequence[str]) -> list[bool | None]:
        """The verdict on each completion: True (correct), False, or None when the reply holds none."""
        tok = self.policy.tokenizer
        texts = [
            self.template.format(prompt=p, completion=c, answer=a)
            for p, c, a in zip(prompts, completions, answers, strict=True)
        ]
        ids, mask = tok.pad_left([tok.encode(t) for t in texts])
        device = next(self.policy.parameters()).device
        generator = torch.Generator(device=device if device.type == "cuda" else "cpu")
        replies = self.policy.generate(
            ids.to(device), mask.to(device), max_new_tokens=self.max_new_tokens, temperature=0.0, generators=generator
        )
        verdicts: list[bool | None] = []
        for row in replies.cpu():
            found = self.pattern.findall(tok.decode(row))
            verdicts.append(None if not found else _group(found[-1]).lower() == self.correct_word)
        return verdicts


def _group(match: Any) -> str:
    return str(match[0] if isinstance(match, tuple) else match)


class GradedTask(nn.Module):
    """A task whose samples are also graded by a reward model and/or a judge.

    Args:
        task: the task (`MathTask`, `CodeTask`, ...): prompts, answers, its verifier's `Score`s.
        reward_model: its score becomes each sample's reward (``reward/*``); correctness stays
            the verifier's (or the judge's).
        judge: its verdict becomes each sample's correctness; an unparsed verdict counts as
            incorrect, with status ``parse_failure`` and label ``judge/unparsed``.

    Raises:
        ArgumentError: when neither grader is given.

    Everything else (`train_samples`, `answer_id`, `reference_completion`, ...) is the task's.
    """

    def __init__(
        self, task: Any, reward_model: RewardModelGrader | None = None, judge: JudgeGrader | None = None
    ) -> None:
        super().__init__()
        if reward_model is None and judge is None:
            raise ArgumentError("GradedTask", "reward_model", None, "a RewardModelGrader when no judge is given")
        self.inner, self.reward_model, self.judge = task, reward_model, judge
        self.score_labels = tuple(getattr(task, "score_labels", ())) + ((JUDGE_LABELS,) if judge else ())

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.__dict__["inner"], name)

    def score_many(self, completions: list[str], answers: list[str]) -> list[Score]:
        """The task's own scores (training rollouts, which carry no prompt)."""
        return list(self.inner.score_many(completions, answers))

    def score_rollouts(self, prompts: list[str], completions: list[str], answers: list[str]) -> list[Score]:
        """Each sample's `Score`: the verifier's, with the reward model's reward and the judge's verdict."""
        if callable(getattr(self.inner, "score_many", None)):
            base = list(self.inner.score_many(completions, answers))
        else:
            base = [Score(float(self.inner.reward(c, a))) for c, a in zip(completions, answers, strict=True)]
        rewards = self.reward_model.score(prompts, completions) if self.reward_model is not None else None
        verdicts = self.judge.judge(prompts, completions, answers) if self.judge is not None else None
        out = []
        for i, score in enumerate(base):
            correct = score.reward >= CORRECT_REWARD if score.correct is None else score.correct
            status, labels = score.status, score.labels
            if verdicts is not None:
                verdict = verdicts[i]
                correct = bool(verdict)
                word = "unparsed" if verdict is None else ("correct" if verdict else "incorrect")
                labels = (*labels, f"judge/{word}")
                status = ScoreStatus.PARSE_FAILURE if verdict is None else status
            reward = rewards[i] if rewards is not None else score.reward
            out.append(Score(reward, status, labels=labels, correct=correct))
        return out
