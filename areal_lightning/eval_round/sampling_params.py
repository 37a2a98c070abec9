"""`SamplingParams`: how an eval set's completions are sampled, checked once and recorded with every number."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from areal_lightning.errors import ArgumentError

DEFAULT_N_SAMPLES = 4
DEFAULT_TEMPERATURE = 0.6


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True)
class SamplingParams:
    """The complete sampling settings of one eval set; a history record carries them (`as_record`).

    Args:
        n_samples: completions per prompt.
        temperature: softmax temperature; 0 is greedy (then top_p and top_k change nothing).
        top_p: nucleus sampling: keep the most likely tokens whose probabilities (after the
            temperature) add up to at least top_p; 1 keeps all.
        top_k: keep the k most likely tokens; None keeps all.
        max_new_tokens: tokens generated per completion; None: the module's default.
        stop: strings that end a completion; its text is cut where the first one begins.
        seed: seed of this set's per-sample seeds; None: the run seed.
        ks: the k of pass@k, pass^k and maj@k (distinct positive integers, each at most n_samples);
            None: 1 and n_samples. Kept sorted.

    Raises:
        ArgumentError: for a value out of range, naming the argument and what is accepted.

    Example:
        >>> SamplingParams(n_samples=8, temperature=1.0, top_p=0.95, stop=["\\n"]).as_record(run_seed=1)["top_p"]
        0.95
        >>> SamplingParams(top_p=0)
        Traceback (most recent call last):
        ...
        areal_lightning.errors.ArgumentError: `SamplingParams(top_p=...)` must be a number in (0, 1], got 0
    """

    n_samples: int = DEFAULT_N_SAMPLES
    temperature: float = DEFAULT_TEMPERATURE
    top_p: float = 1.0
    top_k: int | None = None
    max_new_tokens: int | None = None
    stop: Sequence[str] = field(default_factory=tuple)
    seed: int | None = None
    ks: Sequence[int] | None = None

    def __post_init__(self) -> None:
        if not _is_int(self.n_samples) or self.n_samples < 1:
            raise ArgumentError("SamplingParams", "n_samples", self.n_samples, "a positive integer")
        if not _is_number(self.temperature) or self.temperature < 0:
            raise ArgumentError(
                "SamplingParams", "temperature", self.temperature, "a non-negative number (0 is greedy)"
            )
        if not _is_number(self.top_p) or not 0 < self.top_p <= 1:
            raise ArgumentError("SamplingParams", "top_p", self.top_p, "a number in (0, 1]")
        if self.top_k is not None and (not _is_int(self.top_k) or self.top_k < 1):
            raise ArgumentError("SamplingParams", "top_k", self.top_k, "a positive integer or None")
        if self.max_new_tokens is not None and (not _is_int(self.max_new_tokens) or self.max_new_tokens < 1):
            raise ArgumentError("SamplingParams", "max_new_tokens", self.max_new_tokens, "a positive integer or None")
        if isinstance(self.stop, str) or not all(isinstance(s, str) and s for s in self.stop):
            raise ArgumentError("SamplingParams", "stop", self.stop, "a list of non-empty strings")
        object.__setattr__(self, "stop", tuple(self.stop))
        if self.seed is not None and (not _is_int(self.seed) or self.seed < 0):
            raise ArgumentError("SamplingParams", "seed", self.seed, "a non-negative integer or None")
        if self.ks is not None:
            object.__setattr__(self, "ks", check_ks(self.ks, self.n_samples))

    @property
    def at_ks(self) -> tuple[int, ...]:
        """The k of pass@k, pass^k and maj@k, ascending: `ks`, or 1 and n_samples."""
        return tuple(self.ks) if self.ks is not None else tuple(sorted({1, self.n_samples}))

    def resolved_seed(self, run_seed: int) -> int:
        """The seed the per-sample seeds derive from: this set's own, else the run's."""
        return run_seed if self.seed is None else self.seed

    def as_record(self, run_seed: int) -> dict[str, Any]:
        """The settings as plain JSON values, with the seed actually used."""
        return {
            "n_samples": self.n_samples,
            "temperature": float(self.temperature),
            "top_p": float(self.top_p),
            "top_k": self.top_k,
            "max_new_tokens": self.max_new_tokens,
            "stop": list(self.stop),
            "seed": self.resolved_seed(run_seed),
            "ks": list(self.at_ks),
        }


def check_ks(ks: Any, n_samples: int) -> tuple[int, ...]:
    """`ks` as a sorted tuple, when it is a non-empty list of distinct positive integers, each at most `n_samples`.

    Raises:
        ArgumentError: naming the value and what is accepted.

    Example:
        >>> check_ks([8, 1, 4], n_samples=8)
        (1, 4, 8)
        >>> check_ks([1, 16], n_samples=8)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        areal_lightning.errors.ArgumentError: `SamplingParams(ks=...)` must be ... each at most n_samples=8, got [1, 16]
    """
    accepted = f"a non-empty list of distinct positive integers, each at most n_samples={n_samples}"
    items = list(ks) if isinstance(ks, (list, tuple)) else None
    if not items or not all(_is_int(k) and 1 <= k <= n_samples for k in items) or len(set(items)) != len(items):
        raise ArgumentError("SamplingParams", "ks", ks, accepted)
    return tuple(sorted(items))


def cut_at_stop(text: str, stop: Sequence[str]) -> str:
    """`text` up to where the first of the `stop` strings begins (the whole text when none occurs).

    Example:
        >>> cut_at_stop("12\\nQuestion: 3+4", ["\\nQuestion", "\\n\\n"])
        '12'
    """
    ends = [i for i in (text.find(s) for s in stop) if i >= 0]
    return text[: min(ends)] if ends else text
