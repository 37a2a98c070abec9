"""Which prompts an eval set counts, and which training never sees: a prompt counts once (file sets
drop a repeated row, `distinct_prompts`), and the arithmetic eval sets' prompts are held out of
training (`held_out_prompts`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from areal_lightning.app.sections.eval_sets import EvalSetConfig
from areal_lightning.tasks.arithmetic import ArithmeticTask


def held_out_prompts(eval_sets: Mapping[str, EvalSetConfig], train_digits: int, seed: int) -> set[str]:
    """The prompts of the arithmetic eval sets of `train_digits` digits (as `build_eval_sets` draws
    them with the run's `seed`): the training prompts never include them (``task.hold_out_eval``).

    Example:
        >>> sets = {"easy": EvalSetConfig(digits=1, size=5), "hard": EvalSetConfig(digits=2, size=5)}
        >>> len(held_out_prompts(sets, train_digits=1, seed=1))
        5
    """
    maker = ArithmeticTask(seed=seed)
    return {
        sample.prompt
        for name, es in eval_sets.items()
        if not es.is_file_set and es.arithmetic_digits == train_digits
        for sample in maker.make_samples(name, es.arithmetic_digits, es.arithmetic_size())
    }


def distinct_prompts(samples: Sequence[Any], size: int | None) -> tuple[list[Any], list[tuple[int, int]]]:
    """The first `size` samples (all: None) with distinct prompts, in file order, and the rows dropped on
    the way as repeats, as (row, row of its first occurrence), 1-based: a prompt counts once.

    Example:
        >>> from types import SimpleNamespace as S
        >>> kept, dropped = distinct_prompts([S(prompt=p) for p in "abacd"], 3)
        >>> [s.prompt for s in kept], dropped
        (['a', 'b', 'c'], [(3, 1)])
    """
    first: dict[str, int] = {}
    kept: list[Any] = []
    dropped: list[tuple[int, int]] = []
    for row, sample in enumerate(samples, start=1):
        if size is not None and len(kept) == size:
            break
        if sample.prompt in first:
            dropped.append((row, first[sample.prompt]))
            continue
        first[sample.prompt] = row
        kept.append(sample)
    return kept, dropped
