"""Each prompt's story across rounds: the prompts gained and lost since the previous round, accuracy
per difficulty bucket, and the gap pass@k - pass@1. Pure Python (no torch): the config loads it.

A round's per-prompt outcomes (`EvalContext.record_outcomes`: the default evaluation records each
prompt's share of correct samples as ``accuracy``) are the input; `StoryKeeper` in
``callbacks/story_keeper.py`` gathers every rank's outcomes and calls `story_metrics`. The names
it adds to a set's metrics follow from the set's own names (`story_metric_names`):

* ``<metric>/gained``, ``<metric>/lost``: prompts solved now and not in the previous round, and the
  reverse (a prompt is solved when its outcome is at least ``solved_at``);
* ``<metric>/bucket/<bucket>``: the mean outcome of the prompts in each difficulty bucket, buckets
  from each prompt's outcome at the first round (``hard``: 0, ``medium``: between, ``easy``: 1) or
  from a stratum field of the samples (``buckets: stratum``);
* ``pass@<k>/gap``: ``pass@<k> - pass@1`` for every ``pass@<k>`` with k > 1: RL that adds capability
  raises pass@k, RL that only sharpens raises pass@1 towards it (the gap closes).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Optional

from areal_lightning.callbacks.choices import choice
from areal_lightning.errors import ArgumentError, owned_by

GAINED, LOST, BUCKET, GAP = "gained", "lost", "bucket", "gap"
"""Name parts of the story metrics: ``accuracy/gained``, ``accuracy/bucket/hard``, ``pass@4/gap``."""
HARD, MEDIUM, EASY = "hard", "medium", "easy"
FIRST_ROUND_BUCKETS = (HARD, MEDIUM, EASY)
"""The difficulty buckets from the first round: no sample right, some right, every sample right."""
DEFAULT_MAX_FILE_MIB = 64.0
OWNER = "PromptStorySettings"
_PASS_AT = re.compile(r"pass@(\d+)")


class StoryBuckets(str, Enum):
    """Where the difficulty buckets come from: each prompt's outcome at the first round, or a field
    of its sample (``stratum``: the field `PromptStorySettings.stratum_field` names)."""

    FIRST_ROUND = "first_round"
    STRATUM = "stratum"


@dataclass
class PromptStorySettings:
    """Each prompt's outcome across rounds (the YAML ``evaluator.decisions.prompt_story`` block; null: off)."""

    metric: str = "accuracy"
    """The per-prompt outcome the story follows (as evaluate_fn records it; the default evaluation
    records accuracy)."""
    buckets: StoryBuckets = StoryBuckets.FIRST_ROUND
    """first_round: hard / medium / easy from each prompt's outcome at the first round; stratum: the
    samples' stratum_field."""
    stratum_field: str = "stratum"
    """With buckets: stratum, the sample attribute or key that names its bucket (the math task's level, ...)."""
    solved_at: float = 0.5
    """A prompt counts as solved in a round when its outcome is at least this (gained: unsolved before, solved now)."""
    max_file_mib: Optional[float] = DEFAULT_MAX_FILE_MIB
    """Bound of <output_dir>/prompt_outcomes.jsonl in MiB: rounds past it are not written (an event
    says so); null: none."""

    def __post_init__(self) -> None:
        with owned_by(OWNER):
            self.buckets = choice("buckets", self.buckets, StoryBuckets)
        self.check()

    def check(self) -> None:
        """Refuses a value the story cannot use.

        Raises:
            ArgumentError: naming the field (``PromptStorySettings(solved_at=...)``), its value and what
                is accepted.
        """
        for arg, value in (("metric", self.metric), ("stratum_field", self.stratum_field)):
            if not isinstance(value, str) or not value:
                raise ArgumentError(OWNER, arg, value, "a non-empty string")
        solved = self.solved_at
        if isinstance(solved, bool) or not isinstance(solved, (int, float)) or not 0 < solved <= 1:
            raise ArgumentError(OWNER, "solved_at", solved, "a number in (0, 1]")
        mib = self.max_file_mib
        if mib is not None and (isinstance(mib, bool) or not isinstance(mib, (int, float)) or not 0 < mib < math.inf):
            raise ArgumentError(OWNER, "max_file_mib", mib, "a positive number of MiB or None")


def gap_names(base_names: Iterable[str]) -> list[str]:
    """``pass@<k>/gap`` for every ``pass@<k>`` with k > 1 among `base_names`, when ``pass@1`` is there too.

    Example:
        >>> gap_names(["accuracy", "pass@1", "pass@4", "pass@8", "pass@4/stderr"])
        ['pass@4/gap', 'pass@8/gap']
    """
    names = set(base_names)
    if "pass@1" not in names:
        return []
    ks = sorted(int(m.group(1)) for n in names if (m := _PASS_AT.fullmatch(n)) and int(m.group(1)) > 1)
    return [f"pass@{k}/{GAP}" for k in ks]


