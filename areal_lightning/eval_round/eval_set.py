"""`EvalSet`: a named list of evaluation samples, with what sharding and fingerprinting need."""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from areal_lightning.errors import ArgumentError
from areal_lightning.eval_round.sampling_params import SamplingParams

DEFAULT_EVAL_BATCH_SIZE = 64


@dataclass(frozen=True)
class EvalSet:
    """A named evaluation set.

    Args:
        name: logged as ``eval/<name>/<metric>``.
        samples: any sequence; `evaluate_fn` receives them in batches.
        batch_size: samples per batch of the global batch list.
        cost_fn: expected evaluation cost of a sample (e.g. its prompt length); batches are
            dealt to ranks to balance it. Default: every sample costs 1.
        key_fn: canonical content of a sample for the cross-rank fingerprint. Default: `repr`.
        max_batch_cost: close a batch before its padded cost (size x largest sample cost)
            exceeds this, so that one batch of the longest prompts cannot outweigh a rank's
            share; independent of the number of devices. None: batches by count only.
        options: free settings passed to `evaluate_fn` through `ctx.options`.
        sampling: how completions are sampled (`ctx.sampling`; the default GRPO evaluation
            reads it); recorded in every history record of the set. Its `seed`, when set,
            replaces the run seed for this set's per-sample seeds.

    Raises:
        ValueError: for an empty name or samples, samples that cannot be indexed (a generator), a
            batch size that is not a positive integer, or a max_batch_cost that is not a positive number.

    Example:
        >>> EvalSet("easy", ["1+1=", "2+3="], batch_size=1).costs
        [1.0, 1.0]
    """

    name: str
    samples: Sequence[Any]
    batch_size: int = DEFAULT_EVAL_BATCH_SIZE
    cost_fn: Callable[[Any], float] | None = None
    key_fn: Callable[[Any], str] = repr
    max_batch_cost: float | None = None
    options: Mapping[str, Any] = field(default_factory=dict)
    sampling: SamplingParams | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name or "/" in self.name:
            raise ValueError(f"`EvalSet(name=...)` must be a non-empty string without '/', got {self.name!r}")
        if isinstance(self.samples, (str, bytes, os.PathLike)):
            # A str is a sequence too: each character would become a sample.
            raise ArgumentError(
                "EvalSet",
                "samples",
                self.samples,
                "a sequence of samples (a list, a tuple, a Dataset ...), not a file name: read the file first, "
                "e.g. samples = [json.loads(line) for line in open(path)] for a JSON lines file",
                f"`EvalSet(name={self.name!r}, samples=...)` got the {type(self.samples).__name__} "
                f"{str(self.samples)!r}; samples must be a sequence of samples (a list, a tuple, a Dataset ...), not "
                "a file name: read the file first, e.g. samples = [json.loads(line) for line in open(path)] for a "
                "JSON lines file",
            )
        if not isinstance(self.samples, Sequence) and not hasattr(self.samples, "__getitem__"):
            # A generator or a set has no stable order or length: sharding indexes the samples.
            raise ArgumentError(
                "EvalSet",
                "samples",
                type(self.samples).__name__,
                "a sequence with a length and indexing (a list, a tuple, a Dataset ...)",
            )
        if len(self.samples) == 0:
            raise ValueError(f"`EvalSet(name={self.name!r})` has no samples; give at least one")
        if isinstance(self.batch_size, bool) or not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise ArgumentError("EvalSet", "batch_size", self.batch_size, "a positive integer")
        cost = self.max_batch_cost
        if cost is not None and (
            isinstance(cost, bool) or not isinstance(cost, (int, float)) or not math.isfinite(cost) or cost <= 0
        ):
            raise ArgumentError("EvalSet", "max_batch_cost", cost, "a positive number or None")
        if self.sampling is not None and not isinstance(self.sampling, SamplingParams):
            raise ArgumentError("EvalSet", "sampling", self.sampling, "a SamplingParams or None")

    @property
    def costs(self) -> list[float]:
        if self.cost_fn is None:
            return [1.0] * len(self.samples)
        return [float(self.cost_fn(s)) for s in self.samples]

    @property
    def keys(self) -> list[str]:
        return [self.key_fn(s) for s in self.samples]

    def first_batches(self, count: int = 1) -> EvalSet:
        """The same set cut to its first `count` x `batch_size` samples (``fast_dev_run`` evaluates
        one batch; the sanity pass one per rank).

        Example:
            >>> len(EvalSet("easy", list(range(10)), batch_size=4).first_batches().samples)
            4
        """
        return dataclasses.replace(self, samples=list(self.samples[: count * self.batch_size]))


def as_eval_sets(eval_sets: Mapping[str, Sequence[Any]] | Sequence[EvalSet]) -> list[EvalSet]:
    """Accepts `{name: samples}` or a list of `EvalSet`; returns `EvalSet`s in the given order.

    Raises:
        ValueError: when empty, when names repeat, or for a value of the wrong type.
    """
    if isinstance(eval_sets, Mapping):
        out = [v if isinstance(v, EvalSet) else EvalSet(name=k, samples=v) for k, v in eval_sets.items()]
    else:
        out = list(eval_sets)
        bad = [type(v).__name__ for v in out if not isinstance(v, EvalSet)]
        if bad:
            raise ValueError(
                f"`eval_sets` must be a mapping name -> samples or a list of EvalSet, got items of type {bad}"
            )
    if not out:
        raise ValueError("`eval_sets` is empty; give at least one eval set")
    names = [s.name for s in out]
    if len(set(names)) != len(names):
        raise ValueError(f"`eval_sets` names must be distinct, got {names}")
    return out
