"""The embedded default task: integer addition written as text, with exact-match reward.

The task is small enough to learn on a CPU in minutes, and graded: `easy` (one-digit operands)
becomes solvable by RL from a format-only start, `hard` (two-digit operands) stays hard.
"""

from __future__ import annotations

import operator
import random
from array import array
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import overload

from areal_lightning.scoring.score import Score, ScoreStatus
from areal_lightning.tasks.tokenizer import CharTokenizer

ALPHABET = "0123456789+="
CORRECT_REWARD = 1.0
WRONG_REWARD = 0.0
NO_ANSWER_ID = -1


@dataclass(frozen=True)
class Sample:
    """One prompt with its reference answer; `index` is its position in its data set."""

    index: int
    prompt: str
    answer: str

    @property
    def key(self) -> str:
        """Canonical content, used to fingerprint eval sets across ranks."""
        return f"{self.prompt}{self.answer}"

    @property
    def stratum(self) -> str:
        """The size class of the true sum, e.g. ``sum2`` for a two-digit sum: sums that need one
        more digit than the operands are the harder ones (the carry), and a stratified subset
        keeps their share.

        Example:
            >>> Sample(0, "7+5=", "12").stratum, Sample(1, "3+4=", "07").stratum
            ('sum2', 'sum1')
        """
        return f"sum{len(str(int(self.answer)))}"


class ArithmeticSamples(Sequence[Sample]):
    """An arithmetic eval set's samples, each made when it is read from two arrays of operands:
    16 bytes a sample where a list of `Sample`s holds about 250, so an eval set of any size
    costs little memory (`Sample`s are equal when their fields are).

    Example:
        >>> samples = ArithmeticSamples(array("q", [3, 12]), array("q", [4, 5]), width=2)
        >>> len(samples), samples[1], samples[-1] == samples[1]
        (2, Sample(index=1, prompt='12+5=', answer='17'), True)
    """

    def __init__(self, left: array, right: array, width: int) -> None:
        self._left, self._right, self._width = left, right, width

    def __len__(self) -> int:
        return len(self._left)

    @overload
    def __getitem__(self, index: int) -> Sample: ...
    @overload
    def __getitem__(self, index: slice) -> list[Sample]: ...
    def __getitem__(self, index: int | slice) -> Sample | list[Sample]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        i = operator.index(index)
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(f"sample index {index} out of range for an eval set of {len(self)}")
        a, b = self._left[i], self._right[i]
        return Sample(index=i, prompt=f"{a}+{b}=", answer=str(a + b).zfill(self._width))


def distinct_problems(digits: int) -> int:
    """How many distinct additions of two `digits`-digit operands there are (one digit: 10 x 10).

    Example:
        >>> distinct_problems(1), distinct_problems(2)
        (100, 8100)
    """
    low, high = operand_range(digits)
    return (high - low + 1) ** 2


def _operands(digits: int) -> str:
    low, high = operand_range(digits)
    return f"{low}-{high}"


def _holds_every_problem(prompts: frozenset[str], digits: int) -> bool:
    """Whether `prompts` hold every problem of `digits` digits (only possible with as many prompts)."""
    if len(prompts) < distinct_problems(digits):
        return False
    low, high = operand_range(digits)
    return all(f"{a}+{b}=" in prompts for a in range(low, high + 1) for b in range(low, high + 1))


def _draws(
    rng: random.Random, digits: int, size: int, skip: frozenset[str], distinct: bool = True
) -> Iterator[tuple[int, int]]:
    """`size` operand pairs drawn uniformly, never a prompt in `skip`; with `distinct`, never one twice
    (the caller checks that there are enough)."""
    low, high = operand_range(digits)
    seen: set[int] = set()  # a * (high + 1) + b: an int a pair, for large sets
    while size:
        a, b = rng.randint(low, high), rng.randint(low, high)
        key = a * (high + 1) + b
        if key in seen or (skip and f"{a}+{b}=" in skip):
            continue
        if distinct:
            seen.add(key)
        size -= 1
        yield a, b


def operand_range(digits: int) -> tuple[int, int]:
    """Smallest and largest operand with `digits` digits (one digit includes 0)."""
    if digits < 1:
        raise ValueError(f"digits must be a positive integer, got {digits}")
    return (0 if digits == 1 else 10 ** (digits - 1)), 10**digits - 1


