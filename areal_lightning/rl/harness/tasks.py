"""An lm-evaluation-harness task as an eval set's samples: loading it offline, checking it, its documents.

`HarnessSpec` names the task (a name of the installed package's registry, or a task YAML file of
the user's) and its few-shot count and document limit. `load_task` builds the task as
`lm_eval.simple_evaluate` does (the few-shot count set the same way, the few-shot sampler seeded
with the harness's default seed), with the Hugging Face hub and datasets switched offline, so that
its dataset comes from the local cache or local files only; a task is built once per process.
`harness_docs` are the task's documents with the requests the harness itself builds for them
(its prompts, few-shot examples included, and generation arguments): the eval set's samples.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HARNESS_OPTION = "harness"
"""`EvalSet.options` key holding the eval set's `HarnessSpec` (as plain values)."""
HARNESS_FEWSHOT_SEED = 1234
"""`simple_evaluate`'s default `fewshot_random_seed`: the same few-shot examples as the harness's own runs."""
DEFAULT_BOOTSTRAP_ITERS = 100_000
"""`simple_evaluate`'s default `bootstrap_iters` (the standard error of a median or a perplexity)."""
GENERATE_UNTIL = "generate_until"
MULTIPLE_CHOICE = "multiple_choice"
LOGLIKELIHOOD_TYPES = ("loglikelihood", "multiple_choice")
NUMERIC_AGGREGATIONS = ("mean", "median", "perplexity", "nanmean")
"""Aggregations of one number per document: reduced exactly from the documents' values gathered over ranks."""
_OFFLINE_ENV = ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE")


class HarnessTaskError(ValueError):
    """A harness task that cannot be evaluated here: lm-eval missing, an unknown task, an uncached dataset."""


@dataclass(frozen=True)
class HarnessSpec:
    """Which lm-evaluation-harness task an eval set evaluates.

    Args:
        task: a task name of the installed lm-eval's registry (``gsm8k``); with `task_file`, the
            file's task (None: the file's only task).
        task_file: a task YAML file of the user's (``dataset_path: json`` and local ``data_files``
            run offline); None: the registry.
        num_fewshot: few-shot examples per prompt; None: the task's own (0 when it has none), as
            `simple_evaluate`'s ``num_fewshot``.
        limit: the first `limit` documents only; None: every document.
        bootstrap_iters: draws of the bootstrap standard error (median, perplexity), as
            `simple_evaluate`'s.
    """

    task: str | None = None
    task_file: str | None = None
    num_fewshot: int | None = None
    limit: int | None = None
    bootstrap_iters: int = DEFAULT_BOOTSTRAP_ITERS

    def as_options(self) -> dict[str, Any]:
        """The spec as plain values (an eval set's options: in its fingerprint and the result cache's key)."""
        return {
            "task": self.task,
            "task_file": self.task_file,
            "num_fewshot": self.num_fewshot,
            "limit": self.limit,
            "bootstrap_iters": self.bootstrap_iters,
        }

    @property
    def described(self) -> str:
        return f"task file {self.task_file!r}" if self.task_file is not None else f"task {self.task!r}"


@dataclass(frozen=True)
class HarnessDoc:
    """One document of a harness task: an eval sample.

    Attributes:
        doc_id: the document's id in the task (its position among the evaluated documents).
        doc: the document as the task's dataset holds it.
        requests: the harness's `Instance`s of the document (one for a generative task, one per
            choice for a multiple-choice task), as `build_all_requests` built them; a round fills copies.
        prompt: the first request's context, few-shot examples included.
        spec: the task the document belongs to.
    """

    doc_id: int
    doc: Any = field(repr=False)
    requests: tuple[Any, ...] = field(repr=False)
    prompt: str
    spec: HarnessSpec = field(repr=False, default_factory=HarnessSpec)

    @property
    def key(self) -> str:
        """What the cross-rank fingerprint compares: the document's id and every request's arguments."""
        return repr((self.doc_id, [r.arguments for r in self.requests]))


@contextlib.contextmanager
def offline() -> Iterator[None]:
    """The hub and datasets offline while a task loads: its dataset comes from the cache or local files."""
    saved = {name: os.environ.get(name) for name in _OFFLINE_ENV}
    os.environ.update({name: "1" for name in _OFFLINE_ENV})
    import datasets.config
    import huggingface_hub.constants

    flags = (datasets.config.HF_HUB_OFFLINE, huggingface_hub.constants.HF_HUB_OFFLINE)
    datasets.config.HF_HUB_OFFLINE = huggingface_hub.constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        datasets.config.HF_HUB_OFFLINE, huggingface_hub.constants.HF_HUB_OFFLINE = flags
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _task_manager(spec: HarnessSpec) -> Any:
    try:
        from lm_eval.tasks import TaskManager
    except ImportError as err:
        raise HarnessTaskError(
            f"{spec.described} needs lm-evaluation-harness, which is not installed ({err}); "
            "install it with pip install 'areal-lightning[harness]'"
        ) from None
    # A task file needs no index of the registry (building it reads every task YAML: a minute or more).
    return TaskManager(include_defaults=spec.task_file is None)


