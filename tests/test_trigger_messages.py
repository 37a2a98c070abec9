"""What a user reads from HybridTrigger: its whole error messages, the error's fields, printed causes."""

from __future__ import annotations

import pytest

from areal_lightning.app.config import ConfigError, load_config
from areal_lightning.callbacks.trigger import Cause, HybridTrigger
from areal_lightning.errors import ArgumentError

NEVER_EVALUATES = (
    "would never evaluate: freq_epochs, freq_steps and freq_secs are all None and eval_before_train and"
    " eval_at_end are False; set at least one of them"
)


def test_a_trigger_that_never_evaluates_is_refused_with_the_whole_message_and_its_fields() -> None:
    with pytest.raises(ArgumentError) as info:
        HybridTrigger(freq_steps=None, eval_before_train=False, eval_at_end=False)
    err = info.value
    assert str(err) == f"`HybridTrigger(...)` {NEVER_EVALUATES}"
    # The fields a caller (the app's config) rewords the error from: no single argument is wrong.
    assert (err.owner, err.arg, err.value) == ("HybridTrigger", "", None)
    assert err.accepted == NEVER_EVALUATES  # worded once: the config spells None and False as YAML does


def test_the_config_words_a_trigger_that_never_evaluates_in_its_own_keys() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, ["eval_sets.easy.size=4", "evaluator.freq_steps=null", "evaluator.eval_at_end=false"])
    assert str(info.value).endswith(
        "evaluator would never evaluate: freq_epochs, freq_steps and freq_secs are all null and"
        " eval_before_train and eval_at_end are false; set at least one of them"
    )


def test_a_step_on_a_stopped_clock_names_the_call_and_the_fix() -> None:
    trigger = HybridTrigger(freq_steps=1)
    with pytest.raises(RuntimeError) as info:
        trigger.after_step(1, epoch=0, last_batch_of_epoch=False)
    assert str(info.value) == (
        "`HybridTrigger.after_step()` was called while the training clock is stopped: call"
        " start() when training (re)starts, so that the time trigger counts training time."
    )


def test_causes_print_as_their_history_values() -> None:
    # A list of causes (what `after_step` returns) prints the way the eval history stores it.
    assert repr([Cause.STEPS, Cause.END]) == "['steps', 'end']"
    assert str(Cause.BEFORE_TRAIN) == "before_train"


def test_a_fresh_trigger_checkpoints_plain_values_under_the_format_keys() -> None:
    # The keys and value types are the checkpoint format: old checkpoints are read back by them.
    state = HybridTrigger(freq_steps=2, clock=lambda: 0.0).state_dict()
    assert state == {
        "last_evaluated_step": None,
        "epochs_done_at_last_eval": 0,
        "training_secs_since_eval": 0.0,
        "training_started": False,
    }
    assert state["training_started"] is False
