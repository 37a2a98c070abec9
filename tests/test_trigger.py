"""HybridTrigger driven the way the training loop drives it, with a fake clock (no sleeping)."""

from __future__ import annotations

import copy
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

import pytest

from areal_lightning.callbacks.trigger import (
    Cause,
    HybridTrigger,
)

STEP_SECS = 1.0  # training time of one optimizer step on the fake clock
EVAL_SECS = 0.5  # an evaluation's duration: must never count as training time
DOWNTIME_SECS = 1e6  # between a kill and the resume: must never count either


class FakeClock:
    """A clock the test advances by hand."""

    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, secs: float) -> None:
        self.now += secs


@dataclass
class Run:
    evaluations: list[tuple[int, list[str]]] = field(default_factory=list)
    checkpoint: dict[str, Any] | None = None


def drive(
    trigger: HybridTrigger,
    clock: FakeClock,
    *,
    batches_per_epoch: int,
    max_steps: int,
    first_step: int = 1,
    step_secs: float = STEP_SECS,
    eval_secs: float = EVAL_SECS,
    known_length: bool = True,
    checkpoint_at: int | None = None,
    killed_after: int | None = None,
) -> Run:
    """Simulate `Trainer.fit` with the evaluation callback; every epoch has `batches_per_epoch` steps.

    The checkpoint is taken at the end of step `checkpoint_at`, after the callback's `after_step`
    (Lightning runs ModelCheckpoint after the other callbacks). A run `killed_after` a step stops
    there: no `at_end`, and whatever followed the checkpoint is lost.
    """
    run = Run()

    def evaluate(step: int, causes: list[str]) -> None:
        if causes:
            clock.advance(eval_secs)
            trigger.mark_evaluated(step)
            run.evaluations.append((step, causes))

    trigger.start()
    evaluate(first_step - 1, trigger.before_train(first_step - 1))
    for step in range(first_step, max_steps + 1):
        epoch, batch = divmod(step - 1, batches_per_epoch)
        ends_epoch = batch == batches_per_epoch - 1
        clock.advance(step_secs)
        evaluate(step, trigger.after_step(step, epoch, ends_epoch and known_length))
        if step == checkpoint_at:
            # Through JSON: the state must be plain values that survive a checkpoint file.
            run.checkpoint = json.loads(json.dumps(trigger.state_dict()))
        if ends_epoch:
            evaluate(step, trigger.after_epoch(step, epoch))
        if step == killed_after:
            return run
    evaluate(max_steps, trigger.at_end(max_steps))
    trigger.stop()
    return run


def fit(config: dict[str, Any], **loop: Any) -> list[tuple[int, list[str]]]:
    clock = FakeClock()
    return drive(HybridTrigger(**config, clock=clock), clock, **loop).evaluations


# ------------------------------------------------------------------ uninterrupted runs


@pytest.mark.parametrize(("max_steps", "freq_steps"), [(23, 5), (25, 5), (7, 1), (4, 5)])
def test_steps_only_evaluates_at_multiples_and_at_end_without_duplicate(max_steps: int, freq_steps: int) -> None:
    expected = [(s, [Cause.STEPS]) for s in range(1, max_steps + 1) if s % freq_steps == 0]
    if max_steps % freq_steps != 0:
        expected.append((max_steps, [Cause.END]))
    assert fit({"freq_steps": freq_steps}, batches_per_epoch=3, max_steps=max_steps) == expected


@pytest.mark.parametrize("known_length", [True, False])
def test_epochs_only_evaluates_at_the_end_of_every_nth_epoch(known_length: bool) -> None:
    batches, freq_epochs, epochs = 4, 2, 5
    expected = [((e + 1) * batches, [Cause.EPOCHS]) for e in range(epochs) if (e + 1) % freq_epochs == 0]
    expected.append((epochs * batches, [Cause.END]))
    got = fit(
        {"freq_epochs": freq_epochs}, batches_per_epoch=batches, max_steps=epochs * batches, known_length=known_length
    )
    assert got == expected


