"""What an evaluation notes in words (`EvalContext.note`: the servers' weight version) is in its
round's record, under ``notes``; a round that notes nothing has no ``notes``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from callback_helpers import QUIET_WARNINGS, CountingModule, make_trainer, probe_weights

from areal_lightning.callbacks.evaluation_callback import EvaluationCallback
from areal_lightning.tracking.history import eval_rows, read_history

pytestmark = [pytest.mark.filterwarnings(w) for w in QUIET_WARNINGS]


def notes_its_weights(module: Any, batches: Any, ctx: Any) -> dict[str, Any]:
    if ctx.dataset == "noted":
        ctx.note("engine/weight_version", f"step-{ctx.global_step}-w{float(module.w):g}")
    return probe_weights(module, batches, ctx)


def test_a_rounds_notes_are_in_its_record(tmp_path: Path) -> None:
    callback = EvaluationCallback(
        {"noted": [1, 2, 3], "plain": [4, 5]}, notes_its_weights, schedule={"freq_steps": 2, "eval_at_end": False}
    )
    make_trainer(tmp_path, [callback], 4).fit(CountingModule(epoch_len=5))
    rows = eval_rows(read_history(tmp_path))
    noted = [(r["step"], r["notes"]) for r in rows if r["dataset"] == "noted"]
    assert noted == [(2, {"engine/weight_version": "step-2-w2"}), (4, {"engine/weight_version": "step-4-w4"})]
    assert all("notes" not in r for r in rows if r["dataset"] == "plain")
