"""The eval history: one JSON object per eval set per round, appended to ``eval_history.jsonl``.

The format is public, documented field by field in docs/eval_history.md. Every record names its
run (``run_id``; `split_runs` tells runs apart); events (alerts, errors, resumptions) carry an
``"event"`` key; a non-finite number is written as ``null``. The writer only appends, flushing and
``fsync``-ing each line, so a crash loses at most the line being written; a resumed writer starts on
a fresh line after a torn one and, given `once_per_step`, does not record a round twice for one
(eval set, step). A reader skips a torn line, with a warning.
"""

from __future__ import annotations

import json
import math
import os
import secrets
import string
import warnings
from collections.abc import Collection, Iterable, Mapping
from pathlib import Path
from typing import Any

HISTORY_FILENAME = "eval_history.jsonl"
"""File name of the eval history inside a run's ``output_dir``."""

RUN_ID_LENGTH = 8
_RUN_ID_ALPHABET = string.ascii_lowercase + string.digits
LEGACY_RUN_PREFIX = "legacy-"
"""`split_runs` names the runs of records without ``run_id`` ``legacy-1``, ``legacy-2``, ..."""
STANDALONE_SOURCE = "standalone"
"""The ``source`` of the records of ``areal-lightning evaluate`` (``--ckpt`` or ``--watch``): an
evaluation of a checkpoint of the run named by their ``run_id``, not a round of its training."""
LEGACY_STANDALONE_TRIGGER = "evaluate"
"""The ``trigger`` that marks a standalone record in files written before the ``source`` field."""


def new_run_id() -> str:
    """A fresh run id: 8 random lowercase letters and digits (also a valid W&B run id).

    Example:
        >>> rid = new_run_id()
        >>> len(rid), rid.isalnum(), rid == rid.lower()
        (8, True, True)
    """
    return "".join(secrets.choice(_RUN_ID_ALPHABET) for _ in range(RUN_ID_LENGTH))


class TruncatedHistoryWarning(UserWarning):
    """A line of an eval history is a JSON object cut short (the writer stopped mid-line)."""


class DuplicateRoundWarning(UserWarning):
    """A round record for an (eval set, step) the history already holds was not appended."""


def _is_torn(line: str, err: json.JSONDecodeError) -> bool:
    """`line` is the start of a JSON object that stops short, as a writer killed mid-line leaves it."""
    stripped = line.rstrip()
    return stripped.startswith("{") and (err.msg.startswith("Unterminated string") or err.pos >= len(stripped))


