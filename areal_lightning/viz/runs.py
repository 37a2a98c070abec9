"""The runs a plot draws, read from run directories' eval histories: one per ``run_id``, each
with its standalone evaluations (``areal-lightning evaluate --ckpt`` / ``--watch`` of its
checkpoints), which the figure marks on the run's own line instead of drawing another run."""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from areal_lightning.tracking.history import (
    HISTORY_FILENAME,
    drop_superseded,
    eval_rows,
    is_standalone,
    read_history,
    split_runs,
)

NOTE_MAX_STEPS = 5
"""Steps a note names before it says how many there are in all."""


class PlotError(ValueError):
    """Bad input to a plot: the message names what was wrong and what is accepted."""


class PlotNote(UserWarning):
    """What a figure shows that its lines alone do not say (a run's standalone evaluations); the
    CLI prints it as a note, `fit`'s own plot leaves it out."""


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
    ``"<name> [<run_id>]"`` per run. A run's records are its training rounds, less those a
    resumption superseded (`drop_superseded`), then its standalone evaluations (`is_standalone`,
    the same ``run_id``): they belong to the run and are never a run of their own.

    Example:
        >>> recs = [{"step": s, "dataset": "easy", "metrics": {}, "run_id": r} for r in ("a", "b") for s in (0, 5)]
        >>> list(runs_in_history("trial0", recs))
        ['trial0 [a]', 'trial0 [b]']
        >>> evaluate = {"step": 5, "dataset": "easy", "metrics": {}, "run_id": "a", "source": "standalone"}
        >>> list(runs_in_history("trial0", recs[:2] + [evaluate]))
        ['trial0']
    """
    found: dict[str, list[dict[str, Any]]] = {}
    for run_id, records_of_run in split_runs(records).items():
        training = drop_superseded([r for r in records_of_run if not is_standalone(r)])
        standalone = [r for r in records_of_run if is_standalone(r)]
        if eval_rows(training) or eval_rows(standalone):
            found[run_id] = training + standalone
    if len(found) == 1:
        return {name: next(iter(found.values()))}
    return {f"{name} [{key}]": run_records for key, run_records in found.items()}


def standalone_steps(records: Sequence[Mapping[str, Any]]) -> list[int]:
    """The steps of the checkpoints that standalone evaluations among `records` evaluated, sorted."""
    return sorted({int(r["step"]) for r in eval_rows(records) if is_standalone(r)})


def standalone_note(run: str, steps: Sequence[int]) -> str:
    """What a figure's rings are: run `run`'s standalone evaluations of its checkpoints at `steps`.

    Example:
        >>> standalone_note("trial0", [20])
        "run 'trial0' has standalone evaluations (areal-lightning evaluate) of its checkpoint at step 20: ..."
    """
    shown = ", ".join(str(s) for s in steps[:NOTE_MAX_STEPS])
    more = f", ... ({len(steps)} in all)" if len(steps) > NOTE_MAX_STEPS else ""
    where = f"its checkpoint at step {shown}" if len(steps) == 1 else f"its checkpoints at steps {shown}{more}"
    return (
        f"run {run!r} has standalone evaluations (areal-lightning evaluate) of {where}: "
        "rings on the run's line, not another run"
    )


def load_runs(run_dirs: Sequence[Path]) -> dict[str, list[dict[str, Any]]]:
    """The runs of every directory's history, by plot name (see `runs_in_history`). A directory
    that holds several runs is named in a `UserWarning`, a run's standalone evaluations in a
    `PlotNote` (the CLI prints both).

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
        for run, records in found.items():
            steps = standalone_steps(records)
            if steps:
                warnings.warn(standalone_note(run, steps), PlotNote, stacklevel=2)
        runs.update(found)
    return runs