@pytest.mark.parametrize(("step_secs", "freq_secs"), [(1.5, 4.0), (1.0, 3), (2.0, 1.0)])
def test_secs_only_counts_training_time_not_evaluation_time(step_secs: float, freq_secs: float) -> None:
    steps_per_eval = math.ceil(freq_secs / step_secs)  # evaluation time (100 s here) never counts
    expected = [(s, [Cause.SECS]) for s in range(1, 31) if s % steps_per_eval == 0]
    got = fit(
        {"freq_secs": freq_secs, "eval_at_end": False},
        batches_per_epoch=7,
        max_steps=30,
        step_secs=step_secs,
        eval_secs=100.0,
    )
    assert got == expected


def test_mixed_triggers_reset_the_time_trigger_and_merge_a_coinciding_step() -> None:
    config = {"freq_steps": 4, "freq_epochs": 1, "freq_secs": 3, "eval_before_train": True}
    # Derived by hand: epochs end at 10 and 20; the time trigger restarts after every evaluation.
    expected = [
        (0, [Cause.BEFORE_TRAIN]),
        (3, [Cause.SECS]),
        (4, [Cause.STEPS]),
        (7, [Cause.SECS]),
        (8, [Cause.STEPS]),
        (10, [Cause.EPOCHS]),
        (12, [Cause.STEPS]),
        (15, [Cause.SECS]),
        (16, [Cause.STEPS]),
        (19, [Cause.SECS]),
        (20, [Cause.STEPS, Cause.EPOCHS]),  # once, both causes; no "end" duplicate at the last step
    ]
    assert fit(config, batches_per_epoch=10, max_steps=20) == expected


def test_all_causes_at_one_step_come_in_fixed_order() -> None:
    got = fit({"freq_steps": 2, "freq_epochs": 1, "freq_secs": 2}, batches_per_epoch=2, max_steps=2)
    assert got == [(2, [Cause.STEPS, Cause.EPOCHS, Cause.SECS])]


def test_unknown_length_loader_coinciding_step_and_epoch_evaluates_once() -> None:
    # The step trigger fires at the epoch's last step (8); the epoch fallback must not add a second
    # evaluation there, nor make it up at the next step.
    got = fit(
        {"freq_steps": 4, "freq_epochs": 1, "eval_at_end": False}, batches_per_epoch=8, max_steps=16, known_length=False
    )
    assert got == [(4, [Cause.STEPS]), (8, [Cause.STEPS]), (12, [Cause.STEPS]), (16, [Cause.STEPS])]


def test_before_train_and_end_only() -> None:
    got = fit({"eval_before_train": True}, batches_per_epoch=3, max_steps=5)
    assert got == [(0, [Cause.BEFORE_TRAIN]), (5, [Cause.END])]
    assert fit({}, batches_per_epoch=3, max_steps=5) == [(5, [Cause.END])]
    assert fit({"freq_steps": 2, "eval_at_end": False}, batches_per_epoch=3, max_steps=5) == [
        (2, [Cause.STEPS]),
        (4, [Cause.STEPS]),
    ]


def test_a_due_cause_stays_due_until_marked() -> None:
    clock = FakeClock()
    trigger = HybridTrigger(freq_steps=5, clock=clock)
    trigger.start()
    for step in range(1, 5):
        assert trigger.after_step(step, 0, False) == []
    assert trigger.after_step(5, 0, False) == [Cause.STEPS]
    assert trigger.after_step(6, 0, False) == [Cause.STEPS]  # nobody evaluated: still due
    trigger.mark_evaluated(6)
    assert trigger.last_evaluated_step == 6
    assert [trigger.after_step(s, 0, False) for s in (7, 8, 9, 10)] == [[], [], [], [Cause.STEPS]]


# ------------------------------------------------------------------ save, kill, resume

RESUME_CONFIGS = {
    "steps": {"freq_steps": 5},
    "epochs": {"freq_epochs": 2},
    "secs": {"freq_secs": 3.5, "eval_at_end": False},
    "mixed": {"freq_steps": 6, "freq_epochs": 1, "freq_secs": 2.5, "eval_before_train": True},
}
BATCHES, MAX_STEPS = 4, 26


