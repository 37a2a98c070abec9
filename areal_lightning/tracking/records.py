"""The records of the eval history: `eval_record` (one eval set's round) and `event_record` (an
alert, an error, a resumption ...), the field names and values ``docs/eval_history.md`` documents.
`tracking.history.EvalHistory` appends them to the file."""

from __future__ import annotations

import math
import time as _time
from collections.abc import Mapping, Sequence
from typing import Any

EVENT_KINDS = (
    "alert",
    "error",
    "resume",
    "adaptive",
    "drift",
    "skipped",
    "interrupted",
    "integrity",
    "prompt_outcomes",
)
"""Accepted values of a record's ``"event"`` key."""

EVAL_MODES = ("sync", "async")
"""Accepted values of a round record's ``"mode"``."""

RECORD_SOURCES = ("training", "standalone")
"""Accepted values of a round record's ``"source"``: an evaluation during training, or one of a
checkpoint by the standalone ``evaluate`` command."""


def eval_record(
    step: int,
    epoch: int,
    dataset: str,
    metrics: Mapping[str, Any],
    *,
    trigger: str | Sequence[str],
    num_samples: int,
    num_prompts: int,
    eval_secs: float,
    mode: str,
    world_size: int,
    run_id: str | None = None,
    source: str = "training",
    time: float | None = None,
    sampling: Mapping[str, Any] | None = None,
    notes: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Build one round record in the public field order (``docs/eval_history.md``).

    Args:
        step: global step whose weights were evaluated (also in async mode).
        epoch: training epoch of those weights.
        dataset: eval set name.
        metrics: metric name -> value (float, tensor or numpy scalar); converted to float.
        trigger: the trigger(s) that fired, e.g. ``["steps"]``.
        num_samples: generated samples evaluated (prompts x samples per prompt).
        num_prompts: distinct prompts evaluated.
        eval_secs: wall-clock seconds the round took.
        mode: ``"sync"`` or ``"async"``.
        world_size: number of ranks that shared the round.
        run_id: the run whose weights were evaluated (None: unknown, e.g. an old checkpoint).
        source: ``"training"`` (the callback during fit) or ``"standalone"`` (``evaluate``).
        time: UNIX time of the record; ``time.time()`` when omitted.
        sampling: how the completions were sampled (``SamplingParams.as_record``); written as
            the record's ``"sampling"`` object when given.
        notes: what the evaluation noted in words (`EvalContext.note`, e.g. the servers' weight
            version); written as the record's ``"notes"`` object when there are any.

    Raises:
        ValueError: a count is negative, ``mode``, ``source`` or ``world_size`` is not accepted.

    Example:
        >>> rec = eval_record(120, 1, "easy", {"accuracy": 0.81}, trigger="steps",
        ...     num_samples=200, num_prompts=50, eval_secs=1.9, mode="sync", world_size=2,
        ...     time=1764460800.5)
        >>> list(rec)[:5]
        ['step', 'epoch', 'time', 'trigger', 'dataset']
    """
    for name, value in (("step", step), ("epoch", epoch), ("num_samples", num_samples), ("num_prompts", num_prompts)):
        if int(value) != value or value < 0:
            raise ValueError(f"eval_record({name}=...) must be an integer >= 0, got {value!r}")
    if mode not in EVAL_MODES:
        raise ValueError(f"eval_record(mode=...) must be one of {EVAL_MODES}, got {mode!r}")
    if source not in RECORD_SOURCES:
        raise ValueError(f"eval_record(source=...) must be one of {RECORD_SOURCES}, got {source!r}")
    if int(world_size) != world_size or world_size < 1:
        raise ValueError(f"eval_record(world_size=...) must be an integer >= 1, got {world_size!r}")
    triggers = [trigger] if isinstance(trigger, str) else list(trigger)
    if not all(isinstance(t, str) for t in triggers):
        raise ValueError(f"eval_record(trigger=...) must be a string or strings, got {trigger!r}")
    record = {
        "step": int(step),
        "epoch": int(epoch),
        "time": float(_time.time() if time is None else time),
        "trigger": triggers,
        "dataset": str(dataset),
        "metrics": {str(k): _metric_float(k, v) for k, v in metrics.items()},
        "num_samples": int(num_samples),
        "num_prompts": int(num_prompts),
        "eval_secs": float(eval_secs),
        "mode": mode,
        "world_size": int(world_size),
        "run_id": run_id,
        "source": source,
    }
    if sampling is not None:
        record["sampling"] = dict(sampling)
    if notes:
        record["notes"] = {str(k): str(v) for k, v in notes.items()}
    return record


def _metric_float(name: str, value: Any) -> float:
    """A metric value as a Python float (NaN stays NaN here; the writer turns it into null)."""
    if value is None:
        return math.nan
    plain = value.tolist() if hasattr(value, "tolist") else value
    if isinstance(plain, list):
        if len(plain) != 1:
            raise ValueError(f"eval_record(metrics={{{name!r}: ...}}) must be a scalar, got {len(plain)} values")
        plain = plain[0]
    return float(plain)


def event_record(
    event: str,
    step: int,
    *,
    dataset: str | None = None,
    message: str,
    run_id: str | None = None,
    time: float | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """Build an event record: ``{"event", "step", "time", "dataset", "run_id", "message", ...}``.

    Args:
        event: ``"alert"`` (a metric crossed a threshold), ``"error"`` (a round failed) or
            ``"resume"`` (the run went on from a checkpoint of ``step``: its records of later
            steps written before this one are superseded, see `drop_superseded`).
            ``"skipped"`` (an async round fell due while the previous one still ran),
            ``"interrupted"`` (a signal stopped training; the record names the checkpoint and the
            command that resumes the run).
        step: global step of the weights concerned.
        dataset: eval set name, or None when the event is not about one eval set.
        run_id: the run the event belongs to.
        message: a human-readable sentence.
        time: UNIX time; ``time.time()`` when omitted.
        **extra: more fields, e.g. ``metric="accuracy", value=0.81, threshold=0.7``.

    Raises:
        ValueError: ``event`` is not one of :data:`EVENT_KINDS`.

    Example:
        >>> event_record("alert", 120, dataset="easy", message="accuracy >= 0.7",
        ...     metric="accuracy", value=0.81, time=0.0)["metric"]
        'accuracy'
    """
    if event not in EVENT_KINDS:
        raise ValueError(f"event_record(event=...) must be one of {EVENT_KINDS}, got {event!r}")
    return {
        "event": event,
        "step": int(step),
        "time": float(_time.time() if time is None else time),
        "dataset": dataset,
        "run_id": run_id,
        "message": str(message),
        **extra,
    }
