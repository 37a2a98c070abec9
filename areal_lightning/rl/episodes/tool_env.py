"""The Python tool environment: a completion that ends with a program runs it in the code sandbox
(`scoring.Sandbox`), and the program's output, cut to ``output_chars``, is the next observation;
a completion without one is the final answer, graded by the task.

What counts as a program is the tool syntax's call: `FencedPython` (a completion that ends with a
fenced Python block; its output comes back in an ``output`` fence) or, for the arithmetic task's
character policy, `ArithmeticExpression` (a completion such as ``3+4`` is the program
``print(3+4)``; its output comes back as the printed digits and ``=``). Generated code never runs
anywhere but in the sandbox.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any, Protocol

from areal_lightning.rl.episodes.environments import EpisodeView, Feedback, ToolUse
from areal_lightning.scoring import ProgramStatus, Sandbox, SandboxLimits, SandboxResult
from areal_lightning.tasks.arithmetic import CORRECT_REWARD, WRONG_REWARD, ArithmeticTask

DEFAULT_WORKERS = 2
_FENCED = re.compile(r"```(?:python|py)?[ \t]*\n(?P<code>.*?)```\s*$", re.DOTALL)
_EXPRESSION = re.compile(r"[0-9]+(\+[0-9]+)+")


class ToolSyntax(Protocol):
    """How a completion calls the tool and how the tool's result is shown."""

    def program(self, completion: str) -> str | None:
        """The program a completion runs; None: the completion is an answer."""
        ...

    def observation(self, result: SandboxResult, output_chars: int) -> str:
        """What the policy reads of a program's result."""
        ...


def cut_output(text: str, output_chars: int) -> str:
    """`text` cut to `output_chars` characters, marked when cut.

    Example:
        >>> cut_output("0123456789", 4)
        '0123...'
    """
    return text if len(text) <= output_chars else text[:output_chars] + "..."


class FencedPython:
    """A completion that ends with a fenced Python block (```` ```python ... ``` ````) runs the block;
    the output (stdout and stderr: a failure's traceback too) comes back in an ``output`` fence.

    Example:
        >>> FencedPython().program("Let me add.\\n```python\\nprint(3 + 4)\\n```")
        'print(3 + 4)\\n'
        >>> FencedPython().program("```python\\nprint(1)\\n```\\nSo the answer is 1.") is None
        True
    """

    def program(self, completion: str) -> str | None:
        match = _FENCED.search(completion)
        return match.group("code") if match else None

    def observation(self, result: SandboxResult, output_chars: int) -> str:
        shown = cut_output(result.output, output_chars)
        if result.status is ProgramStatus.TIMEOUT:
            shown += f"\n(timed out: {result.limit or 'wall_s'})"
        return f"```output\n{shown}\n```\n"


class ArithmeticExpression:
    """For the arithmetic task's alphabet (``0123456789+=``): a completion such as ``3+4`` is the
    program ``print(3+4)``; the observation is the digits it printed, then ``=`` (only ``=`` when
    it printed none).

    Example:
        >>> ArithmeticExpression().program("3+4"), ArithmeticExpression().program("07")
        ('print(3+4)', None)
    """

    def program(self, completion: str) -> str | None:
        return f"print({completion})" if _EXPRESSION.fullmatch(completion) else None

    def observation(self, result: SandboxResult, output_chars: int) -> str:
        digits = result.output.strip() if result.passed else ""
        return (digits if digits.isdigit() else "")[:output_chars] + "="


class PythonToolEnvironment:
    """Episodes in which the policy may run Python before it answers.

    Args:
        task: grades the final answer (its `score_many` where it has one, else its `reward`).
        timeout_s: each program's wall-clock limit, in seconds (its CPU limit: the same, rounded up).
        output_chars: the program's output is cut to this many characters before it is shown.
        syntax: how a completion calls the tool; None: `ArithmeticExpression` for the arithmetic
            task, else `FencedPython`.
        workers: programs run at once.

    A tool call earns no reward; ``ToolUse`` records it, with ``error`` for a program that failed,
    crashed, ran out of memory or did not compile, and ``timeout`` for one that ran out of time.
    Call `close` (or let the process end) to stop the sandbox's workers.

    Example:
        >>> from areal_lightning.tasks.arithmetic import Sample
        >>> env = PythonToolEnvironment(ArithmeticTask())
        >>> [f.observation for f in env.respond([EpisodeView(Sample(0, "3+4=", "07"), ("3+4",), (), 0)])]
        ['7=']
        >>> env.close()
    """

    uses_tools = True

    def __init__(
        self,
        task: Any,
        *,
        timeout_s: float = 5.0,
        output_chars: int = 512,
        syntax: ToolSyntax | None = None,
        workers: int = DEFAULT_WORKERS,
    ) -> None:
        if not (isinstance(output_chars, int) and output_chars >= 1):
            raise ValueError(
                f"`PythonToolEnvironment(output_chars=...)` must be a positive integer, got {output_chars!r}"
            )
        self.task = task
        self.output_chars = output_chars
        self.syntax = syntax or (ArithmeticExpression() if isinstance(task, ArithmeticTask) else FencedPython())
        limits = SandboxLimits(wall_s=timeout_s, cpu_s=max(1, math.ceil(timeout_s)))
        self.sandbox = Sandbox(workers=workers, limits=limits)

    def first_prompt(self, sample: Any) -> str:
        return str(sample.prompt)

    def respond(self, views: Sequence[EpisodeView]) -> list[Feedback]:
        from areal_lightning.rl.rollout_eval import score_texts  # torch: loaded when episodes run

        programs = [self.syntax.program(v.completion) for v in views]
        calls = [i for i, p in enumerate(programs) if p is not None]
        answers = [i for i, p in enumerate(programs) if p is None]
        out: list[Feedback | None] = [None] * len(views)
        results = self.sandbox.run_many([programs[i] for i in calls]) if calls else []  # type: ignore[misc]
        for i, result in zip(calls, results, strict=True):
            timeout = result.status is ProgramStatus.TIMEOUT
            use = ToolUse(called=True, error=not (result.passed or timeout), timeout=timeout)
            out[i] = Feedback(
                WRONG_REWARD, done=False, observation=self.syntax.observation(result, self.output_chars), tool=use
            )
        scores = score_texts(
            self.task, [views[i].completion for i in answers], [views[i].sample.answer for i in answers]
        )
        for i, score in zip(answers, scores, strict=True):
            out[i] = Feedback(score.reward, done=True, correct=score.reward >= CORRECT_REWARD)
        return [f for f in out if f is not None]

    def close(self) -> None:
        """Stops the sandbox's workers (they start again on the next program)."""
        self.sandbox.close()
