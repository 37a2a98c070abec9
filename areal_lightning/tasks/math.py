"""A math word-problem task: GSM8K- or MATH-format rows from a local JSONL or Parquet file, with a
reward that checks the completion's final answer against the reference.

Rewards come from `math-verify` (symbolic equivalence; the `math` extra) where it is installed,
else from `numeric_equal`, a documented fallback that compares final numbers (and otherwise
normalised strings).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, TypeVar

from areal_lightning.metrics.constants import NO_ANSWER
from areal_lightning.scoring import DEFAULT_TIMEOUT_S, SafeScorer, Score, ScoreStatus
from areal_lightning.tasks.math_answers import (
    WRONG_REWARD,
    AnswerFormat,
    canonical_answer,
    math_verify_score,
    numeric_score,
    reference_answer,
)

PLAIN_TEMPLATE = "Question: {question}\nAnswer:"
CHAT_TEMPLATE = "{question}\nPlease reason step by step, and put your final answer within \\boxed{{}}."
SUFFIXES = (".jsonl", ".json", ".parquet")


class PromptStyle(str, Enum):
    """How a question becomes a prompt."""

    PLAIN = "plain"
    """`PLAIN_TEMPLATE`, a completion prompt for base models."""
    CHAT = "chat"
    """`CHAT_TEMPLATE`, a user message for the tokenizer's chat template (`HFTokenizer(chat=True)`)."""


class Verifier(str, Enum):
    """How a completion's answer is compared with the reference."""

    AUTO = "auto"
    """math-verify where installed, else numeric."""
    MATH_VERIFY = "math_verify"
    NUMERIC = "numeric"


@dataclass(frozen=True)
class MathSample:
    """One problem: like the arithmetic task's `Sample`, plus the stratum it belongs to.

    `stratum` (the row's `stratum_field`, e.g. MATH's ``level``, or else the file's name) lets
    an eval set be subsampled per stratum.
    """

    index: int
    prompt: str
    answer: str
    stratum: str
    solution: str | None = None
    """The row's answer field as written (GSM8K's worked solution ending ``#### 72``, MATH's solution with
    its ``\\boxed{}``); None for ``plain`` answers, whose field is the answer alone."""

    @property
    def key(self) -> str:
        """Canonical content, used to fingerprint eval sets across ranks."""
        return f"{self.prompt}{self.answer}"


E = TypeVar("E", bound=Enum)


def _choice(kind: type[E], value: str | E, call: str) -> E:
    try:
        return kind(value)
    except ValueError:
        choices = ", ".join(repr(m.value) for m in kind)
        raise ValueError(f"Unsupported parameter value `{call}={value!r})`. Possible choices are: {choices}") from None


