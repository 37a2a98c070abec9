"""Paired rounds across a resume, without a Trainer: the state a checkpoint keeps (also through
JSON, whose keys are strings, and under a process group) makes the first round after the resume
pair with the round before it and with the best round, as if training had not stopped."""

from __future__ import annotations

import json
import math

import pytest
import torch

from areal_lightning.metrics.paired import PairedRounds, paired_change

ROUNDS = [
    ({0: 0.0, 1: 1.0, 2: 0.0, 3: 0.0}, 0.25),
    ({0: 1.0, 1: 1.0, 2: 0.0, 3: 1.0}, 0.75),  # the best round
    ({0: 1.0, 1: 0.0, 2: 0.0, 3: 1.0}, 0.5),
]
NEXT = ({0: 0.0, 1: 1.0, 2: 1.0, 3: 1.0}, 0.75)


def _update(pairs: PairedRounds, outcomes: dict[int, float], value: float) -> dict[str, float]:
    return pairs.update("easy", {"acc": outcomes, "reward": outcomes}, ["acc", "reward"], {"acc": value})


def _same(a: object, b: object) -> bool:
    """Equal states, NaN values included."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def _trained() -> PairedRounds:
    pairs = PairedRounds()
    for outcomes, value in ROUNDS:
        _update(pairs, outcomes, value)
    return pairs


@pytest.mark.parametrize("through", ["torch.save", "json"])
def test_the_round_after_a_resume_pairs_as_if_training_had_not_stopped(through: str, tmp_path: object) -> None:
    straight = _trained()
    state = straight.state_dict()
    if through == "json":
        state = json.loads(json.dumps(state))  # keys become strings
    else:
        path = f"{tmp_path}/state.pt"
        torch.save(state, path)
        state = torch.load(path, weights_only=True)
    resumed = PairedRounds()
    _update(resumed, {0: 0.0}, 0.0)  # what it held before the resume is replaced
    resumed.load_state_dict(state)
    assert resumed.last_changes == {}
    assert _same(resumed.state_dict(), straight.state_dict())
    expected = _update(straight, *NEXT)
    assert _update(resumed, *NEXT) == expected
    assert expected["acc/delta"] == pytest.approx(0.25) and expected["acc/delta_best"] == 0.0
    # "reward" has no value: its best is NaN, which every later round replaces.
    assert math.isnan(resumed.state_dict()["best"]["easy"]["reward"][0])


def test_a_checkpoint_without_paired_rounds_leaves_nothing_to_pair() -> None:
    pairs = _trained()
    pairs.load_state_dict({})
    assert pairs.state_dict() == {"previous": {}, "best": {}}
    assert _update(pairs, *NEXT) == {}


def test_under_a_process_group_the_state_is_gathered_from_every_rank() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        pytest.skip("a process group is already up in this process")
    plain = _trained().state_dict()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        assert _same(_trained().state_dict(), plain)
    finally:
        dist.destroy_process_group()


def test_a_bad_confidence_is_named() -> None:
    with pytest.raises(ValueError, match=r"^`paired_change\(confidence=...\)` must be a number in \(0, 1\), got 1.5$"):
        paired_change(4, 0.4, 0.06, confidence=1.5)


def test_updates_in_parts_give_the_change_of_all_pairs_at_once() -> None:
    from areal_lightning.metrics.paired import PairedChange

    current, reference = torch.tensor([0.0, 1.0, 0.5, 0.25]), torch.tensor([1.0, 0.0, 0.0, 0.25])
    whole, parts = PairedChange(), PairedChange()
    whole.update(current, reference)
    parts.update(current[:2], reference[:2])  # differences -1 and 1: their squares are not themselves
    parts.update(current[2:], reference[2:])
    assert parts.compute() == whole.compute()
    assert whole.compute().delta == 0.125 and whole.compute().n == 4


def test_outcomes_are_paired_in_float64() -> None:
    """Per-prompt outcomes that float32 cannot hold (a mean reward of 0.1) change by their float64 difference."""
    from areal_lightning.metrics.paired import paired_sums

    before, after = {0: 0.1, 1: 1 / 3}, {0: 0.3, 1: 2 / 3}
    pairs = PairedRounds()
    pairs.update("easy", {"reward": before}, ["reward"], {"reward": 0.2})
    out = pairs.update("easy", {"reward": after}, ["reward"], {"reward": 0.5})
    assert out["reward/delta"] == paired_change(*paired_sums(after, before)).delta


def test_the_metrics_confidence_sets_its_interval() -> None:
    from areal_lightning.metrics.paired import PairedChange

    narrow = PairedChange(confidence=0.5)
    narrow.update(torch.tensor([0.0, 1.0, 0.5, 0.25]), torch.tensor([1.0, 0.0, 0.0, 0.25]))
    assert narrow.compute() == paired_change(4, 0.5, 2.25, confidence=0.5)
    assert narrow.compute().high < paired_change(4, 0.5, 2.25).high
