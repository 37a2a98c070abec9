"""The runs a plot draws: eval histories read from run directories, one named run per run id."""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from areal_lightning.tracking.history import HISTORY_FILENAME, drop_superseded, eval_rows, read_history, split_runs


class PlotError(ValueError):
    """Bad input to a plot: the message names what was wrong and what is accepted."""


def run_names(run_dirs: Sequence[Path]) -> list[str]:
    """A name per run dir: its name, or ``parent/name`` where names collide (else the path)."""
    names = [d.name for d in run_dirs]
    names = [f"{d.parent.name}/{d.name}" if names.count(n) > 1 else n for d, n in zip(run_dirs, names, strict=True)]
    return [str(d) if names.count(n) > 1 else n for d, n in zip(run_dirs, names, strict=True)]


def _load_run(run_dir: Path) -> list[dict[str, Any]]:
    accepted = f"pass the output_dir of a training run (it holds {HISTORY_FILENAME})"
    if not run_dir.exists():
        raise PlotError(f"run directory {str(run_dir)!r} does not exist; {accepted}")
    if not run_dir.is_dir():
        raise PlotError(f"{str(run_dir)!r} is not a directory; {accepted}")
    history = run_dir / HISTORY_FILENAME
    if not history.is_file():
        raise PlotError(f"run directory {str(run_dir)!r} has no {HISTORY_FILENAME}; {accepted}")
    try:
        records = read_history(history)
    except ValueError as err:
        raise PlotError(str(err)) from None
    if not eval_rows(records):
        raise PlotError(
            f"{str(history)!r} has no eval records (it is empty or holds only "
            "alerts / errors); a run appends one per eval set per eval round"
        )
    return records


def runs_in_history(name: str, records: Sequence[Mapping[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """The runs one history holds, by plot name: `name` alone when it holds one, else
    ``"<name> [<run_id>]"`` per run, and ``"<name> [<run_id> evaluate]"`` for a run's standalone
    evaluations. A run's records that a resumption superseded are left out (`drop_superseded`).

    Example:
        >>> recs = [{"step": s, "dataset": "easy", "metrics": {}, "run_id": r} for r in ("a", "b") for s in (0, 5)]
        >>> list(runs_in_history("trial0", recs))
        ['trial0 [a]', 'trial0 [b]']
    """
    found: dict[str, list[dict[str, Any]]] = {}
    for run_id, records_of_run in split_runs(records).items():
        standalone = [r for r in records_of_run if r.get("source") == "standalone"]
        training = drop_superseded([r for r in records_of_run if r.get("source") != "standalone"])
        if eval_rows(training):
            found[run_id] = training
        if eval_rows(standalone):
            found[f"{run_id} evaluate"] = standalone
    if len(found) == 1:
        return {name: next(iter(found.values()))}
    return {f"{name} [{key}]": run_records for key, run_records in found.items()}


def load_runs(run_dirs: Sequence[Path]) -> dict[str, list[dict[str, Any]]]:
    """The runs of every directory's history, by plot name (see `runs_in_history`); a directory
    that holds several runs is named in a `UserWarning` (the CLI prints it).

    Raises:
        PlotError: a directory is missing or has no eval records.
    """
    runs: dict[str, list[dict[str, Any]]] = {}
    for name, d in zip(run_names([d.resolve() for d in run_dirs]), run_dirs, strict=True):
        found = runs_in_history(name, _load_run(d))
        if len(found) > 1:
            warnings.warn(
                f"{str(d)!r} holds {len(found)} runs ({', '.join(found)}); each is drawn as its own line",
                UserWarning,
                stacklevel=2,
            )
        runs.update(found)
    return runs
