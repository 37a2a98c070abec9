"""`ArgumentError`: a constructor argument outside what it accepts, with the parts a config needs.

The plugin's constructors check their arguments once and raise this; the app's config reuses the
same checks and rewords the error with the config key (``evaluator.freq_steps``) instead of the call.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


class ArgumentError(ValueError):
    """`owner(arg=value)` is refused; `accepted` says what would be taken (for a problem of several
    arguments together, `arg` is empty and `accepted` words the problem).

    Example:
        >>> str(ArgumentError("HybridTrigger", "freq_steps", -5, "a positive integer or None"))
        '`HybridTrigger(freq_steps=...)` must be a positive integer or None, got -5'
    """

    def __init__(self, owner: str, arg: str, value: Any, accepted: str, message: str | None = None) -> None:
        self.owner, self.arg, self.value, self.accepted = owner, arg, value, accepted
        default = f"`{owner}({arg}=...)` must be {accepted}, got {value!r}" if arg else f"`{owner}(...)` {accepted}"
        super().__init__(message or default)


@contextlib.contextmanager
def owned_by(owner: str) -> Iterator[None]:
    """Re-raises the `ArgumentError` of a check that `owner` runs on its own fields as `owner`'s, so
    that the message names the class and field the user wrote (``Schedule(freq_steps=...)``), not
    the internal class whose check it reuses.

    Example:
        >>> with owned_by("Schedule"):
        ...     raise ArgumentError("HybridTrigger", "freq_steps", 0, "a positive integer or None")
        Traceback (most recent call last):
        ...
        areal_lightning.errors.ArgumentError: `Schedule(freq_steps=...)` must be a positive integer or None, got 0
    """
    try:
        yield
    except ArgumentError as err:
        if err.owner == owner:
            raise
        text = str(err)
        # The check's own wording (Lightning's "Possible choices" one included), with the user's class in it.
        message = text.replace(f"`{err.owner}(", f"`{owner}(") if f"`{err.owner}(" in text else None
        raise ArgumentError(owner, err.arg, err.value, err.accepted, message) from None
