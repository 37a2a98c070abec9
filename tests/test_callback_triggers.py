"""`EvaluationCallback` on a real Lightning `Trainer`: which steps get evaluated, and why.

The steps are read back from ``<output_dir>/eval_history.jsonl`` and compared with a schedule
counted by hand from the documented rules (`reference_schedule`); ``w`` in each record proves the
evaluation saw the weights after exactly that many optimizer steps.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import torch
from callback_helpers import (
    QUIET_WARNINGS,
    CountingModule,
    FakeClock,
    grouped,
    history_steps,
    make_trainer,
    metric_by_step,
    probe_weights,
    reference_schedule,
    state_copy,
)

from areal_lightning.callbacks.evaluation_callback import EvaluationCallback
from areal_lightning.tracking.history import eval_rows, read_history

pytestmark = [pytest.mark.filterwarnings(w) for w in QUIET_WARNINGS]

STEP_SECS = 0.75  # fake training seconds per step; exact in binary, so sums are exact too
EVAL_SET = {"probe": [1, 2, 3]}

# (name, callback triggers, samples per epoch, max_steps, Trainer kwargs, epoch length in optimizer steps)
CASES: list[tuple[str, dict[str, Any], int, int, dict[str, Any], int]] = [
    ("steps, max_steps not a multiple", {"freq_steps": 3}, 4, 10, {}, 4),
    ("steps, max_steps a multiple: no duplicate at the end", {"freq_steps": 3}, 4, 9, {}, 4),
    ("steps, no end", {"freq_steps": 4, "eval_at_end": False}, 5, 11, {}, 5),
    ("epochs, max_steps mid-epoch", {"freq_epochs": 1}, 4, 10, {}, 4),
    ("every 2nd epoch, no end", {"freq_epochs": 2, "eval_at_end": False}, 3, 13, {}, 3),
    ("epochs, stopped by max_epochs", {"freq_epochs": 1}, 4, -1, {"max_epochs": 2}, 4),
    ("epochs, limit_train_batches", {"freq_epochs": 1}, 5, 8, {"limit_train_batches": 3}, 3),
    ("secs", {"freq_secs": 2.5}, 5, 10, {}, 5),
    ("secs, no end", {"freq_secs": 2.0, "eval_at_end": False}, 5, 11, {}, 5),
    ("mixed", {"freq_steps": 4, "freq_epochs": 1, "freq_secs": 2.0, "eval_before_train": True}, 5, 13, {}, 5),
    ("mixed, gradient accumulation", {"freq_steps": 2, "freq_epochs": 1}, 6, 7, {"accumulate_grad_batches": 2}, 3),
    ("before train and end only", {"eval_before_train": True}, 4, 6, {}, 4),
]


@pytest.mark.parametrize(
    ("triggers", "samples", "max_steps", "trainer_kwargs", "epoch_len"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_evaluates_exactly_at_the_expected_steps_for_the_expected_causes(
    tmp_path: Path,
    triggers: dict[str, Any],
    samples: int,
    max_steps: int,
    trainer_kwargs: dict[str, Any],
    epoch_len: int,
) -> None:
    clock = FakeClock()
    module = CountingModule(epoch_len=samples, clock=clock, step_secs=STEP_SECS)
    callback = EvaluationCallback(EVAL_SET, probe_weights, **grouped(clock=clock, **triggers))
    trainer = make_trainer(tmp_path, [callback], max_steps, **trainer_kwargs)
    trainer.fit(module)

    last_step = trainer.global_step
    expected = reference_schedule(last_step, epoch_len, step_secs=STEP_SECS, **triggers)
    assert last_step == (max_steps if max_steps > 0 else trainer_kwargs["max_epochs"] * epoch_len)
    assert history_steps(tmp_path) == expected
    assert callback.evaluated_steps == [step for step, _ in expected]
    # Each evaluation saw the weights after exactly `step` optimizer steps.
    assert metric_by_step(tmp_path, "w") == [(step, float(step)) for step, _ in expected]


def test_eval_before_train_evaluates_the_initial_weights_before_the_first_optimizer_step(tmp_path: Path) -> None:
    module = CountingModule(epoch_len=4)
    initial = state_copy(module)
    seen: list[tuple[int, dict[str, torch.Tensor], bool]] = []

    def snapshot(m: CountingModule, batches: Any, ctx: Any) -> dict[str, float]:
        if not ctx.sanity:  # the sanity pass, before the first round, runs on the initial weights too
            seen.append((ctx.global_step, state_copy(m), m.training))
        return {"w": float(m.w)}

    make_trainer(
        tmp_path, [EvaluationCallback(EVAL_SET, snapshot, schedule={"freq_steps": 2, "eval_before_train": True})], 4
    ).fit(module)

    assert [step for step, _, _ in seen] == [0, 2, 4]
    step0_weights = seen[0][1]
    assert step0_weights.keys() == initial.keys()
    for name, tensor in initial.items():
        assert torch.equal(step0_weights[name], tensor), name
    assert not torch.equal(seen[1][1]["layer.weight"], initial["layer.weight"])  # training did move them
    assert [training for _, _, training in seen] == [False, False, False]  # evaluated in eval() mode
    assert module.training  # and train mode came back
    records = eval_rows(read_history(tmp_path))
    assert (records[0]["step"], records[0]["trigger"], records[0]["metrics"]["w"]) == (0, ["before_train"], 0.0)


def test_history_records_carry_the_documented_fields(tmp_path: Path) -> None:
    module = CountingModule(epoch_len=4)
    eval_sets = {"small": [1.0, 2.0, 3.0], "large": [10.0, 20.0, 30.0, 40.0, 50.0]}
    started = time.perf_counter()
    make_trainer(tmp_path, [EvaluationCallback(eval_sets, probe_weights, schedule={"freq_steps": 3})], 3).fit(module)
    elapsed = time.perf_counter() - started

    events = [r for r in read_history(tmp_path) if "event" in r]  # the fit-start integrity check: prompts distinct
    assert [(r["event"], r["check"], r["status"], r["dataset"]) for r in events] == [
        ("integrity", "duplicates", "ok", "small"),
        ("integrity", "duplicates", "ok", "large"),
    ]
    records = [r for r in read_history(tmp_path) if "event" not in r]
    assert [(r["step"], r["dataset"]) for r in records] == [(3, "small"), (3, "large")]
    for record, samples in zip(records, eval_sets.values(), strict=True):
        assert record["trigger"] == ["steps", "end"]  # the last step: the end fired too
        assert (record["num_prompts"], record["num_samples"]) == (len(samples), len(samples))
        assert (record["mode"], record["world_size"], record["epoch"]) == ("sync", 1, 0)
        assert record["metrics"]["sample_value"] == pytest.approx(sum(samples) / len(samples))
        assert 0.0 < record["eval_secs"] < elapsed  # seconds of this round, within the run
