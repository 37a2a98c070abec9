"""How a round reports its progress: a small protocol the caller implements (a Trainer's progress
bar, a terminal bar, nothing), fed by the batch list as `evaluate_fn` walks it.

The round never wraps the user's batches in a progress iterator: a wrapper can touch them before
`evaluate_fn` runs (tqdm's asyncio variant calls ``iter()`` in its constructor), and a progress
bar must never change what the round computes. Progress is UI: a reporter that raises is switched
off with a warning, and the round goes on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from tqdm import tqdm

log = logging.getLogger(__name__)


class RoundProgress(Protocol):
    """Shows one eval set's batches as they finish (rank 0 only; other ranks get None)."""

    def start(self, dataset: str, total: int) -> None:
        """A new eval set of `total` batches begins."""

    def advance(self) -> None:
        """One more batch is done."""

    def close(self) -> None:
        """The eval set is done (or failed): remove or finish its bar."""


class GuardedProgress:
    """Forwards to a `RoundProgress` until it raises; then logs once and stays silent.

    Example:
        >>> class Broken:
        ...     def start(self, dataset, total): raise RuntimeError("no terminal")
        ...     def advance(self): pass
        ...     def close(self): pass
        >>> p = GuardedProgress(Broken())
        >>> p.start("easy", 3); p.advance(); p.close()  # nothing raised
        >>> p.enabled
        False
    """

    def __init__(self, inner: RoundProgress | None) -> None:
        self._inner = inner
        self.enabled = inner is not None

    def _call(self, method: str, *args: object) -> None:
        if not self.enabled:
            return
        try:
            getattr(self._inner, method)(*args)
        except Exception as err:  # noqa: BLE001 - a progress bar must never fail an evaluation
            self.enabled = False
            log.warning("evaluation progress display switched off: %s: %s", type(err).__name__, err)

    def start(self, dataset: str, total: int) -> None:
        self._call("start", dataset, total)

    def advance(self) -> None:
        self._call("advance")

    def close(self) -> None:
        self._call("close")


def progress_label(dataset: str) -> str:
    """What a progress display calls an eval set's round."""
    return f"Evaluating {dataset}"


class TqdmProgress:
    """A tqdm bar per eval set, made by `make_bar(dataset, total)`."""

    def __init__(self, make_bar: Callable[[str, int], tqdm[Any]]) -> None:
        self._make_bar = make_bar
        self._bar: tqdm[Any] | None = None

    def start(self, dataset: str, total: int) -> None:
        self._bar = self._make_bar(dataset, total)

    def advance(self) -> None:
        if self._bar is not None:
            self._bar.update(1)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


def terminal_progress() -> TqdmProgress:
    """A tqdm bar per eval set on stderr, for commands that run without a Trainer (``evaluate``)."""

    def make_bar(dataset: str, total: int) -> tqdm[Any]:
        from tqdm import tqdm  # Lightning's own progress-bar dependency

        return tqdm(total=total, desc=progress_label(dataset), unit="batch", leave=False, dynamic_ncols=True)

    return TqdmProgress(make_bar)
