"""The eval-time budget with a deliberately slow `evaluate_fn` on an injected clock: rounds are
deferred, the recorded share stays within the budget, the final round always runs."""

from __future__ import annotations

import itertools
import time
from pathlib import Path
from typing import Any

import lightning as L
import pytest
from callback_helpers import START_TIME, CountingModule, FakeClock, make_trainer
from lightning.pytorch.callbacks import Callback, ModelCheckpoint

from areal_lightning.callbacks import EvaluationCallback
from areal_lightning.callbacks.async_evaluator import AsyncEvaluator
from areal_lightning.errors import ArgumentError
from areal_lightning.eval_round import EvalBatch, EvalContext
from areal_lightning.tracking.history import drop_superseded, eval_rows, read_history

STEP_SECS = 1.0
EVAL_SECS = 5.0
BUDGET = 0.1
MAX_STEPS = 300


def _slow(clock: FakeClock) -> Any:
    def evaluate(module: Any, batches: list[EvalBatch], ctx: EvalContext) -> dict[str, float]:
        clock.advance(EVAL_SECS)
        return {"w": float(module.w)}

    return evaluate


def _fit(root: Path, budget: float | None) -> tuple[EvaluationCallback, list[dict[str, Any]]]:
    clock = FakeClock()
    cb = EvaluationCallback({"easy": [0, 1]}, _slow(clock), schedule={"freq_steps": 1, "budget": budget}, clock=clock)
    make_trainer(root, [cb], MAX_STEPS).fit(CountingModule(epoch_len=1000, clock=clock, step_secs=STEP_SECS))
    return cb, eval_rows(read_history(root))


def test_budget_defers_rounds_and_keeps_the_share(tmp_path: Path) -> None:
    cb, rows = _fit(tmp_path, BUDGET)
    steps = [r["step"] for r in rows]
    # The reference without budget: every step is a round, and evaluation takes 5/6 of the time.
    assert steps[0] == 1 and len(steps) < MAX_STEPS // 5
    assert cb.deferred_steps and set(cb.deferred_steps).isdisjoint(steps[:-1])
    # After the first round (which has nothing to estimate from), the recorded share never exceeds the budget.
    shares = [r["budget_share"] for r in rows]
    assert shares[0] > BUDGET and all(share <= BUDGET + 1e-9 for share in shares[1:-1])
    # The share recorded is the true one: eval seconds over wall seconds since training started.
    wall = steps[-1] * STEP_SECS + len(steps) * EVAL_SECS
    assert shares[-1] == pytest.approx(len(steps) * EVAL_SECS / wall)
    assert rows[-1]["step"] == MAX_STEPS and rows[-1]["trigger"] == ["end"]  # the final round is never deferred
    assert sum(r["deferred"] for r in rows) == len(cb.deferred_steps)
    # A deferred round runs as soon as the budget allows, not at the next multiple of freq_steps.
    assert len(steps) > 4
    for before, after in itertools.pairwise(steps[1:-1]):
        assert after - 1 in cb.deferred_steps and after - before > 1


def test_without_budget_every_step_is_evaluated(tmp_path: Path) -> None:
    cb, rows = _fit(tmp_path, None)
    assert [r["step"] for r in rows] == list(range(1, MAX_STEPS + 1)) and cb.deferred_steps == []


@pytest.mark.parametrize("bad", [0, 1.5, -0.1, True])
def test_bad_budget_is_refused(bad: Any) -> None:
    with pytest.raises(ArgumentError, match=r"budget=...\)` must be a share of wall time in \(0, 1\] or None"):
        EvaluationCallback({"easy": [0]}, lambda m, b, c: {}, schedule={"budget": bad})


ASYNC_ROUND_SECS = 0.2


def sleepy_round(module: Any, batches: list[EvalBatch], ctx: EvalContext) -> dict[str, float]:
    """An async round (in the worker process) that takes `ASYNC_ROUND_SECS` of real time."""
    time.sleep(ASYNC_ROUND_SECS)
    return {"w": float(module.w)}


