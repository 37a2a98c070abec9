"""What the integrity checks at the start of `fit` look for, as pure functions (no torch).

* Training prompts in an eval set (`find_overlap`): a normalised exact match, or a shared word
  13-gram, as GPT-3's (Brown et al. 2020, appendix C) and lm-evaluation-harness's decontamination
  do. Text is normalised as lm-evaluation-harness's ``Janitor`` does (lower case, punctuation
  out, split on white space), except that punctuation becomes a space instead of vanishing, so
  that ``1+23=`` and ``12+3=`` stay two prompts. A prompt shorter than 13 words has no 13-gram and
  is compared by exact match only.
* Reference answers the task's own grader fails (`grade_references`): each eval sample's gold
  completion, as the task writes it (``reference_completion``), must be graded correct.
* Vacuous tests (`grade_nulls`): each eval sample's null completion (a code task's null program,
  the header with a body returning None) must be graded wrong: tests it passes test nothing.
* Prompts an eval set holds more than once (`find_duplicates`): each would count twice.

The module being fit offers what the checks read through `IntegritySource`; the callback never
imports the task.
"""

from __future__ import annotations

import string
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

NGRAM = 13
"""Words per n-gram of the overlap check (GPT-3's and lm-evaluation-harness's 13)."""
MAX_EXAMPLES = 5
"""Examples a finding shows (its counts and indices cover every row)."""
MAX_TEXT_CHARS = 300
DUPLICATES_OPTION = "duplicate_rows"
"""`EvalSet.options` key: the rows a loader dropped as repeats of an earlier prompt, as (row, first row)
pairs, 1-based; the duplicates check reports them."""
_PUNCTUATION = str.maketrans({c: " " for c in string.punctuation})


class IntegritySource(Protocol):
    """What the integrity checks read from the LightningModule being fit (`GRPOModule` has all of it).

    Any method may be missing: a check whose methods the module lacks is skipped (a log line says which).
    A user's own LightningModule offers the checks by defining these methods.
    """

    def integrity_train_prompts(self) -> Sequence[str]:
        """Every training prompt, as text."""
        ...

    def integrity_prompt(self, sample: Any) -> str:
        """An eval sample's prompt, as text."""
        ...

    def integrity_reference(self, sample: Any) -> str | None:
        """A completion of the eval sample that its grader must score correct; None: no gold answer."""
        ...

    def integrity_null(self, sample: Any) -> str | None:
        """A completion of the eval sample that solves nothing (a code task's null program: the
        function returning None), which a sound grader scores wrong; None: the task has none."""
        ...

    def integrity_grade(self, completions: Sequence[str], samples: Sequence[Any]) -> Sequence[bool]:
        """Whether the task's grader scores each completion correct for its sample."""
        ...


class IntegrityError(RuntimeError):
    """An integrity check found a problem and ``integrity`` is ``fail``: training does not start."""


def normalize(text: str) -> str:
    """`text` for comparison: NFKC, lower case, punctuation as spaces, white space collapsed.

    Example:
        >>> normalize("  What is  3+4?\\nAnswer:"), normalize("1+23=") == normalize("12+3=")
        ('what is 3 4 answer', False)
    """
    return " ".join(unicodedata.normalize("NFKC", text).lower().translate(_PUNCTUATION).split())


def word_ngrams(normal: str, n: int = NGRAM) -> list[str]:
    """The word n-grams of a normalised text (none when it has fewer than `n` words).

    Example:
        >>> word_ngrams("a b c d", 3)
        ['a b c', 'b c d']
    """
    words = normal.split()
    return [" ".join(words[i : i + n]) for i in range(len(words) - n + 1)]


def _clip(text: str) -> str:
    return text if len(text) <= MAX_TEXT_CHARS else text[:MAX_TEXT_CHARS] + "..."


@dataclass
class Overlap:
    """Eval prompts found among the training prompts: exact matches after `normalize`, then shared n-grams."""

    prompts: int
    exact: list[int] = field(default_factory=list)
    ngram: list[int] = field(default_factory=list)
    examples: list[dict[str, Any]] = field(default_factory=list)

    @property
    def found(self) -> int:
        return len(self.exact) + len(self.ngram)


