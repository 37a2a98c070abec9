"""Exact, cost-balanced sharding of eval data, and per-sample seeds.

An evaluation round must give the same per-sample outcomes and metrics on 1, 2 or N devices.
Three pure pieces make that true; every rank computes them locally from the same inputs:

1. :func:`global_batches` cuts the eval set into one list of batches that never depends on the
   number of devices (batches of similar cost go together, so padding is cheap).
2. :func:`deal_batches` deals whole batches to ranks, every batch exactly once (no padding
   samples, unlike ``DistributedSampler``, whose duplicates Lightning's validation loop counts
   twice), balancing the expected cost per rank rather than the count.
3. :func:`sample_seed` gives each sample its own seed from (run seed, eval set name, sample
   index), so a sample's randomness does not depend on its batch or rank.

Ranks check that they built the same eval sets with `areal_lightning.eval_round.fingerprint`.

Cost model: a batch is generated padded to its longest sample, so a batch costs
``len(batch) * max(cost of its samples)`` (see :func:`batch_cost`). A sample's cost is whatever
the caller expects to scale with its evaluation time, e.g. the prompt length in tokens.
"""

from __future__ import annotations

import hashlib
import heapq
import json
import math
import operator
from collections.abc import Sequence
from typing import SupportsIndex

__all__ = [
    "batch_cost",
    "batch_costs",
    "cost_balance",
    "deal_batches",
    "global_batches",
    "sample_seed",
    "sample_seeds",
    "shard_all_ranks",
    "shard_for_rank",
]

# Seeds fit a signed 64-bit integer, the range torch.Generator.manual_seed and numpy accept.
SEED_BITS = 63
_SEED_MASK = (1 << SEED_BITS) - 1
_SEED_DIGEST_BYTES = 8
# blake2b's personalisation separates our digests from any other use of the same bytes;
# bump the version if the encoding ever changes (it changes every seed and fingerprint).
_SEED_PERSON = b"areal/seed/v1"


def _as_int(value: object, call: str, arg: str, minimum: int | None, shown: str = "") -> int:
    """Return ``value`` as an int; ``shown`` names the value in the message (default ``arg``)."""
    accepted = "an integer" if minimum is None else f"an integer >= {minimum}"
    message = f"{call}({arg}=...) must be {accepted}, got {shown or arg}={value!r}"
    # bool is an int subclass, but batch_size=True is a bug, not a request for 1.
    if isinstance(value, bool) or not isinstance(value, SupportsIndex):
        raise TypeError(message)
    try:
        as_int = operator.index(value)  # accepts numpy integers, rejects floats like 2.0 and float tensors
    except TypeError:
        raise TypeError(message) from None
    if minimum is not None and as_int < minimum:
        raise ValueError(message)
    return as_int


def _as_costs(costs: Sequence[float], call: str, arg: str) -> list[float]:
    checked: list[float] = []
    for i, cost in enumerate(costs):
        not_a_number = f"{call}({arg}=...) must hold numbers, got {arg}[{i}]={cost!r}"
        if isinstance(cost, (str, bytes)):  # float("3") would quietly accept text
            raise TypeError(not_a_number)
        try:
            value = float(cost)
        except (TypeError, ValueError):
            raise TypeError(not_a_number) from None
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"{call}({arg}=...) must hold finite non-negative numbers, got {arg}[{i}]={cost!r}")
        checked.append(value)
    return checked


def _seed_prefix(seed: int, dataset: str, call: str) -> str:
    seed = _as_int(seed, call, "seed", minimum=None)
    if not isinstance(dataset, str):
        raise TypeError(f"{call}(dataset=...) must be a str (the eval set name), got {dataset!r}")
    # JSON of [seed, name, ...] is canonical and unambiguous whatever characters the name holds;
    # the builtin hash() is salted per process (PYTHONHASHSEED) and must never be used here.
    return json.dumps([seed, dataset], ensure_ascii=True, separators=(",", ":"))[:-1] + ","


def _derive_seed(prefix: str, index: int) -> int:
    payload = f"{prefix}{index}]".encode("ascii")
    digest = hashlib.blake2b(payload, digest_size=_SEED_DIGEST_BYTES, person=_SEED_PERSON).digest()
    return int.from_bytes(digest, "big") & _SEED_MASK


