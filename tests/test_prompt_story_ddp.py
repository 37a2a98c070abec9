"""The prompt story and the noise-aware best rule are the same numbers on 1, 2 and 3 ranks.

The same fit runs in one process and under Lightning's DDP on 2 and 3 CPU processes (gloo), an eval set
of 13 prompts in batches of 3 (the ranks hold different prompts, and different numbers of them),
with outcomes whose sums depend on the order of addition in their last bits. Every story metric,
every best value under ``best_rule: paired`` and ``lcb``, and every line of ``prompt_outcomes.jsonl``
must be bit for bit the same.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from callback_helpers import QUIET_WARNINGS, CountingModule, make_trainer, quiet
from ddp_utils import run_ddp
from story_helpers import BATCH, PROMPTS, share

from areal_lightning.callbacks import EvaluationCallback
from areal_lightning.eval_round import EvalBatch, EvalContext, EvalSet
from areal_lightning.tracking.history import eval_rows, read_history
from areal_lightning.tracking.prompt_outcomes import read_prompt_outcomes

pytestmark = [pytest.mark.ddp, *(pytest.mark.filterwarnings(w) for w in QUIET_WARNINGS)]

SAMPLES_PER_EPOCH = 8
TIMEOUT_S = 120.0
WATCHED = ("accuracy/", "reward/mean/", "pass@4/gap")


def _outcome(index: int, step: int) -> float:
    """Not a multiple of a power of two: a sum of these rounds differently in a different order."""
    return share(index, step) * 0.9 + 0.1 * ((index * 7) % 10) / 9


def _evaluate(module: Any, batches: list[EvalBatch], ctx: EvalContext) -> dict[str, Any]:
    values = []
    for batch in batches:
        outcomes = [_outcome(i, ctx.global_step) for i in batch.indices]
        ctx.record_outcomes("accuracy", batch.indices, outcomes)
        ctx.record_outcomes("reward/mean", batch.indices, [v * v for v in outcomes])
        values += outcomes
    t = torch.tensor(values, dtype=torch.float64)
    return {"accuracy": t, "reward/mean": t * t, "pass@1": t, "pass@4": (t > 0.3).double()}


def _fit(rank: int, world_size: int, root: str) -> None:
    quiet()
    for rule in ("paired", "lcb"):
        callback = EvaluationCallback(
            [EvalSet("easy", list(range(PROMPTS)), batch_size=BATCH)],
            _evaluate,
            schedule={"freq_steps": 2, "eval_before_train": True},
            decisions={"best_rule": rule, "best_confidence": 0.6},
        )
        options: dict[str, Any] = {"strategy": "ddp", "devices": world_size} if world_size > 1 else {}
        trainer = make_trainer(Path(root) / rule, [callback], 8, **options)
        trainer.fit(CountingModule(epoch_len=SAMPLES_PER_EPOCH))


def _watched(run_dir: Path) -> list[tuple[int, dict[str, float | None]]]:
    rows = eval_rows(read_history(run_dir))
    return [(r["step"], {k: v for k, v in r["metrics"].items() if k.startswith(WATCHED)}) for r in rows]


def test_story_and_selection_are_bit_identical_on_one_two_and_three_ranks(tmp_path: Path) -> None:
    one = tmp_path / "one"
    _fit(0, 1, str(one))
    for world_size in (2, 3):  # 13 prompts in 5 batches: dealt unevenly to 2 and to 3 ranks
        many = tmp_path / f"ranks{world_size}"
        run_ddp(_fit, world_size, str(many), timeout_s=TIMEOUT_S)
        for rule in ("paired", "lcb"):
            alone, shared = _watched(one / rule), _watched(many / rule)
            assert [s for s, _ in alone] == [0, 2, 4, 6, 8]
            assert json.dumps(alone) == json.dumps(shared), world_size  # bit for bit (NaN written alike)
            names = {n for _, m in alone for n in m}
            assert {"accuracy/gained", "accuracy/bucket/medium", "pass@4/gap", "accuracy/best_step"} <= names
            lines = [(r["step"], r["outcomes"]) for r in read_prompt_outcomes(one / rule)]
            assert lines == [(r["step"], r["outcomes"]) for r in read_prompt_outcomes(many / rule)], world_size
            assert lines[1][1]["accuracy"] == [_outcome(i, 2) for i in range(PROMPTS)]
