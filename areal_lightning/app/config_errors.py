"""`ConfigError` and the checks every config section shares: ranges, and the runtime classes' own
checks reworded with the config's key path.
"""

from __future__ import annotations

import contextlib
import math
import re
from collections.abc import Iterator

from areal_lightning.errors import ArgumentError


class ConfigError(ValueError):
    """A configuration problem, worded for the user who wrote the YAML file or the override."""


# Integer and float fields are typed: OmegaConf itself refuses `abc` or `true` for them. What it
# cannot know is the range; fields that no runtime class owns are checked here.
def at_least(path: str, value: int | float | None, low: int, *, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if value is None or not math.isfinite(value) or value < low:
        accepted = {0: "a non-negative", 1: "a positive"}[low] + (" integer" if isinstance(value, int) else " number")
        raise ConfigError(f"{path} must be {accepted}{' or null' if allow_none else ''}, got {value!r}")


def positive_number(path: str, value: float, *, allow_zero: bool = False) -> None:
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        accepted = "a non-negative number" if allow_zero else "a positive number"
        raise ConfigError(f"{path} must be {accepted}, got {value!r}")


@contextlib.contextmanager
def owned_by_key(path: str) -> Iterator[None]:
    """The runtime class's own check, reworded with the config key path instead of the call."""
    try:
        yield
    except ArgumentError as err:
        accepted = re.sub(r"\b(None|True|False)\b", lambda m: YAML_WORDS[m.group(0)], err.accepted)
        if not err.arg:  # a problem of several arguments together: `accepted` words it
            raise ConfigError(f"{path} {accepted}") from None
        raise ConfigError(f"{path}.{err.arg} must be {accepted}, got {err.value!r}") from None


YAML_WORDS = {"None": "null", "True": "true", "False": "false"}
"""Python's words in a runtime class's error, as a YAML file spells them."""