def sample_seed(seed: int, dataset: str, index: int) -> int:
    """Return the seed of one eval sample, the same in every process, platform and Python version.

    Args:
        seed: The run seed (e.g. the config's top-level ``seed``).
        dataset: The eval set name, e.g. ``"easy"``.
        index: The sample's index in the eval set, ``>= 0``.

    Returns:
        An integer in ``[0, 2**63)``, usable with ``torch.Generator().manual_seed``.

    Raises:
        TypeError: If ``seed`` or ``index`` is not an integer, or ``dataset`` is not a str.
        ValueError: If ``index`` is negative.

    Example:
        >>> s = sample_seed(1, "easy", 0)
        >>> s == sample_seed(1, "easy", 0) and s != sample_seed(1, "easy", 1)
        True
    """
    prefix = _seed_prefix(seed, dataset, "sample_seed")
    return _derive_seed(prefix, _as_int(index, "sample_seed", "index", minimum=0))


def sample_seeds(seed: int, dataset: str, indices: Sequence[int]) -> list[int]:
    """Return :func:`sample_seed` for each index in ``indices``, in order.

    Args:
        seed: The run seed.
        dataset: The eval set name.
        indices: Sample indices, each ``>= 0`` (e.g. one batch from :func:`shard_for_rank`).

    Raises:
        TypeError, ValueError: As :func:`sample_seed`.

    Example:
        >>> sample_seeds(1, "easy", [3, 4]) == [sample_seed(1, "easy", i) for i in (3, 4)]
        True
    """
    prefix = _seed_prefix(seed, dataset, "sample_seeds")
    return [
        _derive_seed(prefix, _as_int(index, "sample_seeds", "indices", 0, shown=f"indices[{pos}]"))
        for pos, index in enumerate(indices)
    ]


def global_batches(
    costs: Sequence[float],
    batch_size: int,
    *,
    sort_by_cost: bool = True,
    max_batch_cost: float | None = None,
) -> list[list[int]]:
    """Cut sample indices ``0..N-1`` into batches; the result never depends on the world size.

    With ``sort_by_cost`` the samples are ordered by (cost, index), so samples of similar cost
    share a batch and little compute goes to padding; otherwise they keep index order.

    Args:
        costs: The expected cost of each sample (e.g. its prompt length), finite and ``>= 0``.
        batch_size: The most samples in one batch, ``>= 1``.
        sort_by_cost: Batch samples of similar cost together (ties broken by index).
        max_batch_cost: If given, a batch is also closed before its :func:`batch_cost` would
            exceed this budget (a sample that alone exceeds it gets a batch of its own). Use it
            when a few very long prompts would otherwise form one batch heavier than a rank's
            fair share, which no deal of whole batches can balance. ``None``: count only.

    Returns:
        Batches of sample indices; every index appears exactly once.

    Raises:
        TypeError: If ``batch_size`` is not an integer or a cost is not a number.
        ValueError: If ``batch_size < 1``, a cost is negative or not finite (the message names
            the first bad index), or ``max_batch_cost`` is not a positive finite number.

    Example:
        >>> global_batches([5, 1, 3, 2], batch_size=2)
        [[1, 3], [2, 0]]
        >>> global_batches([5, 1, 3, 2], batch_size=2, sort_by_cost=False)
        [[0, 1], [2, 3]]
    """
    batch_size = _as_int(batch_size, "global_batches", "batch_size", minimum=1)
    checked = _as_costs(costs, "global_batches", "costs")
    budget = math.inf
    if max_batch_cost is not None:
        message = (
            f"global_batches(max_batch_cost=...) must be a positive finite number or None, "
            f"got max_batch_cost={max_batch_cost!r}"
        )
        if isinstance(max_batch_cost, (str, bytes, bool)):
            raise TypeError(message)
        try:
            budget = float(max_batch_cost)
        except (TypeError, ValueError):
            raise TypeError(message) from None
        if not (math.isfinite(budget) and budget > 0):
            raise ValueError(message)
    order = list(range(len(checked)))
    if sort_by_cost:
        order.sort(key=lambda i: (checked[i], i))
    batches: list[list[int]] = []
    current: list[int] = []
    current_max = 0.0
    for i in order:
        grown_max = max(current_max, checked[i])
        if current and (len(current) == batch_size or (len(current) + 1) * grown_max > budget):
            batches.append(current)
            current, grown_max = [], checked[i]
        current.append(i)
        current_max = grown_max
    if current:
        batches.append(current)
    return batches


