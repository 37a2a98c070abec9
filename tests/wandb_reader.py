"""Read an offline (or any local) W&B run back: history rows, config, axes, tables, alerts.

wandb 0.31 offers no Python reader for its ``.wandb`` transaction log, but its CLI prints the
log as JSON lines: ``wandb leet inspect --json FILE``. We run that (the ``wandb`` executable next
to ``sys.executable``, else ``python -m wandb``) and turn the records into plain Python.

What the records look like (one JSON object a line, ``"type"`` says which payload key is set)::

    {"num": 2, "type": "run", "run": {"config": {"update": {...}}, "project": "p", "run_id": ...}}
    {"num": 9, "type": "metric", "metric": {"name": "eval/step", "options": {"defined": true}}}
    {"num": 10, "type": "metric",
     "metric": {"glob_name": "eval/*", "step_metric": "eval/step", ...}}
    {"num": 13, "type": "history", "history": {"item": {"_step": 0, "train/loss": 1, ...},
                                               "step": {"num": 0}}}
    {"num": 13, "type": "alert", "alert": {"title": ..., "text": ..., "level": "INFO"}}
    {"num": 36, "type": "exit", "exit": {"exit_code": 0}}

Conventions of the decoded rows (wandb's own, kept so names match the W&B UI):

* a logged nested dict appears flattened with dots: ``{"a": {"b": 1}}`` -> ``"a.b": 1``;
* non-finite floats are stored as the strings ``"NaN"``, ``"Infinity"``, ``"-Infinity"``; we
  turn them back into floats (a logged *string* ``"NaN"`` would come back as a float too);
* a media value (e.g. a ``wandb.Table``) is stored as ``"<key>._type"``, ``"<key>.path"``, ...;
  we gather those into one dict under ``<key>``, e.g. ``row["eval/samples"]["_type"] ==
  "table-file"``; :func:`read_wandb_tables` loads the table contents.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

WANDB_INSPECT_TIMEOUT_S = 120.0
"""Upper bound on one ``wandb leet inspect`` call (it takes about a second for a small run)."""

RUN_DIR_PATTERNS = ("offline-run-*", "run-*")
"""Directory names wandb gives a run inside its ``wandb/`` directory."""

_NON_FINITE = {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}
_RUN_DIR_TIME = re.compile(r"run-(\d{8}_\d{6})-")
_TABLE_TYPE = "table-file"


class WandbReadError(RuntimeError):
    """``wandb leet inspect`` failed or printed something that is not its JSON records."""


@dataclass(frozen=True)
class WandbTable:
    """One logged ``wandb.Table``: the history key, the ``_step`` it was logged at, its contents."""

    key: str
    step: int
    columns: list[str]
    data: list[list[Any]]
    path: Path

    def rows(self) -> list[dict[str, Any]]:
        """The table as a list of ``{column: value}`` dicts."""
        return [dict(zip(self.columns, row, strict=True)) for row in self.data]


def _run_dir_sort_key(run_dir: Path) -> tuple[str, float]:
    """Newest last: the start time wandb puts in the name, then the log's modification time."""
    match = _RUN_DIR_TIME.search(run_dir.name)
    logs = list(run_dir.glob("*.wandb"))
    mtime = max((p.stat().st_mtime for p in logs), default=0.0)
    return (match.group(1) if match else "", mtime)


def find_wandb_file(path: str | Path) -> Path:
    """Resolve ``path`` to one ``.wandb`` transaction log.

    Args:
        path: a ``.wandb`` file; a run directory (``offline-run-*``) holding one; a ``wandb/``
            directory of runs; or a directory containing ``wandb/`` (e.g. the run's output_dir).
            Where several runs are found, the newest (by start time in the name) is used.

    Raises:
        FileNotFoundError: the path does not exist or holds no W&B run.
    """
    given = Path(path)
    accepted = (
        "a .wandb file, an offline-run-* directory, a wandb/ directory, or a directory containing wandb/offline-run-*"
    )
    if not given.exists():
        raise FileNotFoundError(f"read_wandb_run(path={str(path)!r}) does not exist; pass {accepted}")
    if given.is_file():
        if given.suffix != ".wandb":
            raise FileNotFoundError(f"read_wandb_run(path={str(path)!r}) is not a .wandb file; pass {accepted}")
        return given
    logs = sorted(given.glob("*.wandb"), key=lambda p: p.stat().st_mtime)
    if logs:
        return logs[-1]
    run_dirs = [
        d
        for pattern in RUN_DIR_PATTERNS
        for base in (given, given / "wandb")
        for d in base.glob(pattern)
        if d.is_dir() and any(d.glob("*.wandb"))
    ]
    if not run_dirs:
        raise FileNotFoundError(f"no W&B run found under {str(path)!r}; pass {accepted}")
    newest = max(set(run_dirs), key=_run_dir_sort_key)
    return max(newest.glob("*.wandb"), key=lambda p: p.stat().st_mtime)


