"""OmegaConf's errors reworded for the user: the key path, the value, what is accepted and where it
came from (the YAML file or the command line).
"""

from __future__ import annotations

import difflib
import typing
from dataclasses import fields, is_dataclass
from enum import Enum
from typing import Any

from omegaconf import DictConfig, ListConfig, Node, OmegaConf, errors as oc_errors

from areal_lightning.app.config_errors import ConfigError


def _accepted_keys(object_type: Any) -> list[str]:
    return [f.name for f in fields(object_type)] if is_dataclass(object_type) else []


def _enum_field(object_type: Any, name: str) -> type[Enum] | None:
    """The Enum type of dataclass field `name`, or None (OmegaConf names Enum members, we show values)."""
    if not is_dataclass(object_type):
        return None
    hint = typing.get_type_hints(object_type).get(name)
    return hint if isinstance(hint, type) and issubclass(hint, Enum) else None


def _enum_values(ref_type: Any) -> type[Enum] | None:
    """The Enum of a ``dict[str, SomeEnum]`` field (optional or not): its values' error names the values too."""
    args = [a for a in typing.get_args(ref_type) if a is not type(None)]
    if len(args) == 1 and typing.get_origin(ref_type) is typing.Union:
        args = list(typing.get_args(args[0]))
    value = args[-1] if len(args) == 2 else None
    return value if isinstance(value, type) and issubclass(value, Enum) else None


NULL_HINTS = {
    "logger.wandb": "to switch W&B off, set logger.wandb.mode: disabled (logger.wandb.mode=disabled)",
    "logger": "to switch the loggers off, set logger.csv: false and logger.wandb.mode: disabled",
}
"""What a section set to null should have been instead (sections cannot be null)."""


SYNONYMS = {
    "rubric": "template",
    "prompt": "template",
    "model": "path",
    "model_path": "path",
    "dir": "path",
    "directory": "path",
    "pattern": "verdict_pattern",
    "verdict": "verdict_pattern",
    "parser": "verdict_pattern",
}
"""Words a user may write for a key of another name: suggested where that key is accepted."""
ELSEWHERE = {
    "graders": "graders",
    "reward_model": "graders.reward_model",
    "reward_models": "graders.reward_model",
    "judge": "graders.judge",
    "judges": "graders.judge",
}
"""Keys written in the wrong section (``task.reward_model``): where they belong."""


def explain(err: oc_errors.OmegaConfBaseException, source: str) -> ConfigError:
    key = err.full_key or "<root>"
    enum = _enum_field(err.object_type, key.rsplit(".", 1)[-1]) or _enum_values(err.ref_type)
    if isinstance(err, oc_errors.ValidationError) and enum is not None:
        accepted = ", ".join(str(m.value) for m in enum)
        return ConfigError(f"{key} must be one of {accepted}; got {err.value!r} (from {source}).")
    detail = str(err.msg).splitlines()[0] if err.msg else type(err).__name__
    if isinstance(err, (oc_errors.ConfigKeyError, oc_errors.ConfigAttributeError)):
        keys = _accepted_keys(err.object_type)
        leaf = key.rsplit(".", 1)[-1]
        close = difflib.get_close_matches(leaf, keys, n=1) or [w for w in [SYNONYMS.get(leaf)] if w in keys]
        hint = f" Did you mean `{close[0]}`?" if close else ""
        if leaf in ELSEWHERE and key != ELSEWHERE[leaf]:
            hint = f" Model graders have a top-level section of their own: `{ELSEWHERE[leaf]}` (docs/model_graders.md)."
        parent = key.rsplit(".", 1)[0] if "." in key else "the top level"
        return ConfigError(
            f"unknown config key `{key}` (from {source}).{hint} Keys accepted at {parent}: {', '.join(keys)}."
        )
    if (
        isinstance(err, oc_errors.ValidationError)
        and as_plain(_value_of(err.value)) is None
        and "not Optional" in detail
    ):
        hint = NULL_HINTS.get(key, "give its keys, or leave it out for the defaults")
        return ConfigError(f"config key `{key}` (from {source}) is a section and cannot be null; {hint}.")
    if isinstance(err, oc_errors.ValidationError):
        return ConfigError(f"config key `{key}` (from {source}) has a value of the wrong type: {detail}.")
    return ConfigError(f"config key `{key}` (from {source}): {detail}.")


def _value_of(value: Any) -> Any:
    """A value OmegaConf may hand over wrapped in a node (``AnyNode(None)``)."""
    return value._value() if isinstance(value, Node) else value


def as_plain(value: Any) -> Any:
    return OmegaConf.to_container(value) if isinstance(value, (DictConfig, ListConfig)) else value


def shape_mismatch(schema: Any, layer: Any, source: str, prefix: str = "") -> str:
    """The message for the first key of `layer` whose value is a list where `schema` has a mapping, or the reverse."""
    for key, value in layer.items_ex(resolve=False) if isinstance(layer, DictConfig) else []:
        path = prefix + str(key)
        # The node, not its value: an optional section left out (``graders.judge``) is a None-valued mapping.
        expected = schema._get_node(key) if isinstance(schema, DictConfig) and key in schema else None
        if isinstance(expected, DictConfig) and not isinstance(value, DictConfig) and as_plain(value) is not None:
            return f"config key `{path}` (from {source}) must be a mapping of keys to values, got {as_plain(value)!r}"
        if isinstance(expected, ListConfig) and isinstance(value, DictConfig):
            return f"config key `{path}` (from {source}) must be a list, got a mapping"
        if isinstance(expected, DictConfig) and not expected._is_none() and isinstance(value, DictConfig):
            found = shape_mismatch(expected, value, source, f"{path}.")
            if found:
                return found
    return "" if prefix else f"the config (from {source}) puts a list where a mapping belongs, or the reverse"