def _padded_cost(costs: Sequence[float], batch: Sequence[int]) -> float:
    return len(batch) * max(costs[i] for i in batch)


def batch_cost(costs: Sequence[float], batch: Sequence[int]) -> float:
    """Return the expected cost of a padded batch: ``len(batch) * max(costs[i] for i in batch)``.

    Generation pads every sample of a batch to the longest one, so the batch costs as if every
    sample were as long as its longest.

    Args:
        costs: The expected cost of each sample.
        batch: Sample indices into ``costs``, at least one.

    Raises:
        ValueError: If ``batch`` is empty, an index is out of range, or a cost is bad.

    Example:
        >>> batch_cost([5, 1, 3], [1, 2])
        6.0
    """
    if len(batch) == 0:
        raise ValueError("batch_cost(batch=...) must hold at least one sample index, got batch=[]")
    for pos, i in enumerate(batch):
        if not 0 <= _as_int(i, "batch_cost", "batch", 0, shown=f"batch[{pos}]") < len(costs):
            raise ValueError(f"batch_cost(batch=...) must hold indices in [0, {len(costs)}), got batch[{pos}]={i!r}")
    picked = _as_costs([costs[i] for i in batch], "batch_cost", "costs[batch]")
    return len(batch) * max(picked)


def batch_costs(costs: Sequence[float], batches: Sequence[Sequence[int]]) -> list[float]:
    """Return :func:`batch_cost` of each batch (e.g. of :func:`global_batches`'s result).

    Example:
        >>> batch_costs([5, 1, 3], [[1, 2], [0]])
        [6.0, 5.0]
    """
    return [batch_cost(costs, batch) for batch in batches]


def deal_batches(batch_costs: Sequence[float], world_size: int) -> list[list[int]]:
    """Deal batch indices to ranks so that every rank gets about the same total cost.

    Longest-processing-time greedy: batches in order of decreasing cost (ties: lower batch index
    first) each go to the rank with the least cost so far (ties: lowest rank). Deterministic, so
    every rank computes the same deal from the same costs. Every batch goes to exactly one rank;
    with fewer batches than ranks some ranks get none (they must still join each collective).

    Args:
        batch_costs: The expected cost of each batch, finite and ``>= 0``.
        world_size: The number of ranks, ``>= 1``.

    Returns:
        For each rank, its batch indices in ascending order.

    Raises:
        TypeError: If ``world_size`` is not an integer or a cost is not a number.
        ValueError: If ``world_size < 1`` or a cost is negative or not finite.

    Example:
        >>> deal_batches([4.0, 1.0, 3.0, 2.0], world_size=2)
        [[0, 1], [2, 3]]
    """
    world_size = _as_int(world_size, "deal_batches", "world_size", minimum=1)
    checked = _as_costs(batch_costs, "deal_batches", "batch_costs")
    loads = [(0.0, rank) for rank in range(world_size)]  # already a heap: (load, rank) ascending
    dealt: list[list[int]] = [[] for _ in range(world_size)]
    for b in sorted(range(len(checked)), key=lambda i: (-checked[i], i)):
        load, rank = heapq.heappop(loads)
        dealt[rank].append(b)
        heapq.heappush(loads, (load + checked[b], rank))
    return [sorted(batches) for batches in dealt]


