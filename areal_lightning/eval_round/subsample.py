"""Deterministic proportional stratified subsets of an eval set.

The subset depends only on the samples' strata, the requested size and a seed: the same subset
every round (curves stay comparable) and on any number of ranks (it is chosen before the deal).
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from areal_lightning.errors import ArgumentError
from areal_lightning.eval_round.eval_set import EvalSet

DEFAULT_STRATUM_FIELD = "stratum"
NO_STRATUM = "all"


def sample_stratum(sample: Any, field: str | None = DEFAULT_STRATUM_FIELD) -> str:
    """A sample's stratum: its attribute or mapping key `field`; ``all`` when it has none or `field` is None.

    Example:
        >>> sample_stratum({"stratum": "level 3"}), sample_stratum("1+1="), sample_stratum({"src": "a"}, "src")
        ('level 3', 'all', 'a')
    """
    if field is None:
        return NO_STRATUM
    value = sample.get(field, NO_STRATUM) if isinstance(sample, Mapping) else getattr(sample, field, NO_STRATUM)
    return str(value)


def allocate(stratum_sizes: Mapping[str, int], size: int) -> dict[str, int]:
    """How many samples each stratum keeps in a subset of `size`: proportional to its size (largest
    remainder), at least one per stratum while `size` allows, never more than the stratum holds.

    With fewer places than strata, the largest strata (ties: by name) get one each.

    Example:
        >>> allocate({"a": 70, "b": 25, "c": 5}, 10)
        {'a': 7, 'b': 2, 'c': 1}
        >>> allocate({"a": 98, "b": 1, "c": 1}, 10)
        {'a': 8, 'b': 1, 'c': 1}
    """
    total = sum(stratum_sizes.values())
    size = min(size, total)
    names = sorted(stratum_sizes)
    if size < len(names):
        largest = sorted(names, key=lambda s: (-stratum_sizes[s], s))[:size]
        return {s: int(s in largest) for s in names}
    quota = {s: size * stratum_sizes[s] / total for s in names}
    alloc = {s: min(stratum_sizes[s], max(1, math.floor(quota[s]))) for s in names}
    while sum(alloc.values()) > size:  # the minimum of one pushed the sum over: take from the most over quota
        s = max((s for s in names if alloc[s] > 1), key=lambda s: (alloc[s] - quota[s], s))
        alloc[s] -= 1
    while sum(alloc.values()) < size:  # largest remainder first (ties: by name)
        s = max((s for s in names if alloc[s] < stratum_sizes[s]), key=lambda s: (quota[s] - alloc[s], -names.index(s)))
        alloc[s] += 1
    return alloc


def stratified_indices(strata: Sequence[Hashable], size: int, seed: int) -> list[int]:
    """Sorted indices of a proportional stratified subset of `size` (see `allocate`); within a
    stratum the samples are drawn by a generator seeded with (seed, stratum).

    Example:
        >>> stratified_indices(["a"] * 6 + ["b"] * 2 + ["c"] * 2, 5, seed=0)
        [0, 1, 2, 6, 9]
    """
    members: dict[str, list[int]] = {}
    for i, s in enumerate(strata):
        members.setdefault(str(s), []).append(i)
    alloc = allocate({s: len(m) for s, m in members.items()}, size)
    chosen: list[int] = []
    for s in sorted(members):
        chosen += random.Random(f"{seed}/{s}").sample(members[s], alloc[s])  # str seeds are stable across runs
    return sorted(chosen)


@dataclass(frozen=True)
class Subsample:
    """What subset of an eval set to evaluate: ``max_prompts`` or ``fraction`` (one of them),
    stratified by the samples' `stratify_by` field (None: one stratum), drawn with `seed`.

    Raises:
        ArgumentError: without exactly one of max_prompts / fraction, or for a value out of range.

    Example:
        >>> Subsample(fraction=0.25).size(200), Subsample(max_prompts=500).size(200)
        (50, 200)
    """

    max_prompts: int | None = None
    fraction: float | None = None
    stratify_by: str | None = DEFAULT_STRATUM_FIELD
    seed: int = 0

    def __post_init__(self) -> None:
        if (self.max_prompts is None) == (self.fraction is None):
            raise ArgumentError(
                "Subsample",
                "",
                (self.max_prompts, self.fraction),
                "needs exactly one of max_prompts and fraction",
                "`Subsample(...)` needs exactly one of max_prompts and fraction, got "
                f"max_prompts={self.max_prompts!r}, fraction={self.fraction!r}",
            )
        mp = self.max_prompts
        if mp is not None and (isinstance(mp, bool) or not isinstance(mp, int) or mp < 1):
            raise ArgumentError("Subsample", "max_prompts", mp, "a positive integer or None")
        fr = self.fraction
        if fr is not None and (isinstance(fr, bool) or not isinstance(fr, (int, float)) or not 0 < fr <= 1):
            raise ArgumentError("Subsample", "fraction", fr, "a number in (0, 1] or None")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ArgumentError("Subsample", "seed", self.seed, "an integer")

    def size(self, total: int) -> int:
        """Prompts kept out of `total` (at least one)."""
        if self.max_prompts is not None:
            return min(total, self.max_prompts)
        assert self.fraction is not None
        return max(1, min(total, round(self.fraction * total)))


def subsample(eval_set: EvalSet, spec: Subsample) -> EvalSet:
    """The eval set restricted to its stratified subset (same name, options and batching).

    Example:
        >>> full = EvalSet("easy", [{"q": i, "stratum": "ab"[i % 2]} for i in range(10)])
        >>> [s["q"] for s in subsample(full, Subsample(max_prompts=4, seed=1)).samples]
        [0, 1, 6, 7]
    """
    strata = [sample_stratum(s, spec.stratify_by) for s in eval_set.samples]
    keep = stratified_indices(strata, spec.size(len(strata)), spec.seed)
    return dataclasses.replace(eval_set, samples=[eval_set.samples[i] for i in keep])
