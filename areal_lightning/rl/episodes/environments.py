"""The environment protocol of multi-turn episodes, and the retry-with-feedback environment.

An environment gives the first prompt of a sample, then answers each completion with a reward,
whether the episode is over and, if not, an observation: the text the policy reads before its
next turn. `run_episodes` (episodes.py) turns texts into tokens and stops at ``max_turns``.
The Python tool environment is in tool_env.py.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from areal_lightning.tasks.arithmetic import CORRECT_REWARD

AREAL_RETRY_FEEDBACK = (
    "Your answer is either wrong or not parsable to the reward function. You may misunderstand the original "
    "question. Please carefully read the original question, check the previous errors, and try to answer it again."
)
"""The retry message of AReaL's multi-turn math example, for tasks that name no message of their own."""


@dataclass(frozen=True)
class ToolUse:
    """What one turn did with a tool: whether it called one, and whether the call failed or timed out."""

    called: bool = False
    error: bool = False
    timeout: bool = False


NO_TOOL = ToolUse()


@dataclass(frozen=True)
class Feedback:
    """An environment's answer to one completion.

    Args:
        reward: this turn's reward, before the turn discount (finite).
        done: the episode ends here (the runner also ends it after ``max_turns``).
        observation: what the policy reads before its next turn (unused when `done`).
        correct: this turn solved the sample (counted in ``success@t``).
        tool: the tool call this turn made, if any.
    """

    reward: float
    done: bool
    observation: str = ""
    correct: bool = False
    tool: ToolUse = field(default=NO_TOOL)


@dataclass(frozen=True)
class EpisodeView:
    """What an environment sees of an episode when it answers its latest completion.

    `completions` holds every completion so far (the last is the one to answer), `observations`
    the observations that followed the earlier ones; `turn` counts from 0; `seed` is this turn's
    own seed, for an environment that draws at random (the same on any rank and in any batch).
    """

    sample: Any
    completions: tuple[str, ...]
    observations: tuple[str, ...]
    seed: int

    @property
    def turn(self) -> int:
        return len(self.completions) - 1

    @property
    def completion(self) -> str:
        return self.completions[-1]


@runtime_checkable
class Environment(Protocol):
    """A multi-turn environment (docs/multi_turn.md shows a user's own).

    `respond` answers a batch of episodes at once (one `Feedback` per view, in order), so that
    scoring can be batched; it must depend only on each view, never on the batch around it.
    ``uses_tools`` says whether the evaluation records tool calls, errors and timeouts.
    """

    uses_tools: bool

    def first_prompt(self, sample: Any) -> str: ...

    def respond(self, views: Sequence[EpisodeView]) -> list[Feedback]: ...


def check_feedback(env: Any, views: Sequence[EpisodeView], answers: Sequence[Feedback]) -> list[Feedback]:
    """`answers` when there is one `Feedback` with a finite reward per view.

    Raises:
        ValueError: naming the environment, the sample and what was wrong.
    """
    name = type(env).__name__
    if len(answers) != len(views):
        raise ValueError(f"{name}.respond returned {len(answers)} answers for {len(views)} episodes; return one each")
    for view, answer in zip(views, answers, strict=True):
        if not isinstance(answer, Feedback) or not math.isfinite(answer.reward):
            raise ValueError(
                f"{name}.respond answered turn {view.turn + 1} of the episode of prompt {view.sample.prompt!r} "
                f"with {answer!r}; return a Feedback with a finite reward"
            )
    return list(answers)


class RetryEnvironment:
    """Retry with feedback, as AReaL's multi-turn math example: a right answer ends the episode with
    the task's reward; a wrong one gets `feedback` and another attempt.

    Args:
        task: grades completions: its `score_many` where it has one, else its `reward`.
        feedback: the message after a wrong answer; None: the task's ``retry_feedback`` where it
            has one (the arithmetic task's ``"="``: its alphabet has no letters), else
            `AREAL_RETRY_FEEDBACK`.

    Example:
        >>> from areal_lightning.tasks.arithmetic import ArithmeticTask, Sample
        >>> env = RetryEnvironment(ArithmeticTask())
        >>> s = Sample(0, "3+4=", "07")
        >>> [(f.reward, f.done, f.observation) for f in env.respond([EpisodeView(s, ("08",), (), 0)])]
        [(0.0, False, '=')]
    """

    uses_tools = False

    def __init__(self, task: Any, feedback: str | None = None) -> None:
        if feedback is not None and not feedback:
            raise ValueError("`RetryEnvironment(feedback='')`: give a non-empty message, or None for the task's own")
        self.task = task
        self.feedback = feedback or getattr(task, "retry_feedback", None) or AREAL_RETRY_FEEDBACK

    def first_prompt(self, sample: Any) -> str:
        return str(sample.prompt)

    def respond(self, views: Sequence[EpisodeView]) -> list[Feedback]:
        from areal_lightning.rl.rollout_eval import score_texts  # torch: loaded when episodes run

        scores = score_texts(self.task, [v.completion for v in views], [v.sample.answer for v in views])
        out = []
        for score in scores:
            correct = score.reward >= CORRECT_REWARD
            out.append(
                Feedback(score.reward, done=correct, observation="" if correct else self.feedback, correct=correct)
            )
        return out
