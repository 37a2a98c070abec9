"""A 2-rank DDP fit whose `evaluate_fn` raises on rank 1 only, launched the way users launch it.

Run as a script (never imported by pytest): ``python ddp_eval_fault.py ROOT ON_ERROR``. Lightning's
DDP strategy starts rank 1 by running this script again. Each rank writes ``rank<r>.raised`` (the
error it raised) or ``rank<r>.done`` (the steps it evaluated and its last global step) under ROOT.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the shared helpers

from callback_helpers import CountingModule, make_trainer, quiet

from areal_lightning.callbacks.evaluation_callback import EvaluationCallback
from areal_lightning.eval_round import EvalRoundError

FAILING_STEP = 2
MAX_STEPS = 4


def fails_on_rank_1(module: Any, batches: Any, ctx: Any) -> dict[str, float]:
    if ctx.rank == 1 and ctx.global_step == FAILING_STEP:
        raise RuntimeError(f"rank-1-only failure at step {ctx.global_step}")
    return {"w": float(module.w)}


def main(root: Path, on_error: str) -> None:
    quiet()
    callback = EvaluationCallback(
        {"probe": list(range(7))}, fails_on_rank_1, schedule={"freq_steps": 1}, rounds={"on_error": on_error}
    )
    trainer = make_trainer(root, [callback], MAX_STEPS, strategy="ddp", accelerator="cpu", devices=2)
    try:
        trainer.fit(CountingModule(epoch_len=8))
    except EvalRoundError as err:
        (root / f"rank{trainer.global_rank}.raised").write_text(str(err))
        raise
    (root / f"rank{trainer.global_rank}.done").write_text(json.dumps([callback.evaluated_steps, trainer.global_step]))


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
