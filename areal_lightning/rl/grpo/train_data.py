"""Training data that a resume continues: the same prompts, in the same order, as without the stop.

Two things keep a resumed run on the uninterrupted run's data:

- `EpochShuffle`: epoch ``e``'s order is a function of (seed, ``e``) only. A `RandomSampler`
  with a `torch.Generator` draws each epoch's order from the generator's running state, which a
  resumed process starts afresh: it would replay epoch 0's order. Lightning calls ``set_epoch``
  before each epoch, as it does for a `DistributedSampler` (which, being shuffled itself, takes the
  place of this sampler under DDP: Lightning replaces any `RandomSampler`).
- `ResumableLoader`: a `DataLoader` with Lightning's ``state_dict`` / ``load_state_dict``
  interface. A checkpoint taken mid-epoch holds how many batches of the epoch training took; the
  resumed loader leaves them out of its next pass, where a plain one would start the epoch over.
  Lightning's fetcher takes no batch ahead from a loader with a length, so the count is of the
  batches the completed steps trained on.
"""

from __future__ import annotations

from collections.abc import Iterator, Sized
from typing import Any

import torch
from torch.utils.data import DataLoader, RandomSampler

from areal_lightning.eval_round.sharding import sample_seed

SHUFFLE_STREAM = "train-order"
"""Names the per-epoch shuffle seeds, apart from the rollout seeds and every eval set's."""


class EpochShuffle(RandomSampler):
    """A random order of ``range(len(data_source))`` per epoch, drawn from (seed, epoch) alone.

    Args:
        data_source: what is sampled (only its length is read).
        seed: the run seed.

    Example:
        >>> s = EpochShuffle(range(5), seed=1)
        >>> first = list(s)
        >>> s.set_epoch(1); second = list(s)
        >>> s.set_epoch(0); first == list(s) and sorted(second) == [0, 1, 2, 3, 4]
        True
    """

    def __init__(self, data_source: Sized, seed: int) -> None:
        super().__init__(data_source)
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Lightning calls this before each epoch (``epoch`` counts from 0)."""
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        generator = torch.Generator().manual_seed(sample_seed(self.seed, SHUFFLE_STREAM, self.epoch))
        yield from torch.randperm(len(self.data_source), generator=generator).tolist()


class ResumableLoader(DataLoader):
    """A `DataLoader` whose state is the number of batches taken in its current pass.

    Takes `DataLoader`'s arguments unchanged (so Lightning can rebuild it with a
    `DistributedSampler`). After ``load_state_dict`` of a pass stopped after ``k`` of its ``n``
    batches, the next pass starts at batch ``k`` (``len`` stays ``n``: Lightning reads it as the
    epoch's length, and its batch index goes on from ``k``, so the epoch ends after batch ``n - 1``);
    a state of a finished pass (``k == n``) leaves the next pass whole. The batches left out are
    loaded and dropped (once per resume; drawing their indices alone would go wrong with worker
    processes, which take indices ahead).

    Raises:
        ValueError: the loader has no length (an `IterableDataset`, a sampler without ``len``).

    Example:
        >>> loader = ResumableLoader(list(range(6)), batch_size=2)
        >>> it = iter(loader); first = next(it).tolist()
        >>> state = loader.state_dict()
        >>> resumed = ResumableLoader(list(range(6)), batch_size=2)
        >>> resumed.load_state_dict(state)
        >>> first, state, [b.tolist() for b in resumed], [b.tolist() for b in resumed]
        ([0, 1], {'batches': 1}, [[2, 3], [4, 5]], [[0, 1], [2, 3], [4, 5]])
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        try:
            len(self)
        except TypeError:
            # Lightning takes a batch ahead from a loader without a length: the count would include
            # a batch no step trained on, and a resume would skip it.
            raise ValueError(
                f"ResumableLoader needs a dataset and sampler with a length; got {type(self.dataset).__name__} "
                f"with {type(self.sampler).__name__}"
            ) from None
        self._taken = 0  # batches of the current pass handed out (the skipped ones included)
        self._skip_next = 0  # batches the next pass leaves out (set by load_state_dict)

    def state_dict(self) -> dict[str, int]:
        """What a resume needs: the batches of the current pass taken so far."""
        return {"batches": self._taken}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """The next pass continues the pass `state_dict` was taken in (a missing key: from its start)."""
        taken = int(state_dict.get("batches", 0))
        self._skip_next = taken if taken < len(self) else 0  # a finished pass: the next starts whole

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]  # a generator, not a _BaseDataLoaderIter
        skip, self._skip_next = self._skip_next, 0
        self._taken = skip
        return self._batches(super().__iter__(), skip)

    def _batches(self, batches: Any, skip: int) -> Iterator[Any]:
        for _ in range(skip):
            next(batches)
        for batch in batches:
            self._taken += 1
            yield batch


__all__ = ["SHUFFLE_STREAM", "EpochShuffle", "ResumableLoader"]
