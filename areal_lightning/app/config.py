"""Structured configuration: one dataclass per concern, merged from YAML and `key=value` overrides.

`load_config(path, overrides)` merges the YAML file over the dataclass defaults, then the dotlist
overrides, resolves interpolation (``output_dir: runs/${experiment_name}/${trial_name}``) and
validates. Every problem is a `ConfigError` naming the key path, the value and what is accepted,
raised before any training starts.
"""

from __future__ import annotations

import contextlib
import difflib
import math
import typing
from collections.abc import Iterator
from dataclasses import dataclass, field, fields, is_dataclass
from enum import Enum
from pathlib import Path
from typing import Any, Optional

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf import errors as oc_errors

from areal_lightning.callbacks.async_evaluator import DEFAULT_ASYNC_THREADS, DEFAULT_MAX_SNAPSHOT_MB, check_async_options
from areal_lightning.callbacks.options import DEFAULT_TABLE_ROWS, ErrorPolicy, EvalMode, OnBusy, ThresholdAction
from areal_lightning.callbacks.thresholds import ThresholdMonitor
from areal_lightning.callbacks.trigger import HybridTrigger
from areal_lightning.errors import ArgumentError
from areal_lightning.metrics.functional import AdvantageStd
from areal_lightning.eval_round.eval_set import EvalSet

CONFIG_FILENAME = "config.yaml"


class PolicyKind(str, Enum):
    """``tiny``: a small transformer built from the config."""

    TINY = "tiny"


class TaskName(str, Enum):
    """``arithmetic``: the embedded default task."""

    ARITHMETIC = "arithmetic"


class WandbMode(str, Enum):
    """``online``, ``offline`` (writes under save_dir, sync later) or ``disabled``."""

    ONLINE = "online"
    OFFLINE = "offline"
    DISABLED = "disabled"


class ConfigError(ValueError):
    """A configuration problem, worded for the user who wrote the YAML file or the override."""