def _wandb_command() -> list[str]:
    """The wandb CLI of this interpreter's environment (a venv's ``bin/wandb``), else ``-m``."""
    exe = Path(sys.executable).parent / "wandb"
    return [str(exe)] if exe.is_file() else [sys.executable, "-m", "wandb"]


def read_wandb_records(path: str | Path) -> list[dict[str, Any]]:
    """Every record of a run's transaction log, as ``wandb leet inspect --json`` prints them.

    Args:
        path: see :func:`find_wandb_file`.

    Raises:
        FileNotFoundError: no run at ``path``.
        WandbReadError: the wandb CLI failed (message carries its stderr) or printed non-JSON.

    Example:
        >>> records = read_wandb_records("runs/demo")  # doctest: +SKIP
        >>> {r["type"] for r in records} >= {"run", "history"}  # doctest: +SKIP
        True
    """
    log = find_wandb_file(path)
    command = [*_wandb_command(), "leet", "inspect", "--json", str(log)]
    try:
        # The CLI writes its debug log (debug-cli.<user>.log) to the temporary directory: one of its own.
        with tempfile.TemporaryDirectory(prefix="wandb-cli-") as temp:
            done = subprocess.run(
                command, capture_output=True, text=True, timeout=WANDB_INSPECT_TIMEOUT_S, check=False,
                env=dict(os.environ, TMPDIR=temp),
            )  # fmt: skip
    except subprocess.TimeoutExpired as err:
        raise WandbReadError(f"`{' '.join(command)}` did not finish within {WANDB_INSPECT_TIMEOUT_S:.0f} s") from err
    if done.returncode != 0:
        try:
            version = metadata.version("wandb")
        except metadata.PackageNotFoundError:
            version = "not installed"
        raise WandbReadError(
            f"`{' '.join(command)}` failed with exit status {done.returncode} (wandb {version}; "
            f"reading runs needs a wandb with `wandb leet inspect --json`): {done.stderr.strip()}"
        )
    records = []
    for line_no, line in enumerate(done.stdout.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as err:
            raise WandbReadError(
                f"`wandb leet inspect --json {log}` printed a non-JSON line {line_no}: {line[:200]!r} ({err.msg})"
            ) from None
    return records


def _payloads(records: Iterable[Mapping[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [r[kind] for r in records if r.get("type") == kind and isinstance(r.get(kind), dict)]


def _decode(value: Any) -> Any:
    return _NON_FINITE.get(value, value) if isinstance(value, str) else value


def _gather_media(item: Mapping[str, Any]) -> dict[str, Any]:
    """Decode non-finite floats and regroup ``"<key>._type"``-style media fields under ``<key>``."""
    media_keys = [k[: -len("._type")] for k in item if k.endswith("._type")]
    row: dict[str, Any] = {}
    for key, value in item.items():
        owner = next((m for m in media_keys if key.startswith(m + ".")), None)
        if owner is None:
            row[key] = _decode(value)
        else:
            row.setdefault(owner, {})[key[len(owner) + 1 :]] = value
    return row


def wandb_history(records: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The logged history rows, in order; each has ``_step`` (and ``_timestamp``, ``_runtime``)."""
    rows = []
    for history in _payloads(records, "history"):
        row = _gather_media(history.get("item", {}))
        row.setdefault("_step", int(history.get("step", {}).get("num", 0)))
        rows.append(row)
    return rows


def read_wandb_run(path: str | Path) -> list[dict[str, Any]]:
    """The history rows of a local W&B run: one dict per ``run.log`` call, with ``_step``.

    Args:
        path: a ``.wandb`` file, an ``offline-run-*`` dir, or a dir holding ``wandb/offline-run-*``.

    Raises:
        FileNotFoundError: no run at ``path``.
        WandbReadError: the wandb CLI could not read it.

    Example:
        >>> rows = read_wandb_run("runs/arith-grpo/trial0")  # doctest: +SKIP
        >>> [(r["eval/step"], r["eval/easy/accuracy"])  # doctest: +SKIP
        ...  for r in rows if "eval/step" in r]
        [(0, 0.05), (100, 0.8)]
    """
    return wandb_history(read_wandb_records(path))


def wandb_config(records: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The run's config: ``wandb.init(config=...)`` merged with later ``config.update`` calls
    (wandb's internal ``_wandb`` entry left out)."""
    config: dict[str, Any] = {}
    records = list(records)
    payloads = [run.get("config", {}) for run in _payloads(records, "run")]
    for payload in payloads + _payloads(records, "config"):
        config.update(payload.get("update", {}))
        for removed in payload.get("remove", []):
            config.pop(removed if isinstance(removed, str) else removed.get("key", ""), None)
    config.pop("_wandb", None)
    return config


def wandb_summary(records: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The run summary (last value of each key unless set explicitly), non-finite floats decoded."""
    summary: dict[str, Any] = {}
    for payload in _payloads(records, "summary"):
        summary.update(_gather_media(payload.get("update", {})))
    return summary


def wandb_metric_definitions(records: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``run.define_metric`` calls as ``{"name": ..., "glob": bool, "step_metric": str | None,
    "options": {...}}``, in call order (a glob like ``"eval/*"`` has ``glob=True``)."""
    definitions = []
    for metric in _payloads(records, "metric"):
        glob = "glob_name" in metric
        definitions.append(
            {
                "name": metric["glob_name"] if glob else metric.get("name", ""),
                "glob": glob,
                "step_metric": metric.get("step_metric") or None,
                "options": dict(metric.get("options", {})),
            }
        )
    return definitions


def wandb_step_metric(definitions: Iterable[Mapping[str, Any]], key: str) -> str | None:
    """The x axis W&B plots ``key`` against (``None``: the default ``_step``); later
    ``define_metric`` calls win, an exact name beats a glob."""
    definitions = list(definitions)
    exact = [d for d in definitions if not d["glob"] and d["name"] == key]
    globbed = [d for d in definitions if d["glob"] and fnmatch.fnmatchcase(key, d["name"])]
    for candidates in (exact, globbed):
        axes = [d["step_metric"] for d in candidates if d["step_metric"] is not None]
        # The axis itself may match its own glob ("eval/step" in "eval/*"): it has no axis.
        if axes and axes[-1] != key:
            return axes[-1]
    return None


def wandb_alerts(records: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``run.alert`` calls: ``{"title", "text", "level", ...}`` in order."""
    return [dict(a) for a in _payloads(records, "alert")]


def read_wandb_tables(path: str | Path, key: str | None = None) -> list[WandbTable]:
    """Every ``wandb.Table`` logged in a local run (optionally only under ``key``), in log order.

    Raises:
        FileNotFoundError: no run at ``path``, or a table file the log names is missing.
        WandbReadError: the wandb CLI could not read the run.
    """
    log = find_wandb_file(path)
    files_dir = log.parent / "files"
    tables = []
    for row in wandb_history(read_wandb_records(log)):
        for name, value in row.items():
            if not (isinstance(value, dict) and value.get("_type") == _TABLE_TYPE):
                continue
            if key is not None and name != key:
                continue
            table_path = files_dir / value["path"]
            if not table_path.is_file():
                raise FileNotFoundError(f"table {name!r} at _step {row['_step']} names {table_path}, which is missing")
            content = json.loads(table_path.read_text(encoding="utf-8"))
            tables.append(
                WandbTable(
                    key=name,
                    step=int(row["_step"]),
                    columns=list(content["columns"]),
                    data=[list(r) for r in content["data"]],
                    path=table_path,
                )
            )
    return tables


def run_sessions(path: str | Path, run_id: str) -> list[Path]:
    """The ``.wandb`` files of every session of run `run_id` under `path` (a run's output_dir or
    its ``wandb/`` directory), oldest first: each ``fit`` (first, resumed) writes its own
    ``offline-run-<time>-<run_id>`` directory.

    Raises:
        FileNotFoundError: no session of `run_id` there.
    """
    given = Path(path)
    bases = [given, given / "wandb"]
    dirs = {d for base in bases for p in RUN_DIR_PATTERNS for d in base.glob(f"{p}-{run_id}") if d.is_dir()}
    logs = [max(d.glob("*.wandb"), key=lambda p: p.stat().st_mtime) for d in dirs if any(d.glob("*.wandb"))]
    if not logs:
        raise FileNotFoundError(f"no W&B session of run {run_id!r} under {str(path)!r}")
    return sorted(logs, key=lambda log: _run_dir_sort_key(log.parent))


def branch_point(records: Iterable[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The run record's ``branch_point`` (``{"run", "metric", "value"}``) of a session started with
    ``resume_from`` or ``fork_from``, else None."""
    runs = _payloads(records, "run")
    return dict(runs[0]["branch_point"]) if runs and runs[0].get("branch_point") else None


def rewound_history(sessions: Iterable[Iterable[Mapping[str, Any]]]) -> list[dict[str, Any]]:
    """The history of one run as W&B holds it once its sessions are synced in order: a session that
    rewinds the run (``resume_from="<id>?_step=N"``, its ``branch_point``) first drops the rows
    after ``_step`` N (W&B's documented rewind: the history is truncated at the rewind point), then
    its own rows follow.

    Args:
        sessions: each session's records (`read_wandb_records`), oldest first.
    """
    rows: list[dict[str, Any]] = []
    for records in sessions:
        records = list(records)
        point = branch_point(records)
        if point is not None and point.get("metric", "_step") == "_step":
            rows = [r for r in rows if r["_step"] <= point["value"]]
        rows += wandb_history(records)
    return rows