def _round_key(record: Mapping[str, Any], triggers: Collection[str]) -> tuple[str | None, str, int] | None:
    """(run_id, dataset, step) of a round record with one of `triggers`; None for anything else.
    Another run in the same file (a new run_id) records its own rounds."""
    if "event" in record or "dataset" not in record or "step" not in record:
        return None
    trigger = record.get("trigger")
    if not set([trigger] if isinstance(trigger, str) else trigger or []) & set(triggers):
        return None
    return record.get("run_id"), str(record["dataset"]), int(record["step"])


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
        once_per_step: triggers (e.g. ``["steps", "end"]``) whose rounds are appended once per
            (eval set, step): a round record with one of them, for an (eval set, step) that a
            record with one of them already holds, is dropped with a warning (a resumed run
            evaluates again the steps after its checkpoint). Empty: every record is appended.

    Example:
        >>> import tempfile
        >>> temp = tempfile.TemporaryDirectory()
        >>> history = EvalHistory.in_run_dir(temp.name)
        >>> from areal_lightning.tracking.records import eval_record
        >>> history.append(eval_record(10, 0, "easy", {"accuracy": 0.5}, trigger=["steps"],
        ...     num_samples=8, num_prompts=2, eval_secs=0.1, mode="sync", world_size=1))
        >>> read_history(history.path)[0]["metrics"]
        {'accuracy': 0.5}
        >>> temp.cleanup()
    """

    def __init__(self, path: str | Path, *, once_per_step: Collection[str] = ()) -> None:
        self.path = Path(path)
        self.once_per_step = frozenset(once_per_step)
        if self.path.is_dir():
            raise IsADirectoryError(
                f"EvalHistory(path={str(path)!r}) is a directory; pass the .jsonl file, "
                f"e.g. EvalHistory.in_run_dir({str(path)!r}) for {HISTORY_FILENAME} inside it"
            )
        self._tail_checked = False
        self._recorded: set[tuple[str | None, str, int]] | None = None  # (run_id, dataset, step), read once

    @classmethod
    def in_run_dir(cls, run_dir: str | Path, *, once_per_step: Collection[str] = ()) -> EvalHistory:
        """The writer of ``<run_dir>/eval_history.jsonl``."""
        return cls(Path(run_dir) / HISTORY_FILENAME, once_per_step=once_per_step)

    def append(self, record: Mapping[str, Any]) -> None:
        """Append one record as one JSON line, flushed and fsync'd before returning.

        Raises:
            TypeError: a value is not JSON-representable (see module docstring).
        """
        self.append_many([record])

    def append_many(self, records: Iterable[Mapping[str, Any]]) -> None:
        """Append several records with a single open / fsync (e.g. every eval set of a round).

        With `once_per_step`, a round record whose (run_id, dataset, step) the file already holds is
        dropped with a :class:`DuplicateRoundWarning`.
        """
        lines = []
        recorded = self._recorded_rounds()
        for record in records:
            if not isinstance(record, Mapping):
                raise TypeError(f"EvalHistory.append(record=...) must be a mapping, got {type(record).__name__}")
            key = _round_key(record, self.once_per_step)
            if key is not None and key in recorded:
                warnings.warn(
                    f"{self.path} already holds a round of eval set {key[1]!r} at step {key[2]} (a resumed run "
                    "evaluated it again); the new record is not appended",
                    DuplicateRoundWarning,
                    stacklevel=2,
                )
                continue
            if key is not None:
                recorded.add(key)
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

    def _recorded_rounds(self) -> set[tuple[str | None, str, int]]:
        if self._recorded is None:
            self._recorded = set()
            if self.once_per_step and self.path.is_file():
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", TruncatedHistoryWarning)  # the tail fix warns about it
                    # A resumed run re-evaluates the steps its dead session had recorded after the
                    # checkpoint: those records are superseded (`drop_superseded`), not duplicates.
                    keys = (_round_key(r, self.once_per_step) for r in drop_superseded(read_history(self.path)))
                    self._recorded = {k for k in keys if k is not None}
        return self._recorded

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
            "new records start on a fresh line; readers skip the broken one",
            TruncatedHistoryWarning,
            stacklevel=3,
        )
        return "\n"


def history_path(path_or_run_dir: str | Path) -> Path:
    """The history file for a ``.jsonl`` path or a run directory (``<dir>/eval_history.jsonl``)."""
    path = Path(path_or_run_dir)
    return path / HISTORY_FILENAME if path.is_dir() else path


def read_history(path_or_run_dir: str | Path, run_id: str | None = None) -> list[dict[str, Any]]:
    """Read every record of an eval history, in file order (``null`` metrics come back as None).

    Args:
        path_or_run_dir: the ``eval_history.jsonl`` file or the run directory that holds it.
        run_id: only the records of this run (as `split_runs` names runs, so ``legacy-1`` works
            for records written before run ids existed); None: every record.

    Raises:
        FileNotFoundError: no such file (the message says what is accepted).
        ValueError: a line is neither a JSON object nor one cut short (names file and line).

    A line that is a JSON object cut short (a writer stopped mid-line; a resumed run then wrote on
    after it) is skipped with a :class:`TruncatedHistoryWarning`. Blank lines are ignored.

    Example:
        >>> import tempfile
        >>> temp = tempfile.TemporaryDirectory(); run_dir = temp.name
        >>> from areal_lightning.tracking.records import event_record
        >>> EvalHistory.in_run_dir(run_dir).append(event_record("error", 3, message="oom", time=0))
        >>> read_history(run_dir)[0]["event"]
        'error'
        >>> temp.cleanup()
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
            if is_last or _is_torn(line, err):
                where = "last line" if is_last else "line"
                warnings.warn(
                    f"{path}: skipped the unfinished {where} {line_no} ({err.msg}); "
                    "the writer probably stopped mid-write",
                    TruncatedHistoryWarning,
                    stacklevel=2,
                )
                continue
            raise ValueError(
                f"{path}: line {line_no} is not valid JSON ({err.msg}); every line of an eval "
                "history must be one JSON object (delete the line if a crashed run left it)"
            ) from None
        if not isinstance(record, dict):
            raise ValueError(f"{path}: line {line_no} is a JSON {type(record).__name__}, expected an object")
        records.append(record)
    if run_id is not None:
        return split_runs(records).get(run_id, [])
    return records


