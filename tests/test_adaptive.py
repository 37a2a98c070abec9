"""Adaptive frequency: the pure rule, then a real Trainer on a scripted metric that first moves and
then stays flat: the interval shortens, then lengthens; every change is recorded; it survives a resume."""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import pytest
from callback_helpers import CountingModule, history_steps, make_trainer
from lightning.pytorch.callbacks import Callback, ModelCheckpoint

from areal_lightning.callbacks import EvaluationCallback
from areal_lightning.callbacks.adaptive import AdaptiveSchedule, next_interval
from areal_lightning.callbacks.runners import AsyncRunner
from areal_lightning.errors import ArgumentError
from areal_lightning.eval_round import EvalBatch, EvalContext
from areal_lightning.tracking.history import event_rows, read_history

PROMPTS = 20
MOVING_UNTIL = 30  # the scripted accuracy grows until this step, then stays flat
MIN_STEPS, MAX_STEPS, START = 2, 16, 8
MAX_TRAIN_STEPS = 60


def test_rule_shrinks_on_movement_grows_on_stillness_and_stays_in_bounds() -> None:
    assert [next_interval(8, True, 2, 16), next_interval(8, False, 2, 16), next_interval(8, None, 2, 16)] == [4, 16, 8]
    assert next_interval(3, True, 2, 16) == 2 and next_interval(2, True, 2, 16) == 2
    assert next_interval(12, False, 2, 16) == 16 and next_interval(16, False, 2, 16) == 16


def test_bad_bounds_are_refused_with_their_names() -> None:
    with pytest.raises(ArgumentError, match="min_steps must be at most max_steps"):
        AdaptiveSchedule("accuracy", 10, 5)
    with pytest.raises(ArgumentError, match=r"factor=...\)` must be a finite number above 1, got 1"):
        AdaptiveSchedule("accuracy", 1, 5, factor=1)


def _accuracy(index: int, step: int) -> float:
    return random.Random(index).random() + 0.01 * min(step, MOVING_UNTIL)


def _scripted(module: Any, batches: list[EvalBatch], ctx: EvalContext) -> dict[str, float]:
    values = []
    for batch in batches:
        outcomes = [_accuracy(i, ctx.global_step) for i in batch.indices]
        ctx.record_outcomes("accuracy", batch.indices, outcomes)
        values += outcomes
    return {"accuracy": sum(values) / len(values)}


def _reference(max_steps: int) -> tuple[list[int], list[tuple[int, int, int]]]:
    """Rounds and interval changes by the documented rule: moved = the metric changed at all
    (this script has no noise, so any change lies outside its zero-width interval)."""
    steps, changes, interval, last = [], [], START, 0
    for step in range(1, max_steps + 1):
        if step >= last + interval or step == max_steps:
            moved = None if not steps else _accuracy(0, step) != _accuracy(0, steps[-1])
            new = next_interval(interval, moved, MIN_STEPS, MAX_STEPS)
            if new != interval:
                changes.append((step, interval, new))
            steps.append(step)
            interval, last = new, step
    return steps, changes


def _callback(mode: str = "sync") -> EvaluationCallback:
    return EvaluationCallback(
        {"easy": list(range(PROMPTS))},
        _scripted,
        schedule={
            "adaptive": {"metric": "accuracy", "min_steps": MIN_STEPS, "max_steps": MAX_STEPS, "start_steps": START}
        },
        execution={"mode": mode},
    )


class KeepPace(Callback):
    """Holds each training step until the async round in flight has finished: its result is then
    merged one step after its snapshot, as on a machine where evaluation keeps pace with training,
    which makes the schedule predictable."""

    def __init__(self, callback: EvaluationCallback) -> None:
        self.callback = callback

    def on_train_batch_end(self, *args: Any) -> None:
        runner, deadline = self.callback.runner, time.monotonic() + 60
        assert isinstance(runner, AsyncRunner)
        evaluator = runner.evaluator
        while evaluator.in_flight is not None and not evaluator.ready():
            assert time.monotonic() < deadline, "the async round never finished"
            time.sleep(0.002)


def test_interval_shortens_while_the_metric_moves_and_lengthens_when_flat(tmp_path: Path) -> None:
    make_trainer(tmp_path, [_callback()], MAX_TRAIN_STEPS).fit(CountingModule(epoch_len=100))
    steps, changes = _reference(MAX_TRAIN_STEPS)
    assert [s for s, _ in history_steps(tmp_path)] == steps
    events = event_rows(read_history(tmp_path), "adaptive")
    assert [(e["step"], e["old_interval"], e["new_interval"]) for e in events] == changes
    news = [e["new_interval"] for e in events]
    assert news[:2] == [4, 2] and news[-1] == MAX_STEPS  # shorter while moving, longer once flat
    causes = [c for _, c in history_steps(tmp_path)]
    assert steps[-1] == MAX_TRAIN_STEPS  # the end fell on an adaptive round: one round, both causes
    assert causes == [["adaptive"]] * (len(steps) - 1) + [["adaptive", "end"]]


@pytest.mark.process
def test_async_results_drive_the_schedule_as_sync_ones_do(tmp_path: Path) -> None:
    callback = _callback("async")
    make_trainer(tmp_path, [KeepPace(callback), callback], MAX_TRAIN_STEPS).fit(CountingModule(epoch_len=100))
    steps, changes = _reference(MAX_TRAIN_STEPS)
    assert [s for s, _ in history_steps(tmp_path)] == steps
    events = event_rows(read_history(tmp_path), "adaptive")
    assert [(e["step"], e["old_interval"], e["new_interval"]) for e in events] == changes
    assert event_rows(read_history(tmp_path), "skipped") == []  # no adaptive round while one is in flight


def test_adaptive_composes_with_freq_steps(tmp_path: Path) -> None:
    cb = EvaluationCallback(
        {"easy": list(range(PROMPTS))},
        _scripted,
        schedule={
            "freq_steps": 5,
            "eval_at_end": False,
            "adaptive": {"metric": "accuracy", "min_steps": 3, "max_steps": 3},
        },
    )
    make_trainer(tmp_path, [cb], 12).fit(CountingModule(epoch_len=100))
    # Either fires (OR); the adaptive interval counts from the last round of any cause: 3, then
    # freq_steps at 5, adaptive 3 steps later at 8, freq_steps at 10, and 13 lies past the end.
    assert history_steps(tmp_path) == [(3, ["adaptive"]), (5, ["steps"]), (8, ["adaptive"]), (10, ["steps"])]


def test_the_schedule_survives_a_resume(tmp_path: Path) -> None:
    ckpt = ModelCheckpoint(
        dirpath=tmp_path / "checkpoints",
        filename="step{step}",
        auto_insert_metric_name=False,
        every_n_train_steps=26,
        save_top_k=-1,
    )
    first = _callback()
    make_trainer(tmp_path, [first, ckpt], 26).fit(CountingModule(epoch_len=100))
    saved = first.adaptive_schedule.state_dict()
    resumed = _callback()
    make_trainer(tmp_path, [resumed], 40).fit(
        CountingModule(epoch_len=100), ckpt_path=tmp_path / "checkpoints" / "step26.ckpt"
    )
    steps = [s for s, _ in history_steps(tmp_path)]
    after = [s for s in steps if s > 26]
    assert saved["interval"] == MIN_STEPS  # still moving at step 26
    assert after[0] == saved["last_step"] + saved["interval"]  # not START steps after the resume
