"""Kill and resume: a run resumed from a mid-run checkpoint evaluates what an uninterrupted run does.

Run A trains uninterrupted. Run B saves a checkpoint every few steps, is killed (an exception
after some step, as a crash would stop it: no end-of-training hooks), and a new Trainer resumes
from the latest checkpoint into the same ``output_dir``. The eval history is append-only, so the
evaluations of steps trained after the checkpoint and lost in the kill appear twice: once from
the killed run and once from the resumed one, with identical metrics (same weights). Nothing else
may repeat, and nothing may be missing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L
import pytest
from callback_helpers import (
    QUIET_WARNINGS,
    START_TIME,
    CountingModule,
    FakeClock,
    grouped,
    history_steps,
    make_trainer,
    metric_by_step,
    probe_weights,
    reference_schedule,
)
from lightning.pytorch.callbacks import Callback, ModelCheckpoint

from areal_lightning.callbacks.evaluation_callback import EvaluationCallback
from areal_lightning.tracking.history import event_rows, read_history

pytestmark = [pytest.mark.filterwarnings(w) for w in QUIET_WARNINGS]

STEP_SECS = 0.75
EPOCH_LEN = 4
MAX_STEPS = 19
CHECKPOINT_EVERY = 5
DOWNTIME_SECS = 1e6  # clock time between the kill and the resume: must not count as training time
# Every trigger at once, so that each one's resume state is exercised.
TRIGGERS: dict[str, Any] = {"freq_steps": 6, "freq_epochs": 2, "freq_secs": 2.0, "eval_before_train": True}
EVAL_SET = {"probe": [1, 2, 3]}


class Killed(RuntimeError):
    """Stands for a crash of the training process."""


class KillAfterStep(Callback):
    """Raises once `step` optimizer steps are done and every hook of that step has run (checkpoint included)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        if trainer.global_step == self.step:
            raise Killed(f"killed after step {self.step}")


def _callback(clock: FakeClock, **kwargs: Any) -> EvaluationCallback:
    return EvaluationCallback(EVAL_SET, probe_weights, **grouped(clock=clock, **{**TRIGGERS, **kwargs}))


def _fit(
    run_dir: Path, *, kill_after: int | None = None, ckpt_path: Path | None = None, clock_start: float = START_TIME
) -> None:
    clock = FakeClock(clock_start)
    callbacks: list[Callback] = [_callback(clock)]
    if kill_after is not None:
        callbacks.append(KillAfterStep(kill_after))
        callbacks.append(
            ModelCheckpoint(
                dirpath=run_dir / "checkpoints",
                filename="step{step}",
                auto_insert_metric_name=False,
                every_n_train_steps=CHECKPOINT_EVERY,
                save_top_k=-1,
            )
        )
    trainer = make_trainer(run_dir, callbacks, MAX_STEPS)
    trainer.fit(CountingModule(epoch_len=EPOCH_LEN, clock=clock, step_secs=STEP_SECS), ckpt_path=ckpt_path)


@pytest.mark.parametrize(
    "kill_after",
    [15, 13],
    ids=["killed right after an evaluation and a checkpoint", "killed 3 steps after the checkpoint, mid-epoch"],
)
def test_resumed_run_evaluates_the_steps_of_the_uninterrupted_run(tmp_path: Path, kill_after: int) -> None:
    _fit(tmp_path / "a")
    expected = reference_schedule(MAX_STEPS, EPOCH_LEN, step_secs=STEP_SECS, **TRIGGERS)
    uninterrupted = history_steps(tmp_path / "a")
    assert uninterrupted == expected

    run_b = tmp_path / "b"
    with pytest.raises(Killed):
        _fit(run_b, kill_after=kill_after)
    killed_part = history_steps(run_b)
    checkpoint_step = kill_after - kill_after % CHECKPOINT_EVERY
    _fit(run_b, ckpt_path=run_b / "checkpoints" / f"step{checkpoint_step}.ckpt", clock_start=START_TIME + DOWNTIME_SECS)
    resumed_part = history_steps(run_b)[len(killed_part) :]

    assert killed_part == [e for e in uninterrupted if e[0] <= kill_after]
    # Same steps and causes (the time trigger kept its count, downtime excluded): nothing evaluated
    # before the kill repeats (no second before_train; the steps re-trained after the checkpoint
    # are evaluated again but not recorded twice), nothing is missing (the end included).
    assert resumed_part == [e for e in uninterrupted if e[0] > kill_after]
    assert killed_part + resumed_part == uninterrupted
    # The re-trained steps' weights equal the lost ones: every record says w == step.
    assert all(w == step for step, w in metric_by_step(run_b, "w"))


def _scripted_score(module: CountingModule, batches: Any, ctx: Any) -> dict[str, float]:
    """Accuracy 0.9 up to step 2, then 0.5: an alert is due at step 4."""
    return {"accuracy": 0.9 if ctx.global_step <= 2 else 0.5}


def test_threshold_state_survives_a_resume(tmp_path: Path) -> None:
    def callback() -> EvaluationCallback:
        return EvaluationCallback(
            EVAL_SET, _scripted_score, schedule={"freq_steps": 2}, decisions={"metric_thresholds": {"accuracy": 0.7}}
        )

    ckpt = ModelCheckpoint(
        dirpath=tmp_path / "checkpoints",
        filename="step{step}",
        auto_insert_metric_name=False,
        every_n_train_steps=3,
        save_top_k=-1,
    )
    with pytest.raises(Killed):
        make_trainer(tmp_path, [callback(), KillAfterStep(3), ckpt], 6).fit(CountingModule())
    assert event_rows(read_history(tmp_path), "alert") == []  # reached 0.9 at step 2: armed, no alert yet

    make_trainer(tmp_path, [callback()], 6).fit(CountingModule(), ckpt_path=tmp_path / "checkpoints" / "step3.ckpt")
    alerts = event_rows(read_history(tmp_path), "alert")
    # The armed state came back from the checkpoint: the drop at step 4 alerts, and only once.
    assert [(a["step"], a["metric"], a["value"], a["threshold"]) for a in alerts] == [(4, "accuracy", 0.5, 0.7)]


def test_load_state_dict_tolerates_missing_keys() -> None:
    callback = EvaluationCallback(EVAL_SET, probe_weights, schedule={"freq_steps": 2})
    callback.load_state_dict({})
    assert callback.trigger.last_evaluated_step is None
    saved = {"trigger": {"last_evaluated_step": 4}}
    callback.load_state_dict(saved)
    assert callback.trigger.last_evaluated_step == 4
    assert callback.state_dict()["trigger"]["last_evaluated_step"] == 4