def eval_rows(records: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The round records only (drops ``"event"`` records: alerts and errors)."""
    return [dict(r) for r in records if "event" not in r]


def event_rows(records: Iterable[Mapping[str, Any]], event: str | None = None) -> list[dict[str, Any]]:
    """The event records only, optionally of one kind (``"alert"`` or ``"error"``)."""
    return [dict(r) for r in records if "event" in r and (event is None or r["event"] == event)]


def is_standalone(record: Mapping[str, Any]) -> bool:
    """A record of ``areal-lightning evaluate`` (``--ckpt`` or ``--watch``) of one of its run's
    checkpoints, not of training: ``source: "standalone"``; in a file written before records had a
    ``source``, one whose ``trigger`` holds ``"evaluate"``.

    Example:
        >>> is_standalone({"source": "standalone"}), is_standalone({"trigger": ["evaluate"]})
        (True, True)
        >>> is_standalone({"source": "training", "trigger": ["steps"]}), is_standalone({"trigger": ["end"]})
        (False, False)
    """
    source = record.get("source")
    if source is not None:
        return bool(source == STANDALONE_SOURCE)
    trigger = record.get("trigger")
    return LEGACY_STANDALONE_TRIGGER in ([trigger] if isinstance(trigger, str) else trigger or [])


def split_runs(records: Iterable[Mapping[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """The records of each run, by ``run_id``, runs and records in file order.

    Records without a ``run_id`` (written before run ids existed) are cut into runs where an
    eval set's step repeats, as it does when a second run appends to the same file (steps 0, 5,
    10, 0, 5, ...); those runs are named ``legacy-1``, ``legacy-2``, ... A standalone evaluation
    among them (`is_standalone`: ``evaluate`` of a checkpoint, whose step repeats a training
    round's) cuts nothing: it goes with the run before it.

    Example:
        >>> recs = [{"step": s, "dataset": "easy", "metrics": {}} for s in (0, 5, 0, 5)]
        >>> {name: [r["step"] for r in rs] for name, rs in split_runs(recs).items()}
        {'legacy-1': [0, 5], 'legacy-2': [0, 5]}
        >>> recs.insert(2, {"step": 5, "dataset": "easy", "metrics": {}, "trigger": ["evaluate"]})
        >>> {name: [r["step"] for r in rs] for name, rs in split_runs(recs).items()}
        {'legacy-1': [0, 5, 5], 'legacy-2': [0, 5]}
    """
    runs: dict[str, list[dict[str, Any]]] = {}
    legacy_count, legacy_seen = 0, set[tuple[Any, Any]]()
    for record in records:
        run_id = record.get("run_id")
        if run_id is None:
            key = (record.get("dataset"), record.get("step"))
            training_round = "event" not in record and not is_standalone(record)
            if legacy_count == 0 or (training_round and key in legacy_seen):
                legacy_count, legacy_seen = legacy_count + 1, set()
            if training_round:
                legacy_seen.add(key)
            run_id = f"{LEGACY_RUN_PREFIX}{legacy_count}"
        runs.setdefault(str(run_id), []).append(dict(record))
    return runs


def drop_superseded(records: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One run's records without those a resumption superseded, in file order.

    A ``"resume"`` event at step N means the run went on from its checkpoint of step N: records
    of later steps written before the event belong to the session that died and are dropped.

    Example:
        >>> recs = [{"step": 5}, {"step": 10}, {"event": "resume", "step": 5}, {"step": 10}]
        >>> [r["step"] for r in drop_superseded(recs)]
        [5, 5, 10]
    """
    kept: list[dict[str, Any]] = []
    for record in records:
        if record.get("event") == "resume":
            kept = [r for r in kept if int(r["step"]) <= int(record["step"])]
        kept.append(dict(record))
    return kept