def shard_all_ranks(
    costs: Sequence[float],
    batch_size: int,
    world_size: int,
    *,
    sort_by_cost: bool = True,
    max_batch_cost: float | None = None,
) -> list[list[list[int]]]:
    """Return every rank's batches: ``result[rank]`` is :func:`shard_for_rank` of that rank.

    A rank needs the others' deals only when every rank must run the same number of forward
    passes (sharded parameters): the longest deal sets how many the others pad.

    Args:
        costs, batch_size, world_size, sort_by_cost, max_batch_cost: As :func:`shard_for_rank`.

    Raises:
        TypeError, ValueError: As :func:`global_batches` and :func:`deal_batches`.

    Example:
        >>> shard_all_ranks([5, 1, 3, 2], 1, world_size=3)
        [[[0]], [[2]], [[1], [3]]]
    """
    world_size = _as_int(world_size, "shard_all_ranks", "world_size", minimum=1)
    batches = global_batches(costs, batch_size, sort_by_cost=sort_by_cost, max_batch_cost=max_batch_cost)
    checked = [float(c) for c in costs]  # validated by global_batches
    dealt = deal_batches([_padded_cost(checked, b) for b in batches], world_size)
    return [[batches[b] for b in rank_batches] for rank_batches in dealt]


def shard_for_rank(
    costs: Sequence[float],
    batch_size: int,
    rank: int,
    world_size: int,
    *,
    sort_by_cost: bool = True,
    max_batch_cost: float | None = None,
) -> list[list[int]]:
    """Return the batches (lists of sample indices) that ``rank`` evaluates.

    The union over all ranks is exactly :func:`global_batches` (each sample once), dealt by
    :func:`deal_batches` on :func:`batch_cost`.

    Args:
        costs: The expected cost of each sample.
        batch_size: The most samples in one batch.
        rank: This rank, in ``[0, world_size)``.
        world_size: The number of ranks.
        sort_by_cost: As :func:`global_batches`.
        max_batch_cost: As :func:`global_batches`.

    Raises:
        TypeError, ValueError: As :func:`global_batches` and :func:`deal_batches`, and if
            ``rank`` is not in ``[0, world_size)``.

    Example:
        >>> [shard_for_rank([5, 1, 3, 2], 2, rank=r, world_size=2) for r in range(2)]
        [[[2, 0]], [[1, 3]]]
    """
    world_size = _as_int(world_size, "shard_for_rank", "world_size", minimum=1)
    rank = _as_int(rank, "shard_for_rank", "rank", minimum=0)
    if rank >= world_size:
        raise ValueError(
            f"shard_for_rank(rank=...) must be in [0, world_size), got rank={rank}, world_size={world_size}"
        )
    return shard_all_ranks(costs, batch_size, world_size, sort_by_cost=sort_by_cost, max_batch_cost=max_batch_cost)[
        rank
    ]


def cost_balance(assignment: Sequence[Sequence[int]], batch_costs: Sequence[float]) -> float:
    """Return the max rank cost over the mean rank cost of a deal (1.0 is perfect balance).

    Args:
        assignment: For each rank, its batch indices (e.g. from :func:`deal_batches`); every
            batch must appear exactly once.
        batch_costs: The expected cost of each batch.

    Raises:
        ValueError: If ``assignment`` is empty or does not hold every batch exactly once, or a
            cost is bad.

    Example:
        >>> cost_balance([[0], [1, 2]], [4.0, 1.0, 1.0])
        1.3333333333333333
    """
    if len(assignment) == 0:
        raise ValueError("cost_balance(assignment=...) must hold one list per rank, got []")
    checked = _as_costs(batch_costs, "cost_balance", "batch_costs")
    owner: dict[int, int] = {}
    for rank, batches in enumerate(assignment):
        for pos, b in enumerate(batches):
            b = _as_int(b, "cost_balance", "assignment", 0, shown=f"assignment[{rank}][{pos}]")
            if b >= len(checked):
                raise ValueError(
                    f"cost_balance(assignment=...) batch indices must be in [0, {len(checked)}), "
                    f"got {b!r} on rank {rank}"
                )
            if b in owner:
                raise ValueError(
                    f"cost_balance(assignment=...) must hold every batch once, "
                    f"got batch {b} on ranks {owner[b]} and {rank}"
                )
            owner[b] = rank
    missing = sorted(set(range(len(checked))) - owner.keys())
    if missing:
        raise ValueError(f"cost_balance(assignment=...) must hold every batch once, batches {missing} are missing")
    loads = [sum(checked[b] for b in batches) for batches in assignment]
    mean = sum(loads) / len(loads)
    return max(loads) / mean if mean > 0 else 1.0