def _build(spec: HarnessSpec) -> Any:
    manager = _task_manager(spec)
    if spec.task_file is not None:
        if not Path(spec.task_file).is_file():
            raise HarnessTaskError(f"task file {spec.task_file!r} does not exist; give the path of a task YAML file")
        name: str = spec.task_file
    elif spec.task not in manager.all_tasks:
        raise HarnessTaskError(
            f"task {spec.task!r} is not a task of the installed lm-eval {_lm_eval_version()}; "
            "list them with `lm-eval ls tasks`, or give the task's YAML file as task_file"
        )
    else:
        name = str(spec.task)
    try:
        with offline():
            tasks = manager.load(name)["tasks"]
    except (ConnectionError, FileNotFoundError, OSError) as err:
        raise HarnessTaskError(
            f"{spec.described}: its dataset is not in the local cache or local files ({type(err).__name__}: {err}); "
            "on a machine with the network, load the task once (lm-eval run --limit 1 ...) to cache its dataset, "
            "or point the task's dataset_path/data_files at local files"
        ) from None
    return _one_task(spec, tasks)


def _one_task(spec: HarnessSpec, tasks: dict[str, Any]) -> Any:
    if spec.task_file is not None and spec.task is not None:
        if spec.task not in tasks:
            raise HarnessTaskError(f"task file {spec.task_file!r} has no task {spec.task!r}; it has {sorted(tasks)}")
        return tasks[spec.task]
    if len(tasks) != 1:
        raise HarnessTaskError(
            f"{spec.described} is a group of {len(tasks)} tasks ({', '.join(sorted(tasks)[:5])} ...); "
            "an eval set evaluates one task: name one of them (one eval set each)"
        )
    return next(iter(tasks.values()))


def _lm_eval_version() -> str:
    from importlib.metadata import version

    return version("lm_eval")


def _configure(task: Any, spec: HarnessSpec) -> None:
    """The few-shot count and seed as `simple_evaluate` sets them."""
    if spec.num_fewshot is not None and task.get_config("num_fewshot") != 0:
        task.set_config(key="num_fewshot", value=spec.num_fewshot)
    elif spec.num_fewshot is None and task.get_config("num_fewshot") is None:
        task.set_config(key="num_fewshot", value=0)
    task.set_fewshot_seed(seed=HARNESS_FEWSHOT_SEED)


def _check_metrics(task: Any, spec: HarnessSpec) -> None:
    """Refuses an aggregation over something else than one number per document (BLEU's pairs, F1's)."""
    for metric, aggregation in task.aggregation().items():
        name = getattr(aggregation, "__name__", repr(aggregation))
        if name not in NUMERIC_AGGREGATIONS:
            raise HarnessTaskError(
                f"{spec.described}: metric {metric!r} aggregates with {name}, which the exact reduction over ranks "
                f"does not support (accepted: {', '.join(NUMERIC_AGGREGATIONS)}); use lm-eval itself for this task"
            )


_LOADED: dict[HarnessSpec, tuple[Any, list[HarnessDoc]]] = {}


def load_task(spec: HarnessSpec) -> tuple[Any, list[HarnessDoc]]:
    """The harness task of `spec` and its documents, built once per process.

    Raises:
        HarnessTaskError: lm-eval is not installed, the task is unknown or a group, its dataset is
            not cached, or a metric's aggregation is not one number per document.
    """
    if spec not in _LOADED:
        task = _build(spec)
        _configure(task, spec)
        _check_metrics(task, spec)
        with offline():
            task.build_all_requests(limit=spec.limit, rank=0, world_size=1)
        by_doc: dict[int, list[Any]] = {}
        for instance in task.instances:
            by_doc.setdefault(instance.doc_id, []).append(instance)
        docs = [
            HarnessDoc(doc_id, requests[0].doc, tuple(sorted(requests, key=lambda r: r.idx)), requests[0].args[0], spec)
            for doc_id, requests in sorted(by_doc.items())
        ]
        _LOADED[spec] = (task, docs)
    return _LOADED[spec]


def output_type(spec: HarnessSpec) -> str:
    """The task's output type (``generate_until``, ``multiple_choice`` ...)."""
    return str(load_task(spec)[0].OUTPUT_TYPE)


def harness_eval_set(name: str, spec: HarnessSpec, batch_size: int, max_batch_cost: float | None) -> Any:
    """The eval set of a harness task: its documents, with the task's own sampling (no `SamplingParams`,
    `HARNESS_OPTION` in its options); a document's cost is its prompt's length."""
    from areal_lightning.eval_round import EvalSet

    return EvalSet(
        name=name,
        samples=load_task(spec)[1],
        batch_size=batch_size,
        cost_fn=lambda d: float(len(d.prompt)),
        key_fn=lambda d: d.key,
        max_batch_cost=max_batch_cost,
        options={HARNESS_OPTION: spec.as_options()},
    )
