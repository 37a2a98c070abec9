"""`ArgumentError`: a constructor argument outside what it accepts, with the parts a config needs.

The plugin's constructors check their arguments once and raise this; the app's config reuses the
same checks and rewords the error with the config key (``evaluator.freq_steps``) instead of the call.
"""

from __future__ import annotations

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
        super().__init__(message or f"`{owner}({arg}=...)` must be {accepted}, got {value!r}")
