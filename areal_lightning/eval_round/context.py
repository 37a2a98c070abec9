"""What `evaluate_fn` receives and what a round returns: batches, the context, the reduced result."""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, overload

import torch
from torchmetrics import Metric

from areal_lightning.eval_round.progress import RoundProgress
from areal_lightning.eval_round.sampling_params import SamplingParams
from areal_lightning.eval_round.sharding import sample_seeds
from areal_lightning.metrics.outcomes import Outcomes


@dataclass(frozen=True)
class EvalBatch:
    """A batch of one eval set: the samples, their indices in the set and their own seeds."""

    indices: list[int]
    samples: list[Any]
    seeds: list[int]


class DealtBatches(Sequence[EvalBatch]):
    """A rank's deal of an eval set: its batches' sample indices (8 bytes a prompt), each `EvalBatch`
    made, with its samples and their seeds, when it is read, so that a rank holds one batch's
    samples at a time however large the eval set is.

    Example:
        >>> dealt = DealtBatches("easy", ["1+1=", "2+2=", "3+3="], seed=0, batches=[[2, 0], [1]])
        >>> len(dealt), dealt[0].samples, dealt.num_prompts, dealt.index_sum
        (2, ['3+3=', '1+1='], 3, 3)
    """

    def __init__(self, name: str, samples: Sequence[Any], seed: int, batches: Sequence[Sequence[int]]) -> None:
        self._name, self._samples, self._seed = name, samples, seed
        self._batches = [array("q", b) for b in batches]

    def __len__(self) -> int:
        return len(self._batches)

    @overload
    def __getitem__(self, index: int) -> EvalBatch: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[EvalBatch]: ...
    def __getitem__(self, index: int | slice) -> EvalBatch | Sequence[EvalBatch]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        indices = self._batches[index].tolist()
        return EvalBatch(indices, [self._samples[i] for i in indices], sample_seeds(self._seed, self._name, indices))

    def __iter__(self) -> Iterator[EvalBatch]:
        return (self[i] for i in range(len(self)))

    @property
    def num_prompts(self) -> int:
        return sum(len(b) for b in self._batches)

    @property
    def index_sum(self) -> int:
        """The sum of the dealt indices (with `num_prompts`, the round checks each sample is evaluated once)."""
        return sum(sum(b) for b in self._batches)


