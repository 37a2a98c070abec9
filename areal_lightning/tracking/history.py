"""The eval history: one JSON object per eval set per round, appended to ``eval_history.jsonl``.

The file format is public (see ``DESIGN.md``, "Eval history"); plots, tests and users' scripts
read it. A round record looks like::

    {"step": 120, "epoch": 1, "time": 1764460800.5, "trigger": ["steps"], "dataset": "easy",
     "metrics": {"accuracy": 0.81, "reward/mean": 0.81, "pass@4": 0.93},
     "num_samples": 200, "num_prompts": 50, "eval_secs": 1.9, "mode": "sync", "world_size": 2}

Alerts and errors get their own records, told apart by an ``"event"`` key::

    {"event": "alert", "step": 120, "time": 1764460801.0, "dataset": "easy",
     "message": "accuracy 0.81 >= threshold 0.7", "metric": "accuracy", "value": 0.81}

JSON has no NaN or infinity, so a non-finite number is written as ``null``; a reader gets
``None`` back where the writer had NaN (``float("nan")``, ``torch.nan``, ``np.nan``).

The writer only ever appends: the file is opened in append mode for each write, the line is
flushed and ``fsync``'d before ``append`` returns, so a crash loses at most the line being
written and a reader (another process, a plot) sees every finished round at once.
"""

from __future__ import annotations

import json
import math
import os
import time as _time
import warnings
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

HISTORY_FILENAME = "eval_history.jsonl"
"""File name of the eval history inside a run's ``output_dir``."""

EVENT_KINDS = ("alert", "error", "skipped")
"""Accepted values of a record's ``"event"`` key."""

EVAL_MODES = ("sync", "async")
"""Accepted values of a round record's ``"mode"``."""


class TruncatedHistoryWarning(UserWarning):
    """The last line of an eval history is not whole JSON (the writer stopped mid-line)."""


def _to_json_value(value: Any, where: str) -> Any:
    """Convert ``value`` into something ``json.dumps(allow_nan=False)`` accepts.

    Tensors and numpy scalars / arrays become Python numbers / lists, non-finite floats become
    ``None``. ``where`` names the key path for the error message.
    """
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, Mapping):
        return {str(k): _to_json_value(v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_to_json_value(v, f"{where}[{i}]") for i, v in enumerate(value)]
    # torch.Tensor and numpy scalars/arrays both offer `.tolist()`; duck typing keeps torch and
    # numpy out of this module's imports.
    if hasattr(value, "tolist") and callable(value.tolist):
        return _to_json_value(value.tolist(), where)
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    raise TypeError(
        f"EvalHistory cannot store {where}={value!r} of type {type(value).__name__}; accepted: "
        "None, bool, int, float, str, tensors, numpy numbers, and lists / mappings of those"
    )


class EvalHistory:
    """Append-only writer of an eval history file (rank 0 alone should hold one).

    Args:
        path: the ``.jsonl`` file to append to; parent directories are created on first write.
            Use :meth:`in_run_dir` to get the standard ``<output_dir>/eval_history.jsonl``.

    Example:
        >>> import tempfile
        >>> history = EvalHistory.in_run_dir(tempfile.mkdtemp())
        >>> history.append(eval_record(10, 0, "easy", {"accuracy": 0.5}, trigger=["steps"],
        ...     num_samples=8, num_prompts=2, eval_secs=0.1, mode="sync", world_size=1))
        >>> read_history(history.path)[0]["metrics"]
        {'accuracy': 0.5}
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if self.path.is_dir():
            raise IsADirectoryError(
                f"EvalHistory(path={str(path)!r}) is a directory; pass the .jsonl file, "
                f"e.g. EvalHistory.in_run_dir({str(path)!r}) for {HISTORY_FILENAME} inside it"
            )
        self._tail_checked = False

    @classmethod
    def in_run_dir(cls, run_dir: str | Path) -> EvalHistory:
        """The writer of ``<run_dir>/eval_history.jsonl``."""
        return cls(Path(run_dir) / HISTORY_FILENAME)

    def append(self, record: Mapping[str, Any]) -> None:
        """Append one record as one JSON line, flushed and fsync'd before returning.

        Raises:
            TypeError: a value is not JSON-representable (see module docstring).
        """
        self.append_many([record])

    def append_many(self, records: Iterable[Mapping[str, Any]]) -> None:
        """Append several records with a single open / fsync (e.g. every eval set of a round)."""
        lines = []
        for record in records:
            if not isinstance(record, Mapping):
                raise TypeError(
                    f"EvalHistory.append(record=...) must be a mapping, got {type(record).__name__}"
                )
            lines.append(json.dumps(_to_json_value(record, "record"), allow_nan=False) + "\n")
        if not lines:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        prefix = self._partial_tail_fix()
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(prefix + "".join(lines))
            f.flush()
            # fsync so another process (a plot, a resumed run) sees whole rounds even after a crash.
            os.fsync(f.fileno())

    def _partial_tail_fix(self) -> str:
        """A newline to write first when a previous writer died mid-line, else ``""``.

        Without it the first new record would be glued onto the broken line and lost too. The
        broken line stays (we never rewrite the file), so readers will point at it.
        """
        if self._tail_checked:
            return ""
        self._tail_checked = True
        if not self.path.exists() or self.path.stat().st_size == 0:
            return ""
        with open(self.path, "rb") as f:
            f.seek(-1, os.SEEK_END)
            if f.read(1) == b"\n":
                return ""
        warnings.warn(
            f"{self.path} ends with an unfinished line (a previous run stopped mid-write); "
            "new records start on a fresh line, delete the broken line to read the file",
            TruncatedHistoryWarning,
            stacklevel=3,
        )
        return "\n"


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
    time: float | None = None,
) -> dict[str, Any]:
    """Build one round record with the public field order of ``DESIGN.md``.

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
        time: UNIX time of the record; ``time.time()`` when omitted.

    Raises:
        ValueError: a count is negative, ``mode`` or ``world_size`` is not accepted.

    Example:
        >>> rec = eval_record(120, 1, "easy", {"accuracy": 0.81}, trigger="steps",
        ...     num_samples=200, num_prompts=50, eval_secs=1.9, mode="sync", world_size=2,
        ...     time=1764460800.5)
        >>> list(rec)[:5]
        ['step', 'epoch', 'time', 'trigger', 'dataset']
    """
    for name, value in (("step", step), ("epoch", epoch), ("num_samples", num_samples),
                        ("num_prompts", num_prompts)):
        if int(value) != value or value < 0:
            raise ValueError(f"eval_record({name}=...) must be an integer >= 0, got {value!r}")
    if mode not in EVAL_MODES:
        raise ValueError(f"eval_record(mode=...) must be one of {EVAL_MODES}, got {mode!r}")
    if int(world_size) != world_size or world_size < 1:
        raise ValueError(f"eval_record(world_size=...) must be an integer >= 1, got {world_size!r}")
    triggers = [trigger] if isinstance(trigger, str) else list(trigger)
    if not all(isinstance(t, str) for t in triggers):
        raise ValueError(f"eval_record(trigger=...) must be a string or strings, got {trigger!r}")
    return {
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
    }


def _metric_float(name: str, value: Any) -> float:
    """A metric value as a Python float (NaN stays NaN here; the writer turns it into null)."""
    if value is None:
        return math.nan
    plain = value.tolist() if hasattr(value, "tolist") else value
    if isinstance(plain, list):
        if len(plain) != 1:
            raise ValueError(
                f"eval_record(metrics={{{name!r}: ...}}) must be a scalar, got {len(plain)} values"
            )
        plain = plain[0]
    return float(plain)


def event_record(
    event: str,
    step: int,
    *,
    dataset: str | None = None,
    message: str,
    time: float | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """Build an alert or error record: ``{"event", "step", "time", "dataset", "message", ...}``.

    Args:
        event: ``"alert"`` (a metric crossed a threshold), ``"error"`` (a round failed) or
            ``"skipped"`` (an async round fell due while the previous one still ran).
        step: global step of the weights concerned.
        dataset: eval set name, or None when the event is not about one eval set.
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
        "message": str(message),
        **extra,
    }