# Integer and float fields are typed: OmegaConf itself refuses `abc` or `true` for them. What it
# cannot know is the range; fields that no runtime class owns are checked here.
def _at_least(path: str, value: int | float | None, low: int, *, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if value is None or not math.isfinite(value) or value < low:
        accepted = {0: "a non-negative", 1: "a positive"}[low] + (" integer" if isinstance(value, int) else " number")
        raise ConfigError(f"{path} must be {accepted}{' or null' if allow_none else ''}, got {value!r}")


def _positive_number(path: str, value: float, *, allow_zero: bool = False) -> None:
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        accepted = "a non-negative number" if allow_zero else "a positive number"
        raise ConfigError(f"{path} must be {accepted}, got {value!r}")


@contextlib.contextmanager
def _owned_by(path: str) -> Iterator[None]:
    """The runtime class's own check, reworded with the config key path instead of the call."""
    try:
        yield
    except ArgumentError as err:
        key = f"{path}.{err.arg}" if err.arg else path
        if not err.arg:  # a problem of several arguments together: `accepted` words it
            raise ConfigError(f"{key} {err.accepted}") from None
        accepted = err.accepted.replace("None", "null").replace("True or False", "true or false")
        raise ConfigError(f"{key} must be {accepted}, got {err.value!r}") from None


@dataclass
class TrainerConfig:
    """Arguments of Lightning's `Trainer` that a run needs."""

    max_steps: int = 200
    """Optimizer steps to train for."""
    max_epochs: Optional[int] = None
    """Epochs to train for at most; null means limited by max_steps only."""
    accelerator: str = "cpu"
    """Lightning accelerator: cpu, gpu, auto."""
    devices: int = 1
    """Devices (processes) to train on."""
    strategy: str = "auto"
    """Lightning strategy: auto, ddp, fsdp ..."""
    precision: str = "32-true"
    """Lightning precision, e.g. 32-true or bf16-mixed."""
    log_every_n_steps: int = 10
    """How often train metrics go to the loggers."""
    enable_progress_bar: bool = True
    """Show Lightning's progress bar."""
    checkpoint_every_n_steps: Optional[int] = None
    """Save a checkpoint under <output_dir>/checkpoints every N steps (and the last one); null: only at the end."""

    def check(self, path: str) -> None:
        _at_least(f"{path}.max_steps", self.max_steps, 1)
        _at_least(f"{path}.max_epochs", self.max_epochs, 1, allow_none=True)
        _at_least(f"{path}.devices", self.devices, 1)
        _at_least(f"{path}.log_every_n_steps", self.log_every_n_steps, 1)
        _at_least(f"{path}.checkpoint_every_n_steps", self.checkpoint_every_n_steps, 1, allow_none=True)


@dataclass
class PolicyConfig:
    """The language model being trained."""

    kind: PolicyKind = PolicyKind.TINY
    """tiny: a small transformer built from this config."""
    path: Optional[str] = None
    """Local directory of a model, for kinds that load one. Never downloaded."""
    d_model: int = 64
    """Width of the tiny transformer."""
    n_layers: int = 2
    """Blocks of the tiny transformer."""
    n_heads: int = 4
    """Attention heads per block of the tiny transformer."""
    max_len: int = 32
    """Longest prompt plus completion, in tokens."""

    def check(self, path: str) -> None:
        for name in ("d_model", "n_layers", "n_heads", "max_len"):
            _at_least(f"{path}.{name}", getattr(self, name), 1)
        if self.d_model % self.n_heads:
            raise ConfigError(f"{path}.n_heads must divide {path}.d_model, got d_model={self.d_model}, n_heads={self.n_heads}")


@dataclass
class TaskConfig:
    """The task the policy is trained on."""

    name: TaskName = TaskName.ARITHMETIC
    """Only `arithmetic`, the embedded default, for now."""
    train_digits: int = 1
    """Digits of the operands of training prompts."""
    train_size: int = 256
    """Training prompts: a finite set iterated in epochs."""

    def check(self, path: str) -> None:
        _at_least(f"{path}.train_digits", self.train_digits, 1)
        _at_least(f"{path}.train_size", self.train_size, 1)


@dataclass
class GRPOConfig:
    """Group-relative policy optimisation."""

    group_size: int = 16
    """Completions sampled per prompt; at least 2, or every advantage is zero."""
    prompts_per_step: int = 32
    """Prompts per optimizer step on each device."""
    lr: float = 3.0e-4
    """Adam learning rate."""
    clip_eps: float = 0.2
    """Clip range of the probability ratio to the sampling policy."""
    kl_coef: float = 0.0
    """Weight of the KL penalty to the frozen initial policy; 0 turns it off."""
    temperature: float = 1.0
    """Sampling temperature of training rollouts."""
    max_new_tokens: int = 4
    """Tokens generated per completion."""
    scale_advantages: bool = True
    """Divide advantages by the group's std (plus a small epsilon)."""
    advantage_std: AdvantageStd = AdvantageStd.SAMPLE
    """sample: the group's sample std (n - 1), as TRL and verl divide by; population: the n-divided one."""
    warmup_steps: int = 150
    """Supervised steps that teach the answer format only (random digits, then end of sequence)."""
    warmup_lr: float = 1.0e-3
    """Learning rate of the format warm-up."""

    def check(self, path: str) -> None:
        if self.group_size < 2:
            raise ConfigError(f"{path}.group_size must be at least 2 (advantages are relative to the group), got {self.group_size}")
        _at_least(f"{path}.prompts_per_step", self.prompts_per_step, 1)
        _positive_number(f"{path}.lr", self.lr)
        _positive_number(f"{path}.clip_eps", self.clip_eps)
        _positive_number(f"{path}.kl_coef", self.kl_coef, allow_zero=True)
        _positive_number(f"{path}.temperature", self.temperature)
        _at_least(f"{path}.max_new_tokens", self.max_new_tokens, 1)
        _at_least(f"{path}.warmup_steps", self.warmup_steps, 0)
        _positive_number(f"{path}.warmup_lr", self.warmup_lr)


@dataclass
class EvalSetConfig:
    """One named evaluation set of the task."""

    digits: int = 1
    """Digits of the operands."""
    size: int = 200
    """Number of prompts."""
    n_samples: int = 4
    """Completions sampled per prompt (pass@k and maj@k use k = 1 and k = n_samples)."""
    temperature: float = 0.6
    """Sampling temperature; 0 means greedy."""
    batch_size: int = 64
    """Prompts per evaluation batch."""
    max_new_tokens: Optional[int] = None
    """Tokens generated per completion; null: grpo.max_new_tokens."""
    max_batch_cost: Optional[float] = None
    """Close an eval batch before its padded cost (prompts x longest prompt length) exceeds this,
    so that no single batch outweighs a rank's share; null: batches by count only."""

    def check(self, path: str) -> None:
        for name in ("digits", "size", "n_samples"):
            _at_least(f"{path}.{name}", getattr(self, name), 1)
        with _owned_by(path):
            EvalSet(path.rsplit(".", 1)[-1], [None], batch_size=self.batch_size, max_batch_cost=self.max_batch_cost)
        _positive_number(f"{path}.temperature", self.temperature, allow_zero=True)
        _at_least(f"{path}.max_new_tokens", self.max_new_tokens, 1, allow_none=True)


@dataclass
class EvaluatorConfig:
    """When and how to evaluate (the seed's `evaluator` block)."""

    freq_epochs: Optional[int] = None
    """Evaluate at the end of every N-th epoch; null: off."""
    freq_steps: Optional[int] = None
    """Evaluate after every N-th optimizer step (global step multiples); null: off."""
    freq_secs: Optional[float] = None
    """Evaluate after N seconds of training since the last evaluation; null: off."""
    eval_before_train: bool = False
    """Evaluate the initial weights (step 0) before the first optimizer step."""
    eval_at_end: bool = True
    """Evaluate the final weights, unless the last step was just evaluated."""
    mode: EvalMode = EvalMode.SYNC
    """sync: training waits for the evaluation; async: a worker process evaluates a snapshot of the weights
    while training goes on (results are recorded at the snapshot's step)."""
    on_busy: OnBusy = OnBusy.SKIP
    """async: a round that falls due while the previous one runs is skipped (a `skipped` event) or waits for it."""
    async_device: Optional[str] = None
    """async: where the worker evaluates (cpu, cuda:1); null: the training device."""
    async_threads: int = DEFAULT_ASYNC_THREADS
    """async: torch threads of the worker process."""
    max_snapshot_mb: Optional[float] = DEFAULT_MAX_SNAPSHOT_MB
    """async: the most MiB the weight snapshot may take (the run stops before training if it would not fit); null: no bound."""
    metric_thresholds: dict[str, float] = field(default_factory=dict)
    """Alert when a metric that reached its threshold falls below it, e.g. {accuracy: 0.7}."""
    threshold_action: ThresholdAction = ThresholdAction.ALERT
    """alert: log, record and alert; stop: also stop training cleanly."""
    on_error: ErrorPolicy = ErrorPolicy.LOG
    """log: an exception in an evaluation is recorded and training goes on; raise: fail fast."""
    max_table_rows: int = DEFAULT_TABLE_ROWS
    """Sample generations per eval set kept for the W&B table."""

    def check(self, path: str) -> None:
        # The callback's own checks, at load time and with the config's key names.
        with _owned_by(path):
            HybridTrigger(freq_epochs=self.freq_epochs, freq_steps=self.freq_steps, freq_secs=self.freq_secs,
                          eval_before_train=self.eval_before_train, eval_at_end=self.eval_at_end)
            ThresholdMonitor(self.metric_thresholds)
            check_async_options(self.async_device, self.async_threads, self.max_snapshot_mb)
        _at_least(f"{path}.max_table_rows", self.max_table_rows, 0)


@dataclass
class WandbConfig:
    """Weights & Biases, through Lightning's `WandbLogger`."""

    mode: WandbMode = WandbMode.DISABLED
    """online, offline (writes under save_dir, sync later) or disabled."""
    project: str = "areal-lightning"
    """W&B project."""
    entity: Optional[str] = None
    """W&B entity (user or team); null: your default."""
    name: Optional[str] = None
    """Run name; null: <experiment_name>/<trial_name>."""
    group: Optional[str] = None
    """Run group, e.g. the experiment name."""
    tags: list[str] = field(default_factory=list)
    """Run tags."""
    save_dir: Optional[str] = None
    """Where W&B writes; null: <output_dir>."""


@dataclass
class LoggerConfig:
    """Where metrics go besides the eval history file."""

    wandb: WandbConfig = field(default_factory=WandbConfig)
    """Weights & Biases."""
    csv: bool = True
    """Also write Lightning's CSV logs under <output_dir>/csv."""


@dataclass
class Config:
    """A whole run: experiment identity, then one section per concern."""

    experiment_name: str = "arith-grpo"
    """Name of the experiment; part of output_dir."""
    trial_name: str = "trial0"
    """Name of this trial of the experiment; part of output_dir."""
    seed: int = 1
    """Seeds the model, the data and every evaluation sample."""
    output_dir: str = "runs/${experiment_name}/${trial_name}"
    """Where the run writes config.yaml, eval_history.jsonl, checkpoints and logs."""
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    grpo: GRPOConfig = field(default_factory=GRPOConfig)
    eval_sets: dict[str, EvalSetConfig] = field(default_factory=dict)
    evaluator: EvaluatorConfig = field(default_factory=EvaluatorConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)

    def __post_init__(self) -> None:
        _at_least("seed", self.seed, 0)
        for section in ("trainer", "policy", "task", "grpo", "evaluator"):
            getattr(self, section).check(section)
        if not self.eval_sets:
            raise ConfigError("eval_sets is empty; define at least one, e.g. eval_sets: {easy: {digits: 1, size: 200}}")
        for name, eval_set in self.eval_sets.items():
            eval_set.check(f"eval_sets.{name}")


def _accepted_keys(object_type: Any) -> list[str]:
    return [f.name for f in fields(object_type)] if is_dataclass(object_type) else []


def _enum_field(object_type: Any, name: str) -> type[Enum] | None:
    """The Enum type of dataclass field `name`, or None (OmegaConf names Enum members, we show values)."""
    if not is_dataclass(object_type):
        return None
    hint = typing.get_type_hints(object_type).get(name)
    return hint if isinstance(hint, type) and issubclass(hint, Enum) else None


def _explain(err: oc_errors.OmegaConfBaseException, source: str) -> ConfigError:
    key = err.full_key or "<root>"
    enum = _enum_field(err.object_type, key.rsplit(".", 1)[-1])
    if isinstance(err, oc_errors.ValidationError) and enum is not None:
        accepted = ", ".join(m.value for m in enum)
        return ConfigError(f"{key} must be one of {accepted}; got {err.value!r} (from {source}).")
    detail = str(err.msg).splitlines()[0] if err.msg else type(err).__name__
    if isinstance(err, (oc_errors.ConfigKeyError, oc_errors.ConfigAttributeError)):
        accepted = _accepted_keys(err.object_type)
        leaf = key.rsplit(".", 1)[-1]
        close = difflib.get_close_matches(leaf, accepted, n=1)
        hint = f" Did you mean `{close[0]}`?" if close else ""
        parent = key.rsplit(".", 1)[0] if "." in key else "the top level"
        return ConfigError(
            f"unknown config key `{key}` (from {source}).{hint} Keys accepted at {parent}: {', '.join(accepted)}."
        )
    if isinstance(err, oc_errors.ValidationError):
        return ConfigError(f"config key `{key}` (from {source}) has a value of the wrong type: {detail}.")
    return ConfigError(f"config key `{key}` (from {source}): {detail}.")


def _read_yaml(path: Path) -> DictConfig:
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} does not exist; pass the path of a YAML file with -c")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        where = getattr(err, "problem_mark", None)
        line = f" at line {where.line + 1}, column {where.column + 1}" if where else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ConfigError(f"config file {str(path)!r} is not valid YAML{line}: {problem}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {str(path)!r} must hold a mapping of keys to values, got a {type(data).__name__}")
    return OmegaConf.create(data)


def _parse_overrides(overrides: list[str]) -> DictConfig:
    for item in overrides:
        if "=" not in item or item.startswith("="):
            raise ConfigError(f"override {item!r} is not of the form key=value (e.g. trainer.max_steps=50)")
    try:
        return OmegaConf.from_dotlist(list(overrides))
    except oc_errors.OmegaConfBaseException as err:
        raise ConfigError(f"overrides {overrides} could not be parsed: {err.msg}") from None


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
    layers: list[tuple[str, DictConfig]] = []
    if path is not None:
        layers.append((f"file {str(path)!r}", _read_yaml(Path(path))))
    if overrides:
        layers.append(("the command line", _parse_overrides(overrides)))
    for source, layer in layers:
        try:
            merged = OmegaConf.merge(merged, layer)
        except oc_errors.OmegaConfBaseException as err:
            raise _explain(err, source) from None
    try:
        cfg = OmegaConf.to_object(merged)
    except oc_errors.OmegaConfBaseException as err:
        raise _explain(err, "the merged config") from None
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


__all__ = ["Config", "ConfigError", "load_config", "save_config", "to_yaml", "to_dict"]