def story_metric_names(
    base_names: Iterable[str], settings: PromptStorySettings | None = None, strata: Iterable[str] = ()
) -> list[str]:
    """Every name the prompt story may add to an eval set whose rounds log `base_names`, sorted.

    The gap needs ``pass@1`` and a ``pass@<k>``; the other names need the story's `metric` among
    `base_names` and its per-prompt outcomes.

    Args:
        base_names: the names the set's evaluation logs (``accuracy``, ``pass@1``, ``pass@4`` ...).
        settings: the story's settings; None: the story is off (no names).
        strata: the set's strata, for ``buckets: stratum``.

    Example:
        >>> story_metric_names(["accuracy", "pass@1", "pass@4"], PromptStorySettings())
        ['accuracy/bucket/easy', 'accuracy/bucket/hard', 'accuracy/bucket/medium', 'accuracy/gained',
         'accuracy/lost', 'pass@4/gap']
    """
    if settings is None:
        return []
    base = list(base_names)
    names = gap_names(base)
    if settings.metric in base:
        m = settings.metric
        buckets = FIRST_ROUND_BUCKETS if settings.buckets is StoryBuckets.FIRST_ROUND else sorted(set(strata))
        names += [f"{m}/{GAINED}", f"{m}/{LOST}", *(f"{m}/{BUCKET}/{b}" for b in buckets)]
    return sorted(names)


def gap_metrics(metrics: Mapping[str, float]) -> dict[str, float]:
    """``{pass@<k>/gap: pass@<k> - pass@1}`` for the round's `metrics` (see `gap_names`).

    Example:
        >>> gap_metrics({"pass@1": 0.25, "pass@4": 0.75})
        {'pass@4/gap': 0.5}
    """
    out = {}
    for name in gap_names(metrics):
        k_name = name.rsplit("/", 1)[0]
        out[name] = float(metrics[k_name]) - float(metrics["pass@1"])
    return out


def is_solved(outcome: float, solved_at: float) -> bool:
    """A prompt's outcome counts as solved (NaN never does)."""
    return outcome >= solved_at


def gained_lost(current: Mapping[int, float], previous: Mapping[int, float], solved_at: float) -> tuple[int, int]:
    """(prompts solved now and not before, prompts solved before and not now), over the prompts both rounds hold.

    Example:
        >>> gained_lost({0: 1.0, 1: 0.25, 2: 0.5}, {0: 0.0, 1: 0.75, 2: 0.5}, solved_at=0.5)
        (1, 1)
    """
    gained = lost = 0
    for i in current.keys() & previous.keys():
        now, before = is_solved(current[i], solved_at), is_solved(previous[i], solved_at)
        gained += now and not before
        lost += before and not now
    return gained, lost


def first_round_bucket(outcome: float) -> str | None:
    """A prompt's difficulty from its first-round outcome (share of correct samples); None for NaN.

    Example:
        >>> [first_round_bucket(v) for v in (0.0, 0.25, 1.0)]
        ['hard', 'medium', 'easy']
    """
    if math.isnan(outcome):
        return None
    return HARD if outcome <= 0.0 else EASY if outcome >= 1.0 else MEDIUM


def bucket_means(outcomes: Mapping[int, float], buckets: Mapping[int, str], names: Iterable[str]) -> dict[str, float]:
    """The mean outcome of each bucket in `names` (NaN for a bucket without prompts this round).

    Sums are `math.fsum` (correctly rounded, whatever the order): the same on any number of ranks.

    Example:
        >>> bucket_means({0: 1.0, 1: 0.5, 2: 0.0}, {0: "easy", 1: "hard", 2: "hard"}, ["hard", "easy"])
        {'hard': 0.25, 'easy': 1.0}
    """
    members: dict[str, list[float]] = {name: [] for name in names}
    for i, value in outcomes.items():
        bucket = buckets.get(i)
        if bucket in members and not math.isnan(value):
            members[bucket].append(value)
    return {b: (math.fsum(v) / len(v) if v else math.nan) for b, v in members.items()}


def story_metrics(
    metric: str,
    current: Mapping[int, float],
    previous: Mapping[int, float] | None,
    buckets: Mapping[int, str],
    bucket_names: Iterable[str],
    solved_at: float,
) -> dict[str, float]:
    """The story of one eval set's round for `metric`: gained and lost since the previous round (0
    and 0 at the first round: nothing to compare with) and each bucket's mean outcome.

    Example:
        >>> story_metrics("accuracy", {0: 1.0, 1: 0.0}, {0: 0.0, 1: 0.0}, {0: "hard", 1: "hard"}, ["hard"], 0.5)
        {'accuracy/gained': 1.0, 'accuracy/lost': 0.0, 'accuracy/bucket/hard': 0.5}
    """
    out: dict[str, float] = {}
    # The first round has none to compare with: nothing gained or lost (and a monitor finds its value).
    gained, lost = gained_lost(current, previous, solved_at) if previous is not None else (0, 0)
    out[f"{metric}/{GAINED}"], out[f"{metric}/{LOST}"] = float(gained), float(lost)
    for bucket, mean in bucket_means(current, buckets, bucket_names).items():
        out[f"{metric}/{BUCKET}/{bucket}"] = mean
    return out