def find_overlap(train_prompts: Sequence[str], eval_prompts: Sequence[str], n: int = NGRAM) -> Overlap:
    """Which eval prompts (by index) appear in the training prompts, and a few examples of each.

    Example:
        >>> o = find_overlap(["What is 3+4?", "one two"], ["what is 3 + 4", "What is 5+5?"])
        >>> o.exact, o.ngram, o.examples[0]["train_index"]
        ([0], [], 0)
    """
    exact: dict[str, int] = {}
    grams: dict[str, int] = {}
    for t, prompt in enumerate(train_prompts):
        normal = normalize(prompt)
        exact.setdefault(normal, t)
        for gram in word_ngrams(normal, n):
            grams.setdefault(gram, t)
    out = Overlap(prompts=len(eval_prompts))
    for i, prompt in enumerate(eval_prompts):
        normal = normalize(prompt)
        if normal in exact:
            out.exact.append(i)
            match, t, shared = "exact", exact[normal], None
        else:
            shared = next((g for g in word_ngrams(normal, n) if g in grams), None)
            if shared is None:
                continue
            out.ngram.append(i)
            match, t = f"{n}-gram", grams[shared]
        if len(out.examples) < MAX_EXAMPLES:
            example = {"index": i, "prompt": _clip(prompt), "match": match, "train_index": t}
            example["train_prompt"] = _clip(train_prompts[t])
            if shared is not None:
                example["ngram"] = shared
            out.examples.append(example)
    return out


@dataclass
class GoldGrades:
    """The eval samples whose reference completion the grader scored wrong, and how many it graded."""

    graded: int
    no_reference: int
    failed: list[int] = field(default_factory=list)
    examples: list[dict[str, Any]] = field(default_factory=list)


def grade_references(
    samples: Sequence[Any],
    reference: Callable[[Any], str | None],
    grade: Callable[[Sequence[str], Sequence[Any]], Sequence[bool]],
    prompt: Callable[[Any], str] | None = None,
) -> GoldGrades:
    """Grades each sample's reference completion with the task's grader, all in one call.

    Example:
        >>> right = lambda cs, ss: [c == str(eval(s[:-1])) for c, s in zip(cs, ss)]
        >>> g = grade_references(["1+1=", "2+2="], lambda s: "2", right)
        >>> g.graded, g.failed, g.examples[0]["reference"]
        (2, [1], '2')
    """
    golden = [(i, s, ref) for i, s in enumerate(samples) if (ref := reference(s)) is not None]
    verdicts = list(grade([ref for _, _, ref in golden], [s for _, s, _ in golden])) if golden else []
    if len(verdicts) != len(golden):
        raise ValueError(f"the grader returned {len(verdicts)} verdicts for {len(golden)} reference completions")
    out = GoldGrades(graded=len(golden), no_reference=len(samples) - len(golden))
    for (i, sample, ref), correct in zip(golden, verdicts, strict=True):
        if correct:
            continue
        out.failed.append(i)
        if len(out.examples) < MAX_EXAMPLES:
            example = {"index": i, "reference": _clip(ref)}
            if prompt is not None:
                example["prompt"] = _clip(prompt(sample))
            answer = getattr(sample, "answer", None)
            if answer is not None:
                example["answer"] = _clip(str(answer))
            out.examples.append(example)
    return out


@dataclass
class NullGrades:
    """The eval samples whose null completion the grader scored correct (their tests test nothing)."""

    graded: int
    passed: list[int] = field(default_factory=list)
    task_ids: list[str] = field(default_factory=list)


def grade_nulls(
    samples: Sequence[Any],
    null: Callable[[Any], str | None],
    grade: Callable[[Sequence[str], Sequence[Any]], Sequence[bool]],
) -> NullGrades:
    """Grades each sample's null completion with the task's grader, all in one call; a sample's task id
    is its ``task_id`` attribute, else its index.

    Example:
        >>> vacuous = lambda cs, ss: [s == "assert True" for s in ss]
        >>> g = grade_nulls(["assert f(1) == 2", "assert True"], lambda s: "pass", vacuous)
        >>> g.graded, g.passed, g.task_ids
        (2, [1], ['1'])
    """
    nulls = [(i, s, program) for i, s in enumerate(samples) if (program := null(s)) is not None]
    verdicts = list(grade([p for _, _, p in nulls], [s for _, s, _ in nulls])) if nulls else []
    if len(verdicts) != len(nulls):
        raise ValueError(f"the grader returned {len(verdicts)} verdicts for {len(nulls)} null programs")
    out = NullGrades(graded=len(nulls))
    for (i, sample, _), correct in zip(nulls, verdicts, strict=True):
        if correct:
            out.passed.append(i)
            out.task_ids.append(str(getattr(sample, "task_id", i)))
    return out


def find_duplicates(prompts: Sequence[str]) -> dict[int, int]:
    """{index of a prompt seen before: index of its first occurrence}, prompts compared exactly.

    Example:
        >>> find_duplicates(["1+1=", "2+2=", "1+1=", "1+1="])
        {2: 0, 3: 0}
    """
    first: dict[str, int] = {}
    return {i: first[p] for i, p in enumerate(prompts) if first.setdefault(p, i) != i}
