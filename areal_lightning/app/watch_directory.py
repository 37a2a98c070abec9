"""What `evaluate --watch` decides from the checkpoint directory, pure of any Fabric: which files
are stable, which steps are done, the next checkpoint to evaluate, and a stop request."""

from __future__ import annotations

import logging
import signal
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

log = logging.getLogger("areal_lightning")

WATCH_TRIGGER = "watch"
"""The `trigger` of the watcher's history records; also how a restarted watcher knows what it did."""
STOP_FILENAME = "STOP_WATCH"
"""Create ``<CHECKPOINT_DIR>/STOP_WATCH`` to stop the watcher once every checkpoint present is evaluated."""
CHECKPOINT_SUFFIX = ".ckpt"
DEFAULT_POLL_SECS = 2.0
MAX_LOAD_FAILURES = 5
"""Polls at which a stable checkpoint may fail to load before it is reported and left alone."""


@dataclass
class DirectoryState:
    """Rank 0's view of the checkpoint directory across polls (a pure bookkeeping object).

    A file is *stable* once its (size, mtime) is the same at two polls in a row; its step is
    read once per stable signature.
    """

    seen: dict[Path, tuple[int, int]] = field(default_factory=dict)
    steps: dict[Path, tuple[tuple[int, int], int, int]] = field(default_factory=dict)  # sig, step, epoch
    load_failures: dict[Path, int] = field(default_factory=dict)
    given_up: set[Path] = field(default_factory=set)

    def poll(self, directory: Path) -> tuple[list[Path], list[Path]]:
        """(stable, unstable) checkpoint files of `directory` now."""
        stable: list[Path] = []
        unstable: list[Path] = []
        now: dict[Path, tuple[int, int]] = {}
        for path in sorted(directory.glob(f"*{CHECKPOINT_SUFFIX}")):
            try:
                st = path.stat()
            except FileNotFoundError:  # replaced between glob and stat (last.ckpt)
                continue
            now[path] = (st.st_size, st.st_mtime_ns)
            (stable if self.seen.get(path) == now[path] and st.st_size > 0 else unstable).append(path)
        self.seen = now
        return stable, unstable


def read_step(path: Path, trust: bool = False) -> tuple[int, int] | None:
    """(global_step, epoch) of a checkpoint, read lazily (mmap); None when it does not load yet.

    Only plain values are unpickled unless `trust` (``--trust-checkpoint``), as when the weights load.
    """
    import torch

    from areal_lightning.app.checkpoints import checkpoint_epoch

    try:
        ckpt = torch.load(path, map_location="cpu", mmap=True, weights_only=not trust)
        return int(ckpt["global_step"]), checkpoint_epoch(ckpt)
    except Exception:  # noqa: BLE001 - partial, foreign or unreadable: retried at a later poll
        return None


def done_steps(history_file: Path) -> set[int]:
    """Steps the watcher already evaluated (or gave up on), from its records in the eval history."""
    from areal_lightning.tracking.history import read_history

    if not history_file.is_file():
        return set()
    return {
        int(r["step"])
        for r in read_history(history_file)
        if WATCH_TRIGGER in r.get("trigger", ()) or r.get("source") == WATCH_TRIGGER
    }


@dataclass(frozen=True)
class Decision:
    """What every rank does next: ``eval`` (the file, its step and epoch), ``wait`` or ``stop``."""

    action: str
    path: str | None = None
    step: int = -1
    epoch: int = 0
    reason: str = ""


def next_checkpoint(steps: Mapping[Path, tuple[int, int]], done: set[int]) -> tuple[Path, int, int] | None:
    """The oldest not yet evaluated checkpoint: lowest step; for one step, ``step<N>.ckpt`` before ``last.ckpt``.

    Example:
        >>> next_checkpoint({Path("last.ckpt"): (8, 0), Path("step4.ckpt"): (4, 0), Path("step8.ckpt"): (8, 0)}, {4})
        (PosixPath('step8.ckpt'), 8, 0)
    """
    todo = sorted(
        (step, path.name == "last.ckpt", path.name, path, epoch)
        for path, (step, epoch) in steps.items()
        if step not in done
    )
    return (todo[0][3], todo[0][0], todo[0][4]) if todo else None


class StopRequest:
    """Ctrl-C and SIGTERM set a flag (the checkpoint at hand is finished first); a second Ctrl-C interrupts."""

    def __init__(self) -> None:
        self.requested = False
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.requested and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.requested = True
        log.info("stop requested (%s): finishing the checkpoint at hand", signal.Signals(signum).name)

    def __enter__(self) -> StopRequest:
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
