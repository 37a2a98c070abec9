"""The ``task`` section: the task the policy is trained on."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Optional

from areal_lightning.app.config_errors import ConfigError, at_least, positive_number
from areal_lightning.app.file_checks import check_code_source, check_math_file
from areal_lightning.tasks.math import PromptStyle, Verifier
from areal_lightning.tasks.math_answers import AnswerFormat


class TaskName(str, Enum):
    """``arithmetic``: the embedded default task; ``math``: GSM8K/MATH problems from a local file;
    ``code``: programming problems graded by their tests in the sandbox (docs/code_evaluation.md)."""

    ARITHMETIC = "arithmetic"
    MATH = "math"
    CODE = "code"

    @property
    def reads_files(self) -> bool:
        """Whether its problems (and its eval sets') come from `path`s; such tasks have prompt styles."""
        return self is not TaskName.ARITHMETIC


@dataclass
class TaskConfig:
    """The task the policy is trained on."""

    name: TaskName = TaskName.ARITHMETIC
    """arithmetic: the embedded default; math: problems of a local GSM8K/MATH file; code: programming
    problems graded in the sandbox (math and code need policy.kind: hf)."""
    train_digits: int = 1
    """arithmetic: digits of the operands of training prompts."""
    train_size: int = 256
    """arithmetic: training prompts, a finite set iterated in epochs (drawn with replacement)."""
    hold_out_eval: bool = True
    """arithmetic: training never draws a prompt of an eval set (of train_digits digits): the eval sets
    measure problems the policy was not trained on; false: training draws from every problem (and the
    integrity check at fit start reports the overlap)."""
    path: Optional[str] = None
    """math: the training file, .jsonl, .json or .parquet (every row is a training prompt); code:
    humaneval or a .jsonl file of problems in HumanEval's or MBPP's shape."""
    question_field: str = "question"
    """math: the field holding the question (MATH: problem)."""
    answer_field: str = "answer"
    """math: the field holding the reference answer (MATH: solution)."""
    answer_format: AnswerFormat = AnswerFormat.GSM8K
    """math: where the answer sits in answer_field: gsm8k (after ####), boxed (last \\boxed{}), plain (all of it)."""
    prompt_style: PromptStyle = PromptStyle.PLAIN
    """math: plain ("Question: ...\\nAnswer:") or chat (a user message through the tokenizer's chat template);
    code: plain (completion style: the function header, the completion is its body) or chat (instruction
    style: the answer's last fenced code block is the program)."""
    prompt_template: Optional[str] = None
    """math: replaces the style's prompt; must contain {question}."""
    verifier: Verifier = Verifier.AUTO
    """math: auto (math-verify where installed, else numeric), math_verify or numeric."""
    sandbox_workers: int = 2
    """code: programs run at once on each device (sandbox worker processes)."""
    sandbox_wall_s: float = 10.0
    """code: wall-clock seconds a program may run (its CPU seconds: the same, rounded up)."""

    def check(self, path: str) -> None:
        at_least(f"{path}.train_digits", self.train_digits, 1)
        at_least(f"{path}.train_size", self.train_size, 1)
        if self.name is TaskName.MATH:
            if self.path is None:
                raise ConfigError(
                    f"{path}.path is required for {path}.name: math; give a local .jsonl, .json or "
                    ".parquet file of problems"
                )
            check_math_file(path, self.path, self.question_field, self.answer_field, self.answer_format, None)
        if self.name is TaskName.ARITHMETIC and self.path is not None:
            # Silently unread, a user's file would look evaluated while the run made its own problems.
            raise ConfigError(
                f"{path}.path is read by {path}.name: math or code; {path}.name: arithmetic generates its problems "
                f"(remove {path}.path, or set {path}.name), got {self.path!r}"
            )
        if self.name is TaskName.CODE:
            if self.path is None:
                raise ConfigError(
                    f"{path}.path is required for {path}.name: code; give humaneval or a local .jsonl file"
                )
            check_code_source(f"{path}.path", self.path)
        at_least(f"{path}.sandbox_workers", self.sandbox_workers, 1)
        positive_number(f"{path}.sandbox_wall_s", self.sandbox_wall_s)
        if self.prompt_template is not None and "{question}" not in self.prompt_template:
            raise ConfigError(f"{path}.prompt_template must contain {{question}}, got {self.prompt_template!r}")