@pytest.mark.parametrize("name", RESUME_CONFIGS)
@pytest.mark.parametrize("checkpoint_at", [1, 3, 4, 5, 7, 8, 10, 12, 25])
@pytest.mark.parametrize("lost_steps", [0, 1, 4])
def test_resume_evaluates_exactly_what_an_uninterrupted_run_does(
    name: str, checkpoint_at: int, lost_steps: int
) -> None:
    config = RESUME_CONFIGS[name]
    reference = fit(config, batches_per_epoch=BATCHES, max_steps=MAX_STEPS)

    clock = FakeClock()
    killed_after = min(checkpoint_at + lost_steps, MAX_STEPS)
    first = drive(
        HybridTrigger(**config, clock=clock),
        clock,
        batches_per_epoch=BATCHES,
        max_steps=MAX_STEPS,
        checkpoint_at=checkpoint_at,
        killed_after=killed_after,
    )
    assert first.checkpoint is not None
    evaluated_by_then = [s for s, _ in first.evaluations if s <= checkpoint_at]
    assert first.checkpoint["last_evaluated_step"] == (evaluated_by_then[-1] if evaluated_by_then else None)
    clock.advance(DOWNTIME_SECS)
    resumed_trigger = HybridTrigger(**config, clock=clock)  # a new process: a new trigger
    resumed_trigger.load_state_dict(first.checkpoint)
    second = drive(resumed_trigger, clock, batches_per_epoch=BATCHES, max_steps=MAX_STEPS, first_step=checkpoint_at + 1)

    kept = [e for e in first.evaluations if e[0] <= checkpoint_at]
    assert kept + second.evaluations == reference  # no step twice, none skipped, same causes
    steps_seen = {s for s, _ in first.evaluations} | {s for s, _ in second.evaluations}
    assert steps_seen == {s for s, _ in reference}


def test_checkpoint_right_after_an_evaluation_does_not_evaluate_that_step_again() -> None:
    clock = FakeClock()
    first = drive(
        HybridTrigger(freq_steps=5, eval_before_train=True, clock=clock),
        clock,
        batches_per_epoch=5,
        max_steps=10,
        checkpoint_at=10,
        killed_after=10,
    )
    assert first.evaluations == [(0, [Cause.BEFORE_TRAIN]), (5, [Cause.STEPS]), (10, [Cause.STEPS])]
    resumed = HybridTrigger(freq_steps=5, eval_before_train=True, clock=clock)
    resumed.load_state_dict(first.checkpoint or {})
    resumed.start()
    assert resumed.last_evaluated_step == 10
    assert resumed.before_train(10) == []
    assert resumed.at_end(10) == []


def test_resume_between_multiples_evaluates_at_the_next_multiple() -> None:
    clock = FakeClock()
    first = drive(
        HybridTrigger(freq_steps=5, clock=clock),
        clock,
        batches_per_epoch=100,
        max_steps=20,
        checkpoint_at=7,
        killed_after=7,
    )
    resumed = HybridTrigger(freq_steps=5, clock=clock)
    resumed.load_state_dict(first.checkpoint or {})
    second = drive(resumed, clock, batches_per_epoch=100, max_steps=12, first_step=8)
    assert second.evaluations == [(10, [Cause.STEPS]), (12, [Cause.END])]


def test_downtime_does_not_count_but_training_time_before_the_kill_does() -> None:
    clock = FakeClock()
    trigger = HybridTrigger(freq_secs=4.0, clock=clock)
    trigger.start()
    clock.advance(1.5)
    assert trigger.after_step(1, 0, False) == []
    clock.advance(1.0)
    assert trigger.training_secs_since_eval() == 2.5
    checkpoint = trigger.state_dict()  # mid-run: the running interval is included
    assert checkpoint["training_secs_since_eval"] == 2.5

    clock.advance(DOWNTIME_SECS)
    resumed = HybridTrigger(freq_secs=4.0, clock=clock)
    resumed.load_state_dict(checkpoint)
    clock.advance(DOWNTIME_SECS)  # restoring, sanity checks: not training yet
    assert resumed.training_secs_since_eval() == 2.5
    resumed.start()
    clock.advance(1.0)
    assert resumed.after_step(2, 0, False) == []  # 3.5 s of training: the downtime did not fire it
    clock.advance(1.0)
    assert resumed.after_step(3, 0, False) == [Cause.SECS]  # 4.5 s: the 2.5 s before the kill count


