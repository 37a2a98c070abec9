"""Eval-set fingerprints: ranks check, before the first round, that they built the same eval sets.

A mismatch (another seed, size or data file on one node) would otherwise silently skew the merged
metrics, or deal some samples twice and others never.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from areal_lightning.eval_round.eval_set import EvalSet
from areal_lightning.eval_round.ranks import all_gather_object

__all__ = [
    "EvalSetMismatchError",
    "check_eval_sets_consistent",
    "check_fingerprints",
    "eval_set_fingerprint",
    "fingerprint",
]

# blake2b's personalisation separates these digests from any other use of the same bytes; bump
# the version if the encoding ever changes.
_FINGERPRINT_PERSON = b"areal/evalset/v1"
FINGERPRINT_DIGEST_BYTES = 8
# Length prefixes make the fingerprint of ["ab", "c"] differ from that of ["a", "bc"].
_LENGTH_PREFIX_BYTES = 8


class EvalSetMismatchError(RuntimeError):
    """Ranks hold different eval sets (different names, sizes or sample contents)."""


def fingerprint(name: str, sample_keys: Sequence[str | bytes]) -> str:
    """Return a short hex digest of an eval set: its name, its size and each sample, in order.

    Args:
        name: The eval set name.
        sample_keys: Each sample's canonical content, e.g. ``prompt + "\\x1f" + answer``; a str
            counts as its UTF-8 bytes.

    Raises:
        TypeError: If ``name`` is not a str or a sample key is neither str nor bytes.

    Example:
        >>> fingerprint("easy", ["1+1=", "2+2="]) == fingerprint("easy", ["1+1=", "2+2="])
        True
        >>> fingerprint("easy", ["1+1=", "2+2="]) == fingerprint("easy", ["2+2=", "1+1="])
        False
    """
    if not isinstance(name, str):
        raise TypeError(f"fingerprint(name=...) must be a str, got {name!r}")
    digest = hashlib.blake2b(digest_size=FINGERPRINT_DIGEST_BYTES, person=_FINGERPRINT_PERSON)

    def add(chunk: bytes) -> None:
        digest.update(len(chunk).to_bytes(_LENGTH_PREFIX_BYTES, "big"))
        digest.update(chunk)

    add(name.encode("utf-8"))
    add(str(len(sample_keys)).encode("ascii"))
    for i, key in enumerate(sample_keys):
        if isinstance(key, str):
            key = key.encode("utf-8")
        elif not isinstance(key, bytes):
            raise TypeError(f"fingerprint(sample_keys=...) must hold str or bytes, got sample_keys[{i}]={key!r}")
        add(key)
    return digest.hexdigest()


def check_fingerprints(per_rank: Sequence[Mapping[str, str]]) -> None:
    """Raise if ranks do not hold the same eval sets.

    Call it once before the first evaluation round with every rank's
    ``{eval set name: fingerprint(...)}`` as gathered by ``all_gather_object``; every rank gets
    the same list, so every rank raises (or not) together.

    Args:
        per_rank: For each rank in order, its eval set names mapped to their fingerprints.

    Raises:
        EvalSetMismatchError: If an eval set is missing on some ranks or its fingerprint differs;
            the message names each such eval set and which ranks hold what.
        ValueError: If ``per_rank`` is empty.
        TypeError: If an entry is not a mapping.

    Example:
        >>> check_fingerprints([{"easy": "ab12"}, {"easy": "ab12"}])  # same sets: no error
    """
    if len(per_rank) == 0:
        raise ValueError("check_fingerprints(per_rank=...) must hold one mapping per rank, got []")
    for rank, sets in enumerate(per_rank):
        if not isinstance(sets, Mapping):
            raise TypeError(
                f"check_fingerprints(per_rank=...) must hold one mapping of eval set name to "
                f"fingerprint per rank, got per_rank[{rank}]={sets!r}"
            )
    problems: list[str] = []
    for name in sorted({name for sets in per_rank for name in sets}, key=str):
        missing = [rank for rank, sets in enumerate(per_rank) if name not in sets]
        if missing:
            problems.append(f"eval set {name!r} is missing on ranks {missing}")
        holders: dict[str, list[int]] = {}
        for rank, sets in enumerate(per_rank):
            if name in sets:
                holders.setdefault(sets[name], []).append(rank)
        if len(holders) > 1:
            groups = ", ".join(f"ranks {ranks} have fingerprint {fp}" for fp, ranks in holders.items())
            problems.append(f"eval set {name!r} differs across ranks: {groups}")
    if problems:
        raise EvalSetMismatchError(
            "; ".join(problems) + "; every rank must build the same eval sets (same seed, size, data files)"
        )


def eval_set_fingerprint(eval_set: EvalSet) -> str:
    """The fingerprint of an eval set's samples and of what the deal and the outcomes depend on
    besides them: batch size, costs, options and sampling settings. Ranks that cut different batches would evaluate
    some samples twice and others never, with the right total count."""
    layout = {
        "batch_size": eval_set.batch_size,
        "max_batch_cost": eval_set.max_batch_cost,
        "costs": eval_set.costs,
        "options": dict(eval_set.options),
        "sampling": repr(eval_set.sampling),
    }
    return fingerprint(eval_set.name, _LayoutAndKeys(json.dumps(layout, sort_keys=True, default=repr), eval_set))


class _LayoutAndKeys(Sequence[str]):
    """The layout, then each sample's key, made one at a time (not a list of every key)."""

    def __init__(self, layout: str, eval_set: EvalSet) -> None:
        self._layout, self._eval_set = layout, eval_set

    def __len__(self) -> int:
        return 1 + len(self._eval_set.samples)

    def __getitem__(self, index: Any) -> Any:
        raise NotImplementedError("iterate it")

    def __iter__(self) -> Iterator[str]:
        yield self._layout
        key = self._eval_set.key_fn
        yield from (key(s) for s in self._eval_set.samples)


def check_eval_sets_consistent(eval_sets: Sequence[EvalSet]) -> None:
    """Raises `EvalSetMismatchError` on every rank when ranks hold different eval sets.

    Every rank must call it (one object gather); without a process group it checks nothing.
    """
    check_fingerprints(all_gather_object({s.name: eval_set_fingerprint(s) for s in eval_sets}))