def history_path(path_or_run_dir: str | Path) -> Path:
    """The history file for a ``.jsonl`` path or a run directory (``<dir>/eval_history.jsonl``)."""
    path = Path(path_or_run_dir)
    return path / HISTORY_FILENAME if path.is_dir() else path


def read_history(path_or_run_dir: str | Path) -> list[dict[str, Any]]:
    """Read every record of an eval history, in file order (``null`` metrics come back as None).

    Args:
        path_or_run_dir: the ``eval_history.jsonl`` file or the run directory that holds it.

    Raises:
        FileNotFoundError: no such file (the message says what is accepted).
        ValueError: a line other than the last is not a JSON object (names file and line).

    A last line that is not whole JSON (the writer stopped mid-line) is skipped with one
    :class:`TruncatedHistoryWarning`. Blank lines are ignored.

    Example:
        >>> import tempfile
        >>> run_dir = tempfile.mkdtemp()
        >>> EvalHistory.in_run_dir(run_dir).append(event_record("error", 3, message="oom", time=0))
        >>> read_history(run_dir)[0]["event"]
        'error'
    """
    path = history_path(path_or_run_dir)
    if not path.is_file():
        raise FileNotFoundError(
            f"no eval history at {str(path)!r}; pass an {HISTORY_FILENAME} file or a run "
            "directory (the run's output_dir) that contains one"
        )
    lines = path.read_text(encoding="utf-8").splitlines()
    numbered = [(i + 1, line) for i, line in enumerate(lines) if line.strip()]
    records: list[dict[str, Any]] = []
    for index, (line_no, line) in enumerate(numbered):
        is_last = index == len(numbered) - 1
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            if is_last:
                warnings.warn(
                    f"{path}: skipped the unfinished last line {line_no} ({err.msg}); "
                    "the writer probably stopped mid-write",
                    TruncatedHistoryWarning,
                    stacklevel=2,
                )
                break
            raise ValueError(
                f"{path}: line {line_no} is not valid JSON ({err.msg}); every line of an eval "
                "history must be one JSON object (delete the line if a crashed run left it)"
            ) from None
        if not isinstance(record, dict):
            raise ValueError(
                f"{path}: line {line_no} is a JSON {type(record).__name__}, expected an object"
            )
        records.append(record)
    return records


def eval_rows(records: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The round records only (drops ``"event"`` records: alerts and errors)."""
    return [dict(r) for r in records if "event" not in r]


def event_rows(
    records: Iterable[Mapping[str, Any]], event: str | None = None
) -> list[dict[str, Any]]:
    """The event records only, optionally of one kind (``"alert"`` or ``"error"``)."""
    return [dict(r) for r in records if "event" in r and (event is None or r["event"] == event)]