def test_stop_pauses_the_training_clock_and_start_twice_keeps_it() -> None:
    clock = FakeClock()
    trigger = HybridTrigger(freq_secs=10, clock=clock)
    assert trigger.training_secs_since_eval() == 0.0
    clock.advance(50.0)  # before start(): not training
    trigger.start()
    clock.advance(2.0)
    trigger.start()
    clock.advance(1.0)
    trigger.stop()
    trigger.stop()
    clock.advance(50.0)
    assert trigger.training_secs_since_eval() == 3.0
    trigger.start()
    clock.advance(7.0)
    assert trigger.after_step(1, 0, False) == [Cause.SECS]
    clock.advance(3.0)  # the evaluation itself
    trigger.mark_evaluated(1)
    assert trigger.training_secs_since_eval() == 0.0


def test_missed_step_evaluation_is_made_up_at_the_next_step() -> None:
    # Last evaluated 5, resumed at step 12 (the checkpoint came from another configuration):
    # step 10 was due and is made up after step 13, then the multiples go on.
    trigger = HybridTrigger(freq_steps=5, clock=FakeClock())
    trigger.load_state_dict({"last_evaluated_step": 5, "training_started": True})
    trigger.start()
    assert trigger.before_train(12) == []
    assert trigger.after_step(13, 0, False) == [Cause.STEPS]
    trigger.mark_evaluated(13)
    assert [trigger.after_step(s, 0, False) for s in (14, 15)] == [[], [Cause.STEPS]]
    trigger.mark_evaluated(15)
    assert [trigger.after_step(s, 0, False) for s in (16, 19, 20)] == [[], [], [Cause.STEPS]]


def test_missed_epoch_evaluation_is_made_up_at_the_next_step() -> None:
    # Last evaluated in epoch 0, resumed in epoch 3: the end of epoch 1 (2 epochs done) was due.
    trigger = HybridTrigger(freq_epochs=2, clock=FakeClock())
    trigger.load_state_dict({"last_evaluated_step": 2, "epochs_done_at_last_eval": 0})
    trigger.start()
    assert trigger.after_step(13, 3, False) == [Cause.EPOCHS]
    trigger.mark_evaluated(13)
    assert trigger.after_step(14, 3, False) == []
    assert trigger.after_step(16, 3, True) == [Cause.EPOCHS]


def test_a_later_evaluation_covers_a_due_step_of_another_frequency() -> None:
    # The old run evaluated every 3 steps (last: 9); resumed with freq_steps=5, the next is 10.
    trigger = HybridTrigger(freq_steps=5, clock=FakeClock())
    trigger.load_state_dict({"last_evaluated_step": 9})
    trigger.start()
    assert trigger.after_step(10, 0, False) == [Cause.STEPS]


def test_load_state_dict_tolerates_missing_and_unknown_keys() -> None:
    clock = FakeClock()
    trigger = HybridTrigger(freq_steps=2, freq_secs=5, eval_before_train=True, clock=clock)
    trigger.start()
    clock.advance(3.0)
    trigger.mark_evaluated(4)
    clock.advance(2.0)
    trigger.load_state_dict({"from_a_future_version": 1})  # everything missing: a fresh trigger
    assert trigger.last_evaluated_step is None
    assert trigger.training_secs_since_eval() == 0.0  # loaded while running: counts from the load
    assert trigger.before_train(0) == [Cause.BEFORE_TRAIN]
    clock.advance(1.0)
    assert trigger.state_dict() == {
        "last_evaluated_step": None,
        "epochs_done_at_last_eval": 0,
        "training_secs_since_eval": 1.0,
        "training_started": True,
    }
    fresh = HybridTrigger(freq_steps=2, clock=clock)
    fresh.load_state_dict(copy.deepcopy(trigger.state_dict()))
    assert fresh.state_dict() == trigger.state_dict()


