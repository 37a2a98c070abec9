"""The per-prompt outcomes file: ``<output_dir>/prompt_outcomes.jsonl``, one line per eval set per round.

Its format is public (``docs/eval_history.md``, "The per-prompt outcomes file"); a round's line::

    {"step": 120, "epoch": 1, "time": 1764460800.5, "trigger": ["steps"], "dataset": "easy",
     "run_id": "k3j9x2a1", "num_prompts": 4, "outcomes": {"accuracy": [1.0, 0.25, 0.0, null]}}

``outcomes[<metric>][i]`` is the outcome of the set's sample ``i`` (a set's samples are indexed
0 .. num_prompts - 1); ``null`` where the round recorded none (or NaN). A resumed run first appends
``{"event": "resume", "step": N, ...}``: lines of later steps written before it belong to the session
that died and are superseded, as in the eval history (`drop_superseded`). It is written like the
eval history (`EvalHistory`: rank 0, appended, flushed and fsync'd, never rewritten, one line per
(eval set, step) of a run) and bounded: a round that would take it past ``max_bytes`` is not written.
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from areal_lightning.tracking.history import (
    DuplicateRoundWarning,
    EvalHistory,
    drop_superseded,
    eval_rows,
    read_history,
)
from areal_lightning.tracking.records import event_record

OUTCOMES_FILENAME = "prompt_outcomes.jsonl"
"""File name of the per-prompt outcomes inside a run's ``output_dir``."""
MIB = 1024 * 1024


def outcome_row(
    step: int,
    epoch: int,
    dataset: str,
    outcomes: Mapping[str, Mapping[int, float]],
    num_prompts: int,
    *,
    trigger: list[str],
    run_id: str | None,
    time: float | None = None,
) -> dict[str, Any]:
    """One eval set's line of a round: each metric's outcomes as a list by sample index.

    Example:
        >>> row = outcome_row(5, 0, "easy", {"accuracy": {1: 0.5, 0: 1.0}}, 3, trigger=["steps"], run_id="r")
        >>> row["num_prompts"], row["outcomes"]
        (3, {'accuracy': [1.0, 0.5, None]})
    """
    import time as _time

    lists = {}
    for name in sorted(outcomes):
        values: list[float | None] = [None] * num_prompts
        for i, v in outcomes[name].items():
            if 0 <= i < num_prompts and not math.isnan(v):
                values[i] = float(v)
        lists[name] = values
    return {
        "step": int(step),
        "epoch": int(epoch),
        "time": float(_time.time() if time is None else time),
        "trigger": list(trigger),
        "dataset": str(dataset),
        "run_id": run_id,
        "num_prompts": int(num_prompts),
        "outcomes": lists,
    }


class PromptOutcomesFile:
    """Rank 0's writer of ``prompt_outcomes.jsonl``.

    Args:
        path: the file.
        once_per_step: triggers whose rounds are written once per (eval set, step) (see `EvalHistory`).
        max_bytes: the most bytes the file may hold; a round that would pass it is not written
            (`append` returns False); None: no bound.
    """

    def __init__(self, path: str | Path, once_per_step: Collection[str], max_bytes: int | None) -> None:
        self.path = Path(path)
        self.max_bytes = max_bytes
        self._writer = EvalHistory(self.path, once_per_step=once_per_step)

    def append(self, rows: list[dict[str, Any]]) -> bool:
        """Appends a round's rows (one per eval set); False when the bound keeps them out."""
        if self.max_bytes is not None:
            size = self.path.stat().st_size if self.path.is_file() else 0
            added = sum(len(json.dumps(r, allow_nan=False)) + 1 for r in rows)
            if size + added > self.max_bytes:
                return False
        with warnings.catch_warnings():
            # The eval history already warns about a step a resumed run evaluated again.
            warnings.simplefilter("ignore", DuplicateRoundWarning)
            self._writer.append_many(rows)
        return True

    def resume(self, step: int, run_id: str | None) -> None:
        """Marks that the run went on from its checkpoint of `step`: later lines before this one are
        superseded. Call it before the first `append`."""
        message = f"resumed at step {step}; later lines written before this one are superseded"
        # Written by a writer of its own: the round writer reads which rounds the file holds on its
        # first append, and must read them with this line there (the rounds it supersedes are due again).
        EvalHistory(self.path).append(event_record("resume", step, run_id=run_id, message=message))


def read_prompt_outcomes(path_or_run_dir: str | Path, run_id: str | None = None) -> list[dict[str, Any]]:
    """The round lines of a per-prompt outcomes file, in order, without the lines a resume superseded.

    Args:
        path_or_run_dir: the ``prompt_outcomes.jsonl`` file or the run directory holding it.
        run_id: only this run's lines; None: the file's every run.

    Raises:
        FileNotFoundError: no such file (the message says what is accepted).

    Example:
        >>> read_prompt_outcomes("runs/arith-grpo/trial0")[0]["outcomes"]["accuracy"][:3]  # doctest: +SKIP
        [0.25, 0.0, 1.0]
    """
    path = Path(path_or_run_dir)
    path = path / OUTCOMES_FILENAME if path.is_dir() else path
    if not path.is_file():
        raise FileNotFoundError(
            f"no per-prompt outcomes at {str(path)!r}; pass a {OUTCOMES_FILENAME} file or a run directory "
            "(the run's output_dir) that holds one (written when evaluator.decisions.prompt_story is on)"
        )
    records = read_history(path)
    runs: dict[Any, list[dict[str, Any]]] = {}
    for record in records:
        runs.setdefault(record.get("run_id"), []).append(record)
    out = []
    for rid, rows in runs.items():
        if run_id is None or rid == run_id:
            out += eval_rows(drop_superseded(rows))
    return out