class EvalRoundError(RuntimeError):
    """`evaluate_fn` failed on at least one rank; raised on every rank, so none is left waiting.

    A failing eval set costs only itself: `failures` maps each failed set's name to its message,
    and `results` holds the reduced results of the round's other sets (in eval-set order). An
    error that is not one set's (a reduction the ranks disagree on) has no `failures`.
    """

    def __init__(
        self, message: str, *, results: Sequence[SetResult] = (), failures: Mapping[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.results = list(results)
        self.failures = dict(failures or {})

    @property
    def messages(self) -> dict[str | None, str]:
        """Each failed set's message, or the whole round's under None."""
        if not self.failures:
            return {None: str(self)}
        return {name: message for name, message in self.failures.items()}


def metric_to(metric: Metric, device: torch.device) -> Metric:
    """`metric` on `device`, its dtype kept: torchmetrics' ``.to(device)`` resets any metric's dtype to
    float32, and an aggregation metric (``SumMetric().set_dtype(torch.float64)``) then casts its inputs
    to float32. (A dtype conversion is another matter: `metrics.float64_states` keeps our metrics'
    float64 states through it.)"""
    dtype = metric.dtype
    metric = metric.to(device)
    if metric.dtype != dtype:
        metric.set_dtype(dtype)
    return metric


@dataclass
class EvalContext:
    """What `evaluate_fn` knows about the round besides the module and its batches.

    Create metrics with `metric(...)`, before or inside the batch loop: a rank dealt no batch
    never reaches the loop, and the round gives it a fresh copy of every metric another rank
    created, so that all ranks join the same reduction. Call `record_sample` for generations
    worth showing; those with `index < max_table_rows` are kept.

    `lockstep` is True when the module's forward runs collectives (sharded parameters: FSDP2,
    FSDP): every rank must then run the same number of forward passes for a batch of the same
    kind, so generation must decode a fixed number of steps instead of stopping once every row
    ended. `padding` is True on the second call the round makes under lockstep, with batches that
    only keep this rank in step with the others: whatever it records is dropped. `sanity` is True in
    the sanity pass when `fit` starts (as ``trainer.sanity_checking`` for validation): nothing of
    that call is recorded.
    """

    dataset: str
    rank: int
    world_size: int
    global_step: int
    epoch: int
    device: torch.device
    seed: int
    options: Mapping[str, Any] = field(default_factory=dict)
    sampling: SamplingParams | None = None
    metrics: dict[str, Metric] = field(default_factory=dict)
    num_samples: int = 0
    max_table_rows: int = 0
    table_rows: list[dict[str, Any]] = field(default_factory=list)
    lockstep: bool = False
    padding: bool = False
    sanity: bool = False
    outcomes: dict[str, Outcomes] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)

    def metric(self, name: str, factory: Callable[[], Metric]) -> Metric:
        """The metric called `name`, created on this round's device on first use."""
        if name not in self.metrics:
            self.metrics[name] = metric_to(factory(), self.device)
        return self.metrics[name]

    def record_outcomes(self, name: str, indices: Sequence[int], values: Any) -> None:
        """Keeps each prompt's outcome of metric `name` (e.g. its share of correct samples), keyed
        by sample index, so that two rounds can be paired (``eval/<set>/<name>/delta``). The
        outcomes' mean over prompts should be the metric's value.

        Example:
            >>> ctx = EvalContext("easy", 0, 1, 0, 0, torch.device("cpu"), 0)
            >>> ctx.record_outcomes("accuracy", [3, 4], torch.tensor([1.0, 0.5]))
            >>> ctx.outcomes
            {'accuracy': {3: 1.0, 4: 0.5}}
        """
        flat = (
            values.detach().double().flatten().cpu().numpy()
            if isinstance(values, torch.Tensor)
            else [float(v) for v in values]
        )
        if len(flat) != len(indices):
            raise ValueError(f"`record_outcomes({name!r}, ...)` got {len(indices)} indices and {len(flat)} values")
        self.outcomes.setdefault(name, Outcomes()).add(indices, flat)

    def note(self, name: str, text: str) -> None:
        """Writes `text` into the round's record under ``notes`` (what a number cannot say, such as
        the weight version the servers held); rank 0's note is kept.

        Example:
            >>> ctx = EvalContext("easy", 0, 1, 0, 0, torch.device("cpu"), 0)
            >>> ctx.note("server/weight_version", "step-000000002-ab12"); ctx.notes
            {'server/weight_version': 'step-000000002-ab12'}
        """
        self.notes[name] = str(text)

    def record_sample(self, index: int, **row: Any) -> None:
        """Keeps `row` (any JSON-like columns) for the samples table when `index < max_table_rows`."""
        if index < self.max_table_rows:
            self.table_rows.append({"index": index, **row})


class BatchList(Sequence[EvalBatch]):
    """This rank's batches, as `evaluate_fn` receives them: a plain sequence that reports each
    batch done to the round's progress display while it is iterated (wrapping it in a progress
    iterator of one's own works too)."""

    def __init__(self, batches: Sequence[EvalBatch], progress: RoundProgress | None = None) -> None:
        self._batches, self._progress = batches, progress

    def __len__(self) -> int:
        return len(self._batches)

    @overload
    def __getitem__(self, index: int) -> EvalBatch: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[EvalBatch]: ...
    def __getitem__(self, index: int | slice) -> EvalBatch | Sequence[EvalBatch]:
        return self._batches[index]

    def __iter__(self) -> Iterator[EvalBatch]:
        if self._progress is None:
            return iter(self._batches)
        return self._reporting(self._progress)

    def _reporting(self, progress: RoundProgress) -> Iterator[EvalBatch]:
        for batch in self._batches:
            yield batch
            progress.advance()  # the caller asked for the next batch: this one is done


class EvaluateFn(Protocol):
    """``evaluate_fn(module, batches, ctx) -> {name: value}``: the user's part of a round.

    Values are per-sample tensors (averaged over samples) or scalars (this rank's mean over its
    prompts); both are reduced exactly across ranks. Return ``{}`` or None when every result
    lives in ``ctx.metrics``.
    """

    def __call__(self, module: Any, batches: Sequence[EvalBatch], ctx: EvalContext, /) -> Mapping[str, Any] | None: ...


@dataclass
class SetResult:
    """One eval set's reduced result of a round."""

    dataset: str
    metrics: dict[str, float]
    num_samples: int
    num_prompts: int
    eval_secs: float
    table_rows: list[dict[str, Any]]
    sampling: dict[str, Any] | None = None
    """The eval set's `SamplingParams.as_record`, with the seed used; None when the set has none."""
    outcomes: dict[str, Outcomes] = field(default_factory=dict)
    """This rank's per-prompt outcomes (`EvalContext.record_outcomes`), by metric; not reduced."""
    outcome_names: list[str] = field(default_factory=list)
    """Every metric with outcomes on any rank, sorted (the same list on every rank)."""
    notes: dict[str, str] = field(default_factory=dict)
    """`EvalContext.note`s, rank 0's where ranks wrote the same name (the record's ``notes``)."""