class MathTask:
    """Math problems read from a local file, rewarded 1 for an equivalent final answer, else 0.

    Args:
        path: a ``.jsonl`` (one JSON object per line), ``.json`` (a list of objects) or
            ``.parquet`` file (Parquet needs `pyarrow`).
        question_field: the field holding the question (MATH: ``problem``).
        answer_field: the field holding the reference (MATH: ``solution``).
        answer_format: where the reference answer sits in `answer_field`, see `AnswerFormat`.
        stratum_field: the field each sample's `stratum` comes from (e.g. ``level``); None
            uses the file's name, so that files mixed into one eval set stay apart.
        prompt_style: see `PromptStyle`; `uses_chat_template` tells the tokenizer which.
        prompt_template: overrides the style's template; must contain ``{question}``.
        verifier: see `Verifier`.
        score_timeout_s: per-sample time limit of math-verify, enforced from any thread by
            running it in `SafeScorer` worker processes (a sample past it scores as wrong and
            counts as a timeout); None scores in this process, with math-verify's own SIGALRM
            timeout on the main thread only. The numeric verifier always scores in this process.
        score_workers: worker processes of the math-verify scorer.

    Raises:
        FileNotFoundError: when `path` does not exist.
        ValueError: for an unsupported suffix or option, a row without a needed field (naming
            the fields it has), or a reference answer that cannot be found.
        ImportError: for ``verifier="math_verify"`` without math-verify installed.

    Example:
        >>> import json, os, tempfile
        >>> f = tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False)
        >>> _ = f.write(json.dumps({"question": "What is 2+3?", "answer": "2+3=5\\n#### 5"}) + "\\n"); f.close()
        >>> task = MathTask(f.name, verifier="numeric")
        >>> s = task.samples()[0]
        >>> s.prompt, s.answer
        ('Question: What is 2+3?\\nAnswer:', '5')
        >>> task.reward("2 + 3 = 5, so the answer is \\\\boxed{5}.", s.answer), task.reward("#### 6", s.answer)
        (1.0, 0.0)
        >>> os.remove(f.name)
    """

    summary_metrics = ("accuracy", "reward/mean")
    """The metrics of each round's line in the console."""

    def __init__(
        self,
        path: str | Path,
        *,
        question_field: str = "question",
        answer_field: str = "answer",
        answer_format: str | AnswerFormat = AnswerFormat.GSM8K,
        stratum_field: str | None = None,
        prompt_style: str | PromptStyle = PromptStyle.PLAIN,
        prompt_template: str | None = None,
        verifier: str | Verifier = Verifier.AUTO,
        score_timeout_s: float | None = DEFAULT_TIMEOUT_S,
        score_workers: int = 1,
    ) -> None:
        self.path = Path(path)
        self.answer_format = _choice(AnswerFormat, answer_format, "MathTask(answer_format")
        self.prompt_style = _choice(PromptStyle, prompt_style, "MathTask(prompt_style")
        verifier = _choice(Verifier, verifier, "MathTask(verifier")
        has_math_verify = importlib.util.find_spec("math_verify") is not None
        if verifier is Verifier.MATH_VERIFY and not has_math_verify:
            raise ImportError(
                "`MathTask(verifier='math_verify')` needs math-verify: "
                "pip install 'areal-lightning[math]', or use verifier='numeric'"
            )
        if verifier is Verifier.AUTO:
            verifier = Verifier.MATH_VERIFY if has_math_verify else Verifier.NUMERIC
        self.verifier = verifier
        self.scorer: SafeScorer | None = None
        if verifier is Verifier.MATH_VERIFY and score_timeout_s is not None:
            self.scorer = _math_verify_scorer(float(score_timeout_s), score_workers)
        template = prompt_template
        if template is None:
            template = PLAIN_TEMPLATE if self.prompt_style is PromptStyle.PLAIN else CHAT_TEMPLATE
        if "{question}" not in template:
            raise ValueError(f"`MathTask(prompt_template={prompt_template!r})` must contain '{{question}}'")
        self.prompt_template = template
        self.question_field, self.answer_field, self.stratum_field = question_field, answer_field, stratum_field
        self._samples = self._load()

    @property
    def uses_chat_template(self) -> bool:
        """Whether prompts are user messages for the tokenizer's chat template."""
        return self.prompt_style is PromptStyle.CHAT

    def _load(self) -> list[MathSample]:
        rows = read_rows(self.path)
        fields = [self.question_field, self.answer_field] + ([self.stratum_field] if self.stratum_field else [])
        samples = []
        for index, row in enumerate(rows):
            for field in fields:
                if field not in row:
                    raise ValueError(
                        f"row {index + 1} of {self.path} has no field {field!r}; fields present: "
                        f"{sorted(row)} (set MathTask's question_field / answer_field / stratum_field)"
                    )
            answer = reference_answer(str(row[self.answer_field]), self.answer_format)
            if answer is None:
                raise ValueError(
                    f"row {index + 1} of {self.path}: no {self.answer_format.value!r} answer in field "
                    f"{self.answer_field!r}: {str(row[self.answer_field])[-200:]!r}"
                )
            stratum = str(row[self.stratum_field]) if self.stratum_field else self.path.stem
            prompt = self.prompt_template.format(question=str(row[self.question_field]))
            solution = None if self.answer_format is AnswerFormat.PLAIN else str(row[self.answer_field])
            samples.append(MathSample(index=index, prompt=prompt, answer=answer, stratum=stratum, solution=solution))
        return samples

    def samples(self) -> list[MathSample]:
        """Every row of the file, in file order (`index` is the row number)."""
        return list(self._samples)

    def train_samples(self) -> list[MathSample]:
        return self.samples()

    def reward(self, completion: str, answer: str) -> float:
        """`CORRECT_REWARD` when the completion's final answer is equivalent to `answer`."""
        return self.score_many([completion], [answer])[0].reward

    def score_many(self, completions: list[str], answers: list[str]) -> list[Score]:
        """Each completion's reward with how it came about: a timed-out, unparseable or failed
        answer scores `WRONG_REWARD` with its `ScoreStatus`.

        Raises:
            ScorerFailingError: math-verify timed out or raised many times in a row.
        """
        if self.scorer is not None:
            return self.scorer.score_many(completions, answers)
        fn = math_verify_score if self.verifier is Verifier.MATH_VERIFY else numeric_score
        out = []
        for completion, answer in zip(completions, answers, strict=True):
            value = fn(completion, answer)
            out.append(Score(WRONG_REWARD, ScoreStatus.PARSE_FAILURE) if value is None else Score(value))
        return out

    def reference_completion(self, sample: MathSample) -> str | None:
        """The completion this task's grader must score correct for `sample`: the row's own solution
        (GSM8K's ``... #### 72``, MATH's ``... \\boxed{...}``), or ``\\boxed{<answer>}`` for a plain answer.

        Example:
            >>> print(MathTask.reference_completion(None, MathSample(0, "Q", "1/2", "test")))  # type: ignore[arg-type]
            \\boxed{1/2}
        """
        return sample.solution if sample.solution is not None else f"\\boxed{{{sample.answer}}}"

    def answer_id(self, completion: str) -> int:
        """An id per distinct final answer, for majority voting; `NO_ANSWER` when there is none.

        Answers are grouped by their `canonical_answer` (``1,000`` and ``1000`` vote together;
        ``1/2`` and ``0.5`` too), whichever verifier scores them.
        """
        canonical = canonical_answer(completion)
        if canonical is None:
            return NO_ANSWER
        # A stable hash (not `hash`, which is salted per process): every rank gives the same id.
        return int.from_bytes(hashlib.blake2b(canonical.encode(), digest_size=7).digest(), "big")


