"""From the keys a user writes to the schema's: the flat ``evaluator`` keys, renamed and removed keys.

The ``evaluator`` block holds four groups, as `EvaluationCallback` takes them:
``evaluator: {schedule: {...}, execution: {...}, rounds: {...}, decisions: {...}}``. Each field of a
group may also be written flat, as AReaL's design writes them (``evaluator.freq_steps``,
``evaluator.metric_thresholds``): `FLAT_KEYS`, derived from the groups' fields, says where each goes,
and `group_evaluator_keys` moves them into their group before the merge. Errors then name the key
as the user wrote it (`respell`). A renamed or removed key is refused with its new name or the reason.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterator, Mapping
from dataclasses import fields
from typing import Any

from areal_lightning.callbacks.settings import Decisions, Execution, RoundSettings, Schedule

EVALUATOR = "evaluator"
GROUPS = {"schedule": Schedule, "execution": Execution, "rounds": RoundSettings, "decisions": Decisions}
"""The groups of the ``evaluator`` block: `EvaluationCallback`'s keyword arguments and their dataclasses."""

REMOVED = {
    "grpo.clip_eps": (
        "one update per batch of rollouts makes the probability ratio exactly 1, so the clip never acted "
        "(docs/decisions.md)"
    ),
}
"""Removed options: the key path and why it went."""
RENAMED = {
    "evaluator.schedule.adaptive.dataset": "evaluator.schedule.adaptive.eval_set",
    "evaluator.decisions.reward_watch.eval_metric": "evaluator.decisions.reward_watch.metric",
    "evaluator.execution.max_snapshot_mb": "evaluator.execution.max_snapshot_mib",
    "evaluator.decisions.prompt_story.max_file_mb": "evaluator.decisions.prompt_story.max_file_mib",
    "policy.stop_strings": "policy.stop",
}
"""Renamed options: the old key path and the new one, in the grouped spelling."""


def _flat_keys() -> dict[str, str]:
    table = {f.name: group for group, cls in GROUPS.items() for f in fields(cls)}
    for old in RENAMED:  # an old name written flat gets its new name too, not an unknown-key message
        parts = old.split(".")
        if parts[0] == EVALUATOR and len(parts) == 3:
            table.setdefault(parts[2], parts[1])
    return table


FLAT_KEYS = _flat_keys()
"""Each key of a group that may be written flat under ``evaluator``, and its group."""


def grouped(path: str) -> str:
    """The schema's spelling of a dotted key path: a flat evaluator key gets its group.

    Example:
        >>> grouped("evaluator.freq_steps"), grouped("evaluator.adaptive.min_steps"), grouped("grpo.lr")
        ('evaluator.schedule.freq_steps', 'evaluator.schedule.adaptive.min_steps', 'grpo.lr')
    """
    parts = path.split(".")
    if len(parts) > 1 and parts[0] == EVALUATOR and parts[1] not in GROUPS and parts[1] in FLAT_KEYS:
        parts.insert(1, FLAT_KEYS[parts[1]])
    return ".".join(parts)


def flat(path: str) -> str:
    """The flat spelling of a grouped evaluator key path (any other path unchanged)."""
    parts = path.split(".")
    if len(parts) > 2 and parts[0] == EVALUATOR and parts[1] in GROUPS:
        del parts[1]
    return ".".join(parts)


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
    `source`), or None. The new name is spelled as the old one was (flat or grouped)."""
    for path in key_paths(data):
        canonical = grouped(path)
        if canonical in RENAMED:
            new = RENAMED[canonical] if canonical == path else flat(RENAMED[canonical])
            return f"config key `{path}` (from {source}) was renamed to `{new}` (same meaning, same values)"
        if canonical in REMOVED:
            fix = "drop the override" if source == "the command line" else "delete the line"
            return f"config key `{path}` (from {source}) was removed: {REMOVED[canonical]}; {fix}"
    return None


def group_evaluator_keys(data: dict[str, Any], source: str) -> tuple[dict[str, Any], dict[str, str]]:
    """`data` (a YAML file's mapping or an override's) with its flat ``evaluator`` keys moved into
    their groups, and ``{grouped path: flat path}`` for each key moved (to `respell` errors).

    Raises:
        ValueError: for an evaluator key that no group has (naming the closest one), or one option
            given both flat and grouped.

    Example:
        >>> data, moved = group_evaluator_keys({"evaluator": {"freq_steps": 5, "rounds": {"cache": True}}}, "x")
        >>> data
        {'evaluator': {'rounds': {'cache': True}, 'schedule': {'freq_steps': 5}}}
        >>> moved["evaluator.schedule.freq_steps"]
        'evaluator.freq_steps'
    """
    block = data.get(EVALUATOR)
    if not isinstance(block, Mapping) or set(block) <= set(GROUPS):
        return data, {}
    out = {k: dict(v) if isinstance(v, Mapping) else v for k, v in block.items() if k in GROUPS}
    spellings = {}
    for key, value in block.items():
        if key in GROUPS:
            continue
        group = FLAT_KEYS.get(key)
        if group is None:
            raise ValueError(_unknown_key(key, source))
        target = out.setdefault(group, {})
        if not isinstance(target, dict):
            raise ValueError(f"config key `evaluator.{group}` (from {source}) must be a mapping, got {target!r}")
        if key in target:
            raise ValueError(
                f"config key `evaluator.{key}` (from {source}) is also given as `evaluator.{group}.{key}`; give it once"
            )
        target[key] = value
        spellings[f"{EVALUATOR}.{group}.{key}"] = f"{EVALUATOR}.{key}"
        spellings[f"{EVALUATOR}.{group}"] = EVALUATOR  # a problem of the group as a whole
    return {**data, EVALUATOR: out}, spellings


def _unknown_key(key: str, source: str) -> str:
    accepted = [k for k in FLAT_KEYS if f"{EVALUATOR}.{FLAT_KEYS[k]}.{k}" not in RENAMED]
    close = difflib.get_close_matches(key, [*GROUPS, *accepted], n=1)
    hint = f" Did you mean `{close[0]}`?" if close else ""
    return (
        f"unknown config key `evaluator.{key}` (from {source}).{hint} Keys accepted at evaluator: "
        f"{', '.join(GROUPS)}, or a key of one of them written flat: {', '.join(accepted)}."
    )


def respell(message: str, spellings: Mapping[str, str]) -> str:
    """`message` with each grouped key path the user wrote flat spelled as written: a key and the
    keys below it (``evaluator.schedule.adaptive.min_steps``), a group only where it is named alone.

    Example:
        >>> respell("evaluator.schedule.adaptive.min_steps: ...", {"evaluator.schedule.adaptive": "evaluator.adaptive"})
        'evaluator.adaptive.min_steps: ...'
    """
    for canonical in sorted(spellings, key=len, reverse=True):
        end = r"(?![\w.])" if canonical.count(".") == 1 else r"(?!\w)"
        message = re.sub(rf"(?<![\w.]){re.escape(canonical)}{end}", spellings[canonical], message)
    return message
