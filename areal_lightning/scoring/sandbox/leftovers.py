"""Sandbox directories whose process died without removing them (killed with SIGKILL, out of
memory, ``os._exit``): each directory names its owner (`mark_owner`), and a sandbox that starts
removes those of owners that are gone (`remove_leftovers`), so a crashed run leaves its files for
one run at most."""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

PREFIX = "areal-sandbox-"
"""The name every sandbox's directory starts with (`tempfile.mkdtemp(prefix=...)`)."""
OWNER_FILE = ".owner"
"""In a sandbox's directory: ``<pid> <start time>`` of the process that made it."""


def _start_time(pid: int) -> str | None:
    """When process `pid` started (clock ticks since boot, /proc/<pid>/stat field 22); None: no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]  # after the command name, which may hold spaces


def mark_owner(base: str) -> None:
    """Writes this process as the owner of the sandbox directory `base`."""
    Path(base, OWNER_FILE).write_text(f"{os.getpid()} {_start_time(os.getpid())}")


def owner_alive(base: Path) -> bool:
    """Whether the process that made `base` still runs (a reused pid with another start time does
    not count); True where `base` names no owner (made by an older version, or still being made)."""
    try:
        pid, started = (base / OWNER_FILE).read_text().split()
    except (OSError, ValueError):
        return True
    return _start_time(int(pid)) == started


def remove_leftovers(directory: str | None) -> list[str]:
    """Removes the sandbox directories in `directory` (None: the system's temporary directory)
    that this user made and whose owner is gone; returns their paths.

    Example:
        >>> remove_leftovers("/nonexistent")
        []
    """
    import tempfile

    root = Path(directory or tempfile.gettempdir())
    removed = []
    with contextlib.suppress(OSError):
        for base in root.glob(f"{PREFIX}*"):
            with contextlib.suppress(OSError):
                if base.is_dir() and base.stat().st_uid == os.getuid() and not owner_alive(base):
                    shutil.rmtree(base, ignore_errors=True)
                    removed.append(str(base))
    return removed
