"""`load_config`: the defaults, then the YAML file, then `key=value` overrides, merged, resolved and
validated; `save_config` and `to_yaml` write a config that loads back.
"""

from __future__ import annotations

import typing
from collections.abc import Iterator
from dataclasses import fields, is_dataclass
from enum import Enum
from pathlib import Path
from typing import Any, cast

import yaml
from omegaconf import DictConfig, OmegaConf, errors as oc_errors

from areal_lightning.app.config_errors import ConfigError, owned_by_key
from areal_lightning.app.config_keys import group_evaluator_keys, grouped, respell, retired_key_problem
from areal_lightning.app.omegaconf_errors import as_plain, explain, shape_mismatch
from areal_lightning.app.schema import Config
from areal_lightning.errors import ArgumentError

CONFIG_FILENAME = "config.yaml"


def settings_paths(schema: Any, prefix: str = "") -> dict[str, str]:
    """Where each settings dataclass of `schema` sits in the YAML file, by class name (the owner a
    runtime check names): ``{"Schedule": "evaluator.schedule", "GRPOConfig": "grpo", ...}``."""
    paths: dict[str, str] = {}
    for f in fields(schema):
        hint = typing.get_type_hints(schema)[f.name]
        options = typing.get_args(hint) if typing.get_origin(hint) is typing.Union else (hint,)  # Optional[...]
        inner = [a for a in options if isinstance(a, type) and is_dataclass(a)]
        if inner:
            paths[inner[0].__name__] = prefix + f.name
            paths.update(settings_paths(inner[0], f"{prefix}{f.name}."))
    return paths


def _read_yaml(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} does not exist; pass the path of a YAML file with -c")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        where = getattr(err, "problem_mark", None)
        line = f" at line {where.line + 1}, column {where.column + 1}" if where else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        if "'\\t'" in problem:
            problem += " (YAML indents with spaces, never tabs)"
        raise ConfigError(f"config file {str(path)!r} is not valid YAML{line}: {problem}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"config file {str(path)!r} must hold a mapping of keys to values, got a {type(data).__name__}"
        )
    return data


def _parse_overrides(overrides: list[str]) -> DictConfig:
    for item in overrides:
        if "=" not in item or item.startswith("="):
            raise ConfigError(f"override {item!r} is not of the form key=value (e.g. trainer.max_steps=50)")
    try:
        return OmegaConf.from_dotlist(list(overrides))
    except oc_errors.OmegaConfBaseException as err:
        raise ConfigError(f"overrides {overrides} could not be parsed: {err.msg}") from None


