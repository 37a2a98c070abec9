"""Keys the config no longer takes: removed options and renamed ones, refused with what to write.

One table of each, applied to every YAML file and override before the merge, so that an old config
gets the reason and the new name instead of an unknown-key message.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

REMOVED = {
    "grpo.clip_eps": (
        "one update per batch of rollouts makes the probability ratio exactly 1, so the clip never acted "
        "(docs/decisions.md)"
    ),
}
"""Removed options: the key path and why it went."""
RENAMED = {
    "evaluator.adaptive.dataset": "evaluator.adaptive.eval_set",
    "evaluator.reward_watch.eval_metric": "evaluator.reward_watch.metric",
    "evaluator.max_snapshot_mb": "evaluator.max_snapshot_mib",
    "evaluator.prompt_story.max_file_mb": "evaluator.prompt_story.max_file_mib",
    "policy.stop_strings": "policy.stop",
}
"""Renamed options: the old key path and the new one (the same value, one name for one concept)."""


def key_paths(data: Mapping[str, Any], prefix: str = "") -> Iterator[str]:
    """Every dotted key path of nested mappings, sections included.

    Example:
        >>> list(key_paths({"grpo": {"lr": 1, "clip_eps": 0.2}}))
        ['grpo', 'grpo.lr', 'grpo.clip_eps']
    """
    for key, value in data.items():
        path = f"{prefix}{key}"
        yield path
        if isinstance(value, Mapping):
            yield from key_paths(value, f"{path}.")


def retired_key_problem(data: Mapping[str, Any], source: str) -> str | None:
    """The message for the first removed or renamed key in `data` (a YAML file or an override, from
    `source`), or None."""
    for path in key_paths(data):
        if path in RENAMED:
            return f"config key `{path}` (from {source}) was renamed to `{RENAMED[path]}` (same meaning, same values)"
        if path in REMOVED:
            fix = "drop the override" if source == "the command line" else "delete the line"
            return f"config key `{path}` (from {source}) was removed: {REMOVED[path]}; {fix}"
    return None