@functools.cache
def _math_verify_scorer(timeout_s: float, workers: int) -> SafeScorer:
    """One pool of math-verify workers per process and setting, shared by every task (workers
    start on the first call, so building a task costs nothing)."""
    return SafeScorer(math_verify_score, timeout_s=timeout_s, workers=workers, wrong_reward=WRONG_REWARD)


# ----------------------------------------------------------------------------- reading rows
def read_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of a local ``.jsonl``, ``.json`` or ``.parquet`` file, as dicts."""
    if path.is_dir():
        raise FileNotFoundError(f"`MathTask(path={str(path)!r})`: a directory, not a file; give the data file itself")
    if not path.is_file():
        raise FileNotFoundError(f"`MathTask(path={str(path)!r})`: no such file")
    if path.suffix not in SUFFIXES:
        raise ValueError(
            f"`MathTask(path={str(path)!r})`: unsupported file type {path.suffix!r}; use one of {', '.join(SUFFIXES)}"
        )
    if path.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise ImportError(f"reading {path} needs pyarrow: pip install pyarrow") from None
        return pq.read_table(path).to_pylist()
    if path.suffix == ".json":
        rows = json.loads(path.read_text())
        if not isinstance(rows, list):
            raise ValueError(f"{path} must hold a JSON list of objects, got {type(rows).__name__}")
        return rows
    rows = []
    for line_no, line in enumerate(path.read_text().splitlines(), start=1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}, line {line_no}: not JSON ({err.msg})") from None
    return rows