def _replaces(merged: DictConfig, key: str, layer: DictConfig) -> tuple[str, DictConfig] | None:
    """(key, mapping) when the override of `key` writes a whole mapping (``key={...}``, ``{}``
    included) to an option whose value is a mapping of names (``evaluator.decisions.metric_thresholds``,
    ``evaluator.decisions.best_metrics``, ``eval_sets``): it then replaces the mapping instead of merging
    into it, so that ``evaluator.decisions.metric_thresholds={}`` switches off the thresholds of the YAML file.
    None for any other override (a leaf, a section of fixed keys such as ``trainer={...}``)."""
    try:
        value = OmegaConf.select(layer, key, throw_on_missing=False, throw_on_resolution_failure=False)
        if not isinstance(value, DictConfig):
            return None
        target = OmegaConf.select(merged, key, throw_on_missing=False, throw_on_resolution_failure=False)
    except oc_errors.OmegaConfBaseException:
        return None  # not a key of the schema, or not resolvable: the merge names it
    if isinstance(target, DictConfig) and OmegaConf.get_type(target) is dict:
        return key, value
    return None


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Defaults, then the YAML file, then `key=value` overrides; resolved and validated.

    Args:
        path: a YAML file; None uses the defaults alone.
        overrides: OmegaConf dotlist items such as ``trainer.max_steps=50``.

    Raises:
        ConfigError: for a missing or malformed file, an unknown key, a value of the wrong type
            or an impossible value, naming the key path, the value and what is accepted.

    Example:
        >>> cfg = load_config(None, ["eval_sets.easy.size=10", "trainer.max_steps=5"])
        >>> cfg.trainer.max_steps, cfg.output_dir
        (5, 'runs/arith-grpo/trial0')
    """
    merged = OmegaConf.structured(Config)
    spellings: dict[str, str] = {}  # {grouped key: the flat key the user wrote}
    try:
        for source, key, layer in _layers(path, overrides or [], spellings):
            merged = _merge(merged, layer, source, key)
        return _build(merged)
    except ConfigError as err:
        raise ConfigError(respell(str(err), spellings)) from None


def _layers(
    path: str | Path | None, overrides: list[str], spellings: dict[str, str]
) -> Iterator[tuple[str, str | None, DictConfig]]:
    """(source, the override's key or None, layer) for the YAML file, then each override in order
    (a mapping written whole replaces a mapping option: see `_replaces`), with retired keys refused
    and flat evaluator keys moved into their groups."""
    raw: list[tuple[str, str | None, dict[str, Any]]] = []
    if path is not None:
        raw.append((f"file {str(path)!r}", None, _read_yaml(Path(path))))
    _parse_overrides(overrides)  # every item checked before any is applied
    for item in overrides:
        key = grouped(item.split("=", 1)[0].strip())
        raw.append(("the command line", key, as_plain(_parse_overrides([item]))))
    for source, replaces, data in raw:
        problem = retired_key_problem(data, source)
        if problem:
            raise ConfigError(problem)
        try:
            data, moved = group_evaluator_keys(data, source)
        except ValueError as err:
            raise ConfigError(str(err)) from None
        spellings.update(moved)
        yield source, replaces, OmegaConf.create(_ks_as_lists(data))


def _ks_as_lists(data: dict[str, Any]) -> dict[str, Any]:
    """A single k where an eval set's list of k's belongs (``eval_sets.easy.ks=4``) as the list of one."""
    sets = data.get("eval_sets")
    for eval_set in sets.values() if isinstance(sets, dict) else ():
        ks = eval_set.get("ks") if isinstance(eval_set, dict) else None
        if isinstance(ks, int) and not isinstance(ks, bool):
            eval_set["ks"] = [ks]
    return data


def _merge(merged: DictConfig, layer: DictConfig, source: str, key: str | None) -> DictConfig:
    replaced = None if key is None else _replaces(merged, key, layer)
    try:
        if replaced is not None:
            OmegaConf.update(merged, replaced[0], replaced[1], merge=False)
            return merged
        return cast(DictConfig, OmegaConf.merge(merged, layer))
    except oc_errors.OmegaConfBaseException as err:
        if not (isinstance(err, oc_errors.ValidationError) and not err.full_key):
            raise explain(err, source) from None
        # A value where a section belongs (``graders: 5``): OmegaConf names no key; find it.
        raise ConfigError(shape_mismatch(OmegaConf.structured(Config), layer, source)) from None
    except TypeError:  # OmegaConf names no key when a list meets a mapping: find it
        raise ConfigError(shape_mismatch(OmegaConf.structured(Config), layer, source)) from None


def _build(merged: DictConfig) -> Config:
    try:
        cfg = OmegaConf.to_object(merged)
    except oc_errors.OmegaConfBaseException as err:
        raise explain(err, "the merged config") from None
    except ArgumentError as err:  # a settings group's own check, when OmegaConf built it
        with owned_by_key(settings_paths(Config).get(err.owner, "evaluator")):
            raise
    assert isinstance(cfg, Config)
    return cfg


def _plain(value: Any) -> Any:
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def to_yaml(cfg: Config) -> str:
    """The resolved config as YAML (Enum fields by value), loadable again by `load_config`."""
    return yaml.safe_dump(to_dict(cfg), sort_keys=False)


def save_config(cfg: Config, output_dir: str | Path) -> Path:
    """Writes `<output_dir>/config.yaml` and returns its path."""
    out = Path(output_dir) / CONFIG_FILENAME
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(to_yaml(cfg))
    return out


def to_dict(cfg: Config) -> dict[str, Any]:
    """Plain nested dict of the resolved config (for loggers such as W&B)."""
    container = OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True, enum_to_str=False)
    assert isinstance(container, dict)
    return _plain(container)
