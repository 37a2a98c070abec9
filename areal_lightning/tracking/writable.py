"""Can a command write where it was told to? Asked once, before any work, so that a bad path is a
one-line error and not a traceback after training started.

A path is writable when it is (or can become) a directory, or a file in one, that this process can
create entries in. Permissions alone do not tell (root ignores them; ``/proc`` refuses ``mkdir`` to
root too; a read-only mount refuses everyone), so the deepest directory that exists is probed by
creating and removing an empty temporary directory in it: the one honest test, and it leaves
nothing behind.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

_PROBE_PREFIX = ".areal-lightning-probe-"


def _deepest_existing(path: Path) -> Path:
    """`path` itself or its nearest ancestor that exists (the current directory for a relative path)."""
    candidate = path
    while not candidate.exists() and candidate != candidate.parent:
        if candidate.is_symlink():  # a dangling link: it blocks the path as a file does
            return candidate
        candidate = candidate.parent
    return candidate


def _probe(directory: Path) -> str | None:
    """None when an entry can be created in `directory`, else why not (the system's words)."""
    try:
        made = tempfile.mkdtemp(prefix=_PROBE_PREFIX, dir=directory)
    except OSError as err:
        return f"{directory} does not accept new entries ({err.strerror or type(err).__name__})"
    os.rmdir(made)
    return None


def directory_problem(path: str | Path) -> str | None:
    """Why `path` cannot be used as a directory to write into, or None when it can.

    Nothing is created (the probe's temporary directory is removed again).

    Example:
        >>> directory_problem("/proc/no/such/run")
        '/proc does not accept new entries (No such file or directory)'
        >>> directory_problem(".") is None
        True
    """
    path = Path(path)
    found = _deepest_existing(path)
    if not found.is_dir():
        what = "a dangling link" if found.is_symlink() and not found.exists() else "a file"
        return f"{found} is {what}, not a directory"
    return _probe(found)


def file_problem(path: str | Path) -> str | None:
    """Why a file cannot be written (created or appended to) at `path`, or None when it can.

    Example:
        >>> file_problem("/proc/no/such/eval_history.jsonl")
        '/proc does not accept new entries (No such file or directory)'
    """
    path = Path(path)
    if path.is_dir():
        return f"{path} is a directory, not a file"
    if path.exists():
        # An existing file: opening it for appending writes nothing and is what the command will do.
        try:
            with path.open("a"):
                pass
        except OSError as err:
            return f"{path} cannot be written ({err.strerror or type(err).__name__})"
        return None
    return directory_problem(path.parent)


def option_problem(option: str, path: str | Path, *, is_file: bool = False, shown: str | None = None) -> str | None:
    """The one-line error for an option (``output_dir``, ``--history``, ``--out``) whose path cannot
    be written, or None. `shown` is the value as the user gave it, when `path` was derived from it.

    Example:
        >>> option_problem("output_dir", "/proc/x/run")
        "output_dir '/proc/x/run' cannot be written: /proc does not accept new entries (No such file or directory)"
    """
    problem = file_problem(path) if is_file else directory_problem(path)
    if problem is None:
        return None
    return f"{option} {shown if shown is not None else str(path)!r} cannot be written: {problem}"


__all__ = ["directory_problem", "file_problem", "option_problem"]
