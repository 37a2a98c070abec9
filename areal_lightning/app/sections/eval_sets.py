"""The ``eval_sets`` section: each named evaluation set, its sampling and its subset."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from areal_lightning.app.config_errors import ConfigError, at_least, owned_by_key, positive_number
from areal_lightning.app.file_checks import check_code_source, check_math_file
from areal_lightning.app.sections.task import TaskName
from areal_lightning.eval_round.eval_set import EvalSet
from areal_lightning.eval_round.sampling_params import SamplingParams
from areal_lightning.eval_round.subsample import Subsample
from areal_lightning.rl.harness.tasks import HarnessSpec
from areal_lightning.tasks.arithmetic import distinct_problems
from areal_lightning.tasks.math_answers import AnswerFormat

ARITHMETIC_EVAL_SIZE = 200
"""Prompts of an arithmetic eval set whose `size` is null, when it has that many distinct problems ..."""
DEFAULT_SHARE = 5
"""... else a fifth of them: the rest stay for training (the eval sets' prompts are held out of it)."""
DEFAULT_DIGITS = 1
"""Operand digits of an arithmetic eval set whose `digits` is null."""


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
class HarnessConfig:
    """An lm-evaluation-harness task as the eval set (docs/harness.md): its documents, prompts,
    generation arguments, filters and metrics; the sampling keys of the eval set do not apply."""

    task: Optional[str] = None
    """A task of the installed lm-eval's registry (gsm8k); with task_file, one task of the file (null: its only one)."""
    task_file: Optional[str] = None
    """A task YAML file of yours (local data: dataset_path: json, dataset_kwargs.data_files); null: the registry."""
    num_fewshot: Optional[int] = None
    """Few-shot examples per prompt; null: the task's own (as lm-eval's --num_fewshot)."""
    limit: Optional[int] = None
    """The first `limit` documents only; null: every document (as lm-eval's --limit)."""
    bootstrap_iters: int = 100_000
    """Bootstrap draws of a median's or perplexity's standard error (as lm-eval's --bootstrap_iters)."""

    def spec(self) -> HarnessSpec:
        return HarnessSpec(self.task, self.task_file, self.num_fewshot, self.limit, self.bootstrap_iters)

    def scores_choices(self) -> bool:
        """Whether the task scores choices' log-probabilities (multiple choice) instead of generating."""
        from areal_lightning.rl.harness.tasks import LOGLIKELIHOOD_TYPES, output_type

        return output_type(self.spec()) in LOGLIKELIHOOD_TYPES

    def check(self, path: str) -> None:
        if self.task is None and self.task_file is None:
            raise ConfigError(f"{path} needs task (a task of lm-eval's registry) or task_file (a task YAML file)")
        at_least(f"{path}.num_fewshot", self.num_fewshot, 0, allow_none=True)
        at_least(f"{path}.limit", self.limit, 1, allow_none=True)
        at_least(f"{path}.bootstrap_iters", self.bootstrap_iters, 0)
        from areal_lightning.rl.harness import HarnessTaskError, load_task
        from areal_lightning.rl.harness.evaluation import unsupported_type

        try:
            task, _ = load_task(self.spec())
        except HarnessTaskError as err:
            raise ConfigError(f"{path}: {err}") from None
        refused = unsupported_type(self.spec(), task.OUTPUT_TYPE)
        if refused is not None:
            raise ConfigError(f"{path}: {refused}")


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
    """Number of prompts, each distinct: arithmetic sets draw without replacement, at most every distinct
    problem (one digit: 100), null: 200 or a fifth of the distinct problems when that is fewer (one digit:
    20); file sets: null: every row, else the first `size` rows (a prompt repeated in the file counts once)."""
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
    harness: Optional[HarnessConfig] = None
    """An lm-evaluation-harness task as this eval set, e.g. {task: gsm8k} or {task_file: my_task.yaml}; null: ours."""

    def arithmetic_size(self) -> int:
        """An arithmetic set's number of prompts: its `size`, or the default of its `digits`."""
        if self.size is not None:
            return self.size
        return min(ARITHMETIC_EVAL_SIZE, distinct_problems(self.arithmetic_digits) // DEFAULT_SHARE)

    @property
    def arithmetic_digits(self) -> int:
        return self.digits or DEFAULT_DIGITS

    @property
    def is_file_set(self) -> bool:
        """Whether the set's problems come from a file (`path`) rather than the arithmetic task."""
        return self.path is not None

    def check(self, path: str, task: TaskName = TaskName.MATH) -> None:
        for name in ("digits", "size"):
            if getattr(self, name) is not None:
                at_least(f"{path}.{name}", getattr(self, name), 1)
        at_least(f"{path}.n_samples", self.n_samples, 1)
        if self.harness is not None and (self.path is not None or self.digits is not None):
            raise ConfigError(
                f"{path} has harness and {'path' if self.path is not None else 'digits'}; give one of them"
            )
        if self.harness is not None:
            self.harness.check(f"{path}.harness")
        if self.path is not None and self.digits is not None:
            raise ConfigError(f"{path} has both digits (an arithmetic set) and path (a file set); give one of them")
        if self.path is None and task is TaskName.ARITHMETIC and self.size is not None:
            digits, distinct = self.arithmetic_digits, distinct_problems(self.arithmetic_digits)
            if self.size > distinct:
                raise ConfigError(
                    f"{path}.size is {self.size}, but there are only {distinct} distinct {digits}-digit additions"
                    f", and an eval set counts each prompt once; give a size from 1 to {distinct}"
                )
        if self.path is not None and task is TaskName.CODE:
            check_code_source(f"{path}.path", self.path)
        elif self.path is not None:
            check_math_file(
                path, self.path, self.question_field, self.answer_field, self.answer_format, self.stratum_field
            )
        with owned_by_key(path):
            EvalSet(path.rsplit(".", 1)[-1], [None], batch_size=self.batch_size, max_batch_cost=self.max_batch_cost)
        positive_number(f"{path}.temperature", self.temperature, allow_zero=True)
        at_least(f"{path}.max_new_tokens", self.max_new_tokens, 1, allow_none=True)
        with owned_by_key(path):
            self.sampling(None)
        if self.subsample is not None:
            with owned_by_key(f"{path}.subsample"):
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
