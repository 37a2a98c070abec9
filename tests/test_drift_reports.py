"""The drift check as a user meets it: which eval set changed, how (content, strata), the message
they read, one report per change (a second change is reported again), and what a resume keeps."""

from __future__ import annotations

from areal_lightning.eval_round import EvalSet
from areal_lightning.eval_round.eval_set_drift import DriftMonitor, drift_message, eval_set_summary
from areal_lightning.eval_round.fingerprint import eval_set_fingerprint


def _set(name: str, strata: list[str], first: int = 0) -> EvalSet:
    return EvalSet(name, [{"q": first + i, "stratum": s} for i, s in enumerate(strata)])


def test_the_summary_counts_each_stratum_in_name_order_beside_the_fingerprint() -> None:
    eval_set = _set("easy", ["b", "a", "b", "c"])
    assert eval_set_summary(eval_set) == {
        "fingerprint": eval_set_fingerprint(eval_set),
        "strata": {"a": 1, "b": 2, "c": 1},
    }
    assert list(eval_set_summary(eval_set)["strata"]) == ["a", "b", "c"]


def test_the_message_names_the_set_and_each_thing_that_changed() -> None:
    before = {"fingerprint": "f1", "strata": {"a": 2}}
    assert drift_message("easy", before, {"fingerprint": "f1", "strata": {"a": 2}}) is None
    assert drift_message("easy", before, {"fingerprint": "f2", "strata": {"a": 2}}) == (
        "eval set 'easy' changed during the run (fingerprint f1 -> f2): its metrics before and after"
        " this point are not comparable"
    )
    assert drift_message("easy", before, {"fingerprint": "f1", "strata": {"a": 1, "b": 1}}) == (
        "eval set 'easy' changed during the run (strata {'a': 2} -> {'a': 1, 'b': 1}): its metrics before"
        " and after this point are not comparable"
    )
    assert drift_message("easy", before, {"fingerprint": "f2", "strata": {"a": 3}}) == (
        "eval set 'easy' changed during the run (fingerprint f1 -> f2; strata {'a': 2} -> {'a': 3}): its"
        " metrics before and after this point are not comparable"
    )


def test_a_summary_without_strata_compares_as_no_strata() -> None:
    # A checkpoint written before strata were summarised: only the fingerprint can differ.
    assert drift_message("easy", {"fingerprint": "f1"}, {"fingerprint": "f1", "strata": {}}) is None
    assert "strata {} -> {'a': 1}" in (
        drift_message("easy", {"fingerprint": "f1"}, {"fingerprint": "f1", "strata": {"a": 1}}) or ""
    )


def test_each_change_is_reported_once_and_a_second_change_again() -> None:
    monitor = DriftMonitor()
    hard = _set("hard", ["x"])
    assert monitor.check([_set("easy", ["a", "a"]), hard]) == {}  # first sight: the reference
    assert monitor.check([_set("easy", ["a", "a"]), hard]) == {}
    changed = monitor.check([_set("easy", ["a", "b"]), hard])
    assert list(changed) == ["easy"] and "strata {'a': 2} -> {'a': 1, 'b': 1}" in changed["easy"]
    assert monitor.check([_set("easy", ["a", "b"]), hard]) == {}  # the same change: not again
    again = monitor.check([_set("easy", ["a", "b"], first=10), hard])  # new content, same strata
    assert list(again) == ["easy"] and "fingerprint" in again["easy"] and "strata" not in again["easy"]


def test_a_resumed_monitor_compares_with_what_the_checkpoint_saw() -> None:
    monitor = DriftMonitor()
    monitor.check([_set("easy", ["a", "a"])])
    state = monitor.state_dict()
    assert state == {"eval_sets": {"easy": eval_set_summary(_set("easy", ["a", "a"]))}}

    resumed = DriftMonitor()
    resumed.load_state_dict(state)
    assert resumed.check([_set("easy", ["a", "a"])]) == {}
    resumed = DriftMonitor()
    resumed.load_state_dict(state)
    assert list(resumed.check([_set("easy", ["a", "b"])])) == ["easy"]
    # An old checkpoint without drift state: nothing to compare with, nothing reported.
    fresh = DriftMonitor()
    fresh.load_state_dict({})
    assert fresh.check([_set("easy", ["a", "b"])]) == {}


def test_a_summary_now_without_strata_compares_as_no_strata() -> None:
    before = {"fingerprint": "f1", "strata": {"a": 1}}
    assert drift_message("easy", before, {"fingerprint": "f1"}) == (
        "eval set 'easy' changed during the run (strata {'a': 1} -> {}): its metrics before and after"
        " this point are not comparable"
    )


def test_the_monitor_names_the_set_that_changed() -> None:
    monitor = DriftMonitor()
    monitor.check([_set("hard", ["a"])])
    (message,) = monitor.check([_set("hard", ["b"])]).values()
    assert message.startswith("eval set 'hard' changed during the run (")
