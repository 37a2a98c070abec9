"""`Outcomes`: one metric's per-prompt outcomes of one round, 16 bytes a prompt whatever the set's size."""

from __future__ import annotations

from array import array
from collections.abc import ItemsView, Iterator, Mapping, Sequence
from typing import Any

import numpy as np


class Outcomes(Mapping[int, float]):
    """Sample index -> outcome, held as two numpy arrays (int64 indices, float64 values) sorted by
    index: a mapping that reads like ``{index: value}``, as a dict does, without a Python int and
    float per prompt.

    `add` appends a batch's outcomes; a later value for an index replaces an earlier one, as a
    dict's update does. `arrays` gives the sorted arrays, for vectorised pairing.

    Example:
        >>> o = Outcomes()
        >>> o.add([3, 1], [1.0, 0.5])
        >>> o.add([3], [0.25])
        >>> o, o[3], len(o), 2 in o, o == {1: 0.5, 3: 0.25}
        ({1: 0.5, 3: 0.25}, 0.25, 2, False, True)
    """

    __slots__ = ("_added", "_added_values", "_indices", "_values")

    def __init__(self, items: Mapping[int, float] | None = None) -> None:
        self._indices = np.empty(0, dtype=np.int64)
        self._values = np.empty(0, dtype=np.float64)
        # Batches append to two growing buffers: one object each however many batches, where a
        # list of small arrays kept one object per batch alive among each batch's garbage (the
        # allocator could then return none of that memory: 100 MB at 100,000 prompts).
        self._added, self._added_values = array("q"), array("d")
        if items:
            self.add(list(items.keys()), list(items.values()))

    @classmethod
    def from_arrays(cls, indices: Any, values: Any) -> Outcomes:
        """Outcomes of the given indices and values (any array-likes of one length)."""
        out = cls()
        out.add(indices, values)
        return out

    def add(self, indices: Sequence[int] | np.ndarray, values: Sequence[float] | np.ndarray) -> None:
        """Records `values[i]` as the outcome of sample `indices[i]`.

        Raises:
            ValueError: when the two do not have the same length.
        """
        idx = np.asarray(indices, dtype=np.int64).ravel()
        val = np.asarray(values, dtype=np.float64).ravel()
        if idx.shape != val.shape:
            raise ValueError(f"Outcomes.add got {idx.size} indices and {val.size} values")
        self._added.frombytes(idx.tobytes())
        self._added_values.frombytes(val.tobytes())

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """The indices (sorted, each once) and their values; read-only, shared with this object."""
        if self._added:
            idx = np.concatenate([self._indices, np.frombuffer(self._added, dtype=np.int64)])
            val = np.concatenate([self._values, np.frombuffer(self._added_values, dtype=np.float64)])
            self._added, self._added_values = array("q"), array("d")
            order = np.argsort(idx, kind="stable")  # equal indices keep the order they were added in
            idx, val = idx[order], val[order]
            last = np.ones(idx.size, dtype=bool)
            last[:-1] = idx[1:] != idx[:-1]  # the last value written for an index wins
            self._indices, self._values = idx[last], val[last]
            self._indices.flags.writeable = self._values.flags.writeable = False
        return self._indices, self._values

    def __getitem__(self, index: int) -> float:
        idx, val = self.arrays()
        pos = int(np.searchsorted(idx, index))
        if pos < idx.size and idx[pos] == index:
            return float(val[pos])
        raise KeyError(index)

    def __iter__(self) -> Iterator[int]:
        return iter(self.arrays()[0].tolist())

    def __len__(self) -> int:
        return int(self.arrays()[0].size)

    def items(self) -> ItemsView[int, float]:
        return _Items(self)

    def __repr__(self) -> str:
        idx, val = self.arrays()
        return repr(dict(zip(idx.tolist(), val.tolist(), strict=True)))

    def __reduce__(self) -> tuple[Any, ...]:
        return (Outcomes.from_arrays, self.arrays())


class _Items(ItemsView[int, float]):
    """``(index, value)`` pairs read from the arrays at once (not one search per index)."""

    _mapping: Outcomes

    def __iter__(self) -> Iterator[tuple[int, float]]:
        idx, val = self._mapping.arrays()
        return zip(idx.tolist(), val.tolist(), strict=True)


def as_outcomes(outcomes: Mapping[int, float] | None) -> Outcomes:
    """`outcomes` as an `Outcomes` (itself when it is one; empty for None)."""
    if isinstance(outcomes, Outcomes):
        return outcomes
    return Outcomes(outcomes)