@pytest.mark.process
def test_async_rounds_are_charged_what_training_waited_for(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # on_busy="wait" and a round due every step: each step waits for the previous round, so
    # evaluation holds training up most of the time, and the budget must defer rounds.
    cb = EvaluationCallback(
        {"easy": [0, 1]},
        sleepy_round,
        schedule={"freq_steps": 1, "budget": BUDGET, "eval_at_end": False},
        execution={"mode": "async", "on_busy": "wait"},
        clock=time.monotonic,
    )
    # On the callback's own clock: how long its hooks held training up, and how long training sat
    # in the collection of a round (the wait for the worker). What the budget is charged must lie
    # between the two: every wait charged, nothing charged that training did not wait for.
    held, waited = [0.0], [0.0]

    def timed(fn: Any, total: list[float]) -> Any:
        def run(*args: Any, **kwargs: Any) -> Any:
            start = time.monotonic()
            try:
                return fn(*args, **kwargs)
            finally:
                total[0] += time.monotonic() - start

        return run

    for name in dir(Callback):  # the hooks inside training (starting and stopping the worker is not)
        if name.startswith(("on_train_", "on_before_", "on_after_", "on_validation_")):
            setattr(cb, name, timed(getattr(cb, name), held))
    monkeypatch.setattr(AsyncEvaluator, "collect", timed(AsyncEvaluator.collect, waited))
    make_trainer(tmp_path, [cb], 40).fit(CountingModule(epoch_len=1000))
    rows = eval_rows(read_history(tmp_path))
    assert {r["mode"] for r in rows} == {"async"} and all("budget_share" in r for r in rows)
    assert rows[0]["budget_share"] > BUDGET  # the first round waited for the worker to start
    assert cb.deferred_steps and len(rows) < 20
    assert sum(r["deferred"] for r in rows) <= len(cb.deferred_steps)
    charged = cb.state_dict()["budget"]["eval_secs"]
    assert waited[0] > 0 and waited[0] <= charged <= held[0]


def test_a_resumed_callback_keeps_the_time_its_budget_has_spent(tmp_path: Path) -> None:
    cb, rows = _fit(tmp_path, BUDGET)
    saved = cb.state_dict()["budget"]
    assert saved["eval_secs"] == EVAL_SECS * len(rows)  # every round charged its 5 s
    resumed = EvaluationCallback({"easy": [0, 1]}, _slow(FakeClock()), schedule={"freq_steps": 1, "budget": BUDGET})
    resumed.load_state_dict(cb.state_dict())
    assert resumed.state_dict()["budget"] == saved  # a resume does not forget evaluation time spent


class _Crash(RuntimeError):
    pass


class _CrashAtStep(Callback):
    """Stands for a crash once `step` optimizer steps are done (their checkpoint written)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        if trainer.global_step == self.step:
            raise _Crash(f"crashed after step {self.step}")


RESUME_BUDGET = 0.4  # a round every few steps
RESUME_MAX_STEPS = 60
CHECKPOINT_STEP = 25
CRASH_STEP = 28  # after the checkpoint, before the round of step 30
DOWNTIME_SECS = 1e5


def _budget_fit(root: Path, clock: FakeClock, *callbacks: Callback, ckpt_path: Path | None = None) -> None:
    cb = EvaluationCallback(
        {"easy": [0, 1]}, _slow(clock), schedule={"freq_steps": 1, "budget": RESUME_BUDGET}, clock=clock
    )
    module = CountingModule(epoch_len=1000, clock=clock, step_secs=STEP_SECS)
    make_trainer(root, [cb, *callbacks], RESUME_MAX_STEPS).fit(module, ckpt_path=ckpt_path)


def test_a_resumed_run_keeps_its_budget(tmp_path: Path) -> None:
    """Crashed after step 28, resumed from step 25 after a long downtime: the resumed session defers
    and records exactly what the uninterrupted run did after step 25 (eval and wall seconds came
    back from the checkpoint, the downtime does not count)."""
    _budget_fit(tmp_path / "a", FakeClock())
    uninterrupted = eval_rows(read_history(tmp_path / "a"))

    run = tmp_path / "b"
    checkpoints = ModelCheckpoint(
        dirpath=run / "ckpt", filename="step{step}", auto_insert_metric_name=False, every_n_train_steps=CHECKPOINT_STEP
    )
    with pytest.raises(_Crash):
        _budget_fit(run, FakeClock(), checkpoints, _CrashAtStep(CRASH_STEP))
    clock = FakeClock(START_TIME + DOWNTIME_SECS)
    _budget_fit(run, clock, ckpt_path=run / "ckpt" / f"step{CHECKPOINT_STEP}.ckpt")
    resumed = eval_rows(drop_superseded(read_history(run)))

    def rounds(rows: list[dict[str, Any]]) -> list[tuple[int, int]]:
        return [(r["step"], r["deferred"]) for r in rows if r["step"] > CHECKPOINT_STEP]

    def shares(rows: list[dict[str, Any]]) -> list[float]:
        return [r["budget_share"] for r in rows if r["step"] > CHECKPOINT_STEP]

    assert len(rounds(uninterrupted)) > 3  # some rounds, and deferred steps between them
    assert rounds(resumed) == rounds(uninterrupted)
    assert shares(resumed) == pytest.approx(shares(uninterrupted))