def test_describe_and_repr_say_which_triggers_are_on() -> None:
    trigger = HybridTrigger(freq_epochs=1, freq_steps=500, freq_secs=3600, eval_before_train=True)
    assert trigger.describe() == (
        "evaluate before training, every 500 steps, every epoch, every 3600 s of training time, at the end"
    )
    assert HybridTrigger(freq_epochs=2, freq_steps=1, eval_at_end=False).describe() == (
        "evaluate every step, every 2 epochs"
    )
    assert repr(trigger) == (
        "HybridTrigger(freq_epochs=1, freq_steps=500, freq_secs=3600.0, eval_before_train=True, eval_at_end=True)"
    )
    assert (trigger.freq_epochs, trigger.freq_steps, trigger.freq_secs) == (1, 500, 3600.0)
    assert (trigger.eval_before_train, trigger.eval_at_end) == (True, True)


# ------------------------------------------------------------------ errors


@pytest.mark.parametrize("name", ["freq_steps", "freq_epochs"])
@pytest.mark.parametrize("bad", [-5, 0, 2.5, 2.0, True, "5"])
def test_rejects_a_frequency_that_is_not_a_positive_integer(name: str, bad: Any) -> None:
    message = f"`HybridTrigger({name}=...)` must be a positive integer or None, got {bad!r}"
    with pytest.raises(ValueError, match=re.escape(message)):
        HybridTrigger(**{name: bad})


@pytest.mark.parametrize("bad", [0, -1.5, float("nan"), float("inf"), True, "60"])
def test_rejects_freq_secs_that_is_not_a_positive_finite_number(bad: Any) -> None:
    message = "`HybridTrigger(freq_secs=...)` must be a positive finite number of seconds or None,"
    message += f" got {bad!r}"
    with pytest.raises(ValueError, match=re.escape(message)):
        HybridTrigger(freq_secs=bad)


@pytest.mark.parametrize("name", ["eval_before_train", "eval_at_end"])
def test_rejects_a_flag_that_is_not_a_bool(name: str) -> None:
    message = f"`HybridTrigger({name}=...)` must be True or False, got 'yes'"
    with pytest.raises(ValueError, match=re.escape(message)):
        HybridTrigger(freq_steps=1, **{name: "yes"})


def test_rejects_a_clock_that_is_not_callable() -> None:
    message = "`HybridTrigger(clock=...)` must be a callable returning seconds, got 0.0"
    with pytest.raises(ValueError, match=re.escape(message)):
        HybridTrigger(clock=0.0)  # type: ignore[arg-type]


def test_a_trigger_that_would_never_evaluate_is_a_configuration_error() -> None:
    message = (
        r"would never evaluate: freq_epochs, freq_steps and freq_secs are all None"
        r" and eval_before_train and eval_at_end are False"
    )
    with pytest.raises(ValueError, match=message):
        HybridTrigger(eval_at_end=False)


def test_after_step_before_start_is_an_error() -> None:
    trigger = HybridTrigger(freq_steps=1, clock=FakeClock())
    with pytest.raises(RuntimeError, match=r"after_step\(\)` was called while the training clock is stopped"):
        trigger.after_step(1, 0, False)
    trigger.start()
    trigger.stop()
    with pytest.raises(RuntimeError, match=r"call start\(\) when training \(re\)starts"):
        trigger.after_step(1, 0, False)


def test_load_state_dict_reads_missing_keys_as_a_fresh_trigger() -> None:
    clock = FakeClock()
    trigger = HybridTrigger(freq_steps=5, eval_before_train=True, clock=clock)
    trigger.load_state_dict({})  # an old checkpoint without our state: as if nothing happened yet
    trigger.start()
    assert trigger.before_train(0) == [Cause.BEFORE_TRAIN]
    trigger.mark_evaluated(0)
    assert [trigger.after_step(s, 0, False) for s in (4, 5)] == [[], [Cause.STEPS]]