class ArithmeticTask:
    """Addition problems such as ``"37+5="`` answered by the digits of the sum, zero-padded to
    the width of the largest sum of that many digits (``"3+4="`` -> ``"07"``).

    A fixed answer width per operand size keeps every sum reachable with one answer length:
    a policy that learned short answers for small sums cannot strand the sums of 10 and more
    (the length trap), and each group of completions keeps reward variance.

    Args:
        train_digits: operand digits of the training prompts.
        train_size: number of training prompts (a finite set, iterated in epochs).
        seed: seeds the training set and every eval set (each also by its name).
        held_out: prompts the training set never holds (e.g. every eval set's prompts): training
            draws from the other problems.

    Raises:
        ValueError: for digits or a size below 1, or when `held_out` holds every problem of
            `train_digits` digits.

    Example:
        >>> task = ArithmeticTask(train_digits=1, train_size=4, seed=0)
        >>> s = task.train_samples()[0]
        >>> sample = task.make_samples("demo", digits=1, size=1)[0]
        >>> a, b = map(int, sample.prompt.rstrip("=").split("+"))
        >>> sample.answer == f"{a + b:02d}"  # zero-padded to the width of the largest sum
        True
        >>> task.reward(s.answer, s.answer), task.reward("x", s.answer)
        (1.0, 0.0)
    """

    summary_metrics = ("accuracy", "reward/mean")
    """The metrics of each round's line in the console."""
    retry_feedback = "="
    """What a retry environment shows after a wrong answer (the alphabet has no letters): "again, =" ."""

    def __init__(
        self, train_digits: int = 1, train_size: int = 256, seed: int = 0, held_out: Iterable[str] = ()
    ) -> None:
        operand_range(train_digits)  # validates
        if train_size < 1:
            raise ValueError(f"task.train_size must be a positive integer, got {train_size}")
        self.train_digits = train_digits
        self.train_size = train_size
        self.seed = seed
        self.held_out = frozenset(held_out)
        if _holds_every_problem(self.held_out, train_digits):
            raise ValueError(
                f"every one of the {distinct_problems(train_digits)} {train_digits}-digit problems is held out of "
                "training: hold out fewer (smaller eval sets of that many digits)"
            )
        self.tokenizer = CharTokenizer(ALPHABET)

    def max_answer_len(self, digits: int) -> int:
        """Characters in the longest answer for operands of `digits` digits."""
        return len(str(2 * operand_range(digits)[1]))

    def make_samples(self, name: str, digits: int, size: int) -> ArithmeticSamples:
        """`size` distinct problems with `digits`-digit operands, drawn without replacement, the same
        for the same (seed, name): each prompt is counted once.

        Raises:
            ValueError: when `size` exceeds `distinct_problems(digits)`, naming that number.

        Example:
            >>> samples = ArithmeticTask().make_samples("all", digits=1, size=100)
            >>> len({s.prompt for s in samples})
            100
        """
        distinct = distinct_problems(digits)
        if not 1 <= size <= distinct:
            raise ValueError(
                f"an eval set of {size} {digits}-digit additions: there are only {distinct} distinct problems "
                f"(operands {_operands(digits)}); give a size from 1 to {distinct}"
            )
        rng = random.Random(f"{self.seed}/{name}/{digits}")  # str seeds hash with sha512: stable across runs
        left, right = array("q"), array("q")
        for a, b in _draws(rng, digits, size, frozenset()):
            left.append(a)
            right.append(b)
        return ArithmeticSamples(left, right, self.max_answer_len(digits))

    def train_samples(self) -> list[Sample]:
        """`train_size` training problems of `train_digits`-digit operands, drawn with replacement
        (training repeats them anyway, epoch after epoch) from every problem that is not held out."""
        rng = random.Random(f"{self.seed}/train/{self.train_digits}")
        width = self.max_answer_len(self.train_digits)
        pairs = _draws(rng, self.train_digits, self.train_size, self.held_out, distinct=False)
        return [Sample(i, f"{a}+{b}=", str(a + b).zfill(width)) for i, (a, b) in enumerate(pairs)]

    def reward(self, completion: str, answer: str) -> float:
        """Exact match of the completion (up to EOS) with the answer."""
        return CORRECT_REWARD if completion == answer else WRONG_REWARD

    def score_many(self, completions: list[str], answers: list[str]) -> list[Score]:
        """Each completion's reward; one that is not a number (empty, or ``"3+"``) is a parse failure."""
        return [
            Score(self.reward(c, a)) if c.isdigit() else Score(WRONG_REWARD, ScoreStatus.PARSE_FAILURE)
            for c, a in zip(completions, answers, strict=True)
        ]

    def reference_completion(self, sample: Sample) -> str | None:
        """The completion the reward must score correct for `sample`: its answer, as written.

        Example:
            >>> ArithmeticTask().reference_completion(Sample(0, "3+4=", "07"))
            '07'
        """
        return sample.answer

    def answer_id(self, completion: str) -> int:
        """An id per distinct final answer, for majority voting; NO_ANSWER_ID when there is none."""
        return int(completion) if completion.isdigit() else NO_ANSWER_ID
