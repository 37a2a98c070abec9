"""Selection that knows its noise: when a round becomes the best under ``point``, ``lcb`` and
``paired``, in either direction; what a resume keeps; the messages when a rule lacks what it needs;
and, through a real Trainer, `ModelCheckpoint` and `EarlyStopping` monitoring ``.../best_step``
follow the rule."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from callback_helpers import QUIET_WARNINGS, CountingModule, make_trainer
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint
from scipy import stats

from areal_lightning.callbacks import EvaluationCallback
from areal_lightning.callbacks.best import BestValues
from areal_lightning.callbacks.choices import Direction
from areal_lightning.callbacks.selection import (
    Candidate,
    NoiseUnknownError,
    SelectionRule,
    is_new_best,
    prompt_interval,
)
from areal_lightning.errors import ArgumentError
from areal_lightning.eval_round import EvalBatch, EvalContext, EvalSet
from areal_lightning.tracking.history import eval_rows, read_history

pytestmark = [pytest.mark.filterwarnings(w) for w in QUIET_WARNINGS]

PROMPTS = 20


def _solved(count: int) -> dict[int, float]:
    """Prompts 0 .. count-1 solved, the rest not."""
    return {i: float(i < count) for i in range(PROMPTS)}


def _candidate(count: int) -> Candidate:
    return Candidate(count / PROMPTS, _solved(count))


def test_the_interval_across_prompts_is_scipys_t_interval() -> None:
    values = [0.25, 1.0, 0.0, 0.5, 0.75, 0.5, 1.0]
    low, high = prompt_interval(dict(enumerate(values)), 0.9)
    reference = stats.t.interval(0.9, len(values) - 1, loc=sum(values) / len(values), scale=stats.sem(values))
    assert (low, high) == pytest.approx(reference, abs=1e-12)
    assert all(math.isnan(b) for b in prompt_interval({0: 1.0}, 0.95))


def test_a_gain_of_one_prompt_is_noise_to_paired_and_a_new_best_to_point() -> None:
    best, one_more, many_more = _candidate(10), _candidate(11), _candidate(18)
    assert is_new_best(one_more, best, Direction.MAX, SelectionRule.POINT)
    assert not is_new_best(one_more, best, Direction.MAX, SelectionRule.PAIRED)
    assert is_new_best(many_more, best, Direction.MAX, SelectionRule.PAIRED)
    # A lower confidence lets a smaller paired gain count.
    assert not is_new_best(_candidate(13), best, Direction.MAX, SelectionRule.PAIRED, confidence=0.95)
    assert is_new_best(_candidate(13), best, Direction.MAX, SelectionRule.PAIRED, confidence=0.5)


def test_lcb_prefers_a_round_whose_prompts_agree_over_a_higher_but_spread_one() -> None:
    spread = Candidate(0.5, {i: float(i % 2) for i in range(PROMPTS)})  # half all right, half all wrong
    steady = Candidate(0.45, dict.fromkeys(range(PROMPTS), 0.45))  # every prompt right 45% of the time
    assert is_new_best(steady, spread, Direction.MAX, SelectionRule.LCB)
    assert not is_new_best(steady, spread, Direction.MAX, SelectionRule.POINT)
    assert not is_new_best(spread, steady, Direction.MAX, SelectionRule.LCB)


def test_a_lower_is_better_metric_compares_upper_bounds_and_falls_for_paired() -> None:
    loss = {i: 2.0 + (i % 3) for i in range(PROMPTS)}
    lower = {i: v - 1.0 for i, v in loss.items()}
    assert is_new_best(Candidate(2.0, lower), Candidate(3.0, loss), Direction.MIN, SelectionRule.PAIRED)
    assert not is_new_best(Candidate(3.0, loss), Candidate(2.0, lower), Direction.MIN, SelectionRule.PAIRED)
    assert is_new_best(Candidate(2.0, lower), Candidate(3.0, loss), Direction.MIN, SelectionRule.LCB)


def test_lcb_without_outcomes_uses_the_published_interval() -> None:
    narrow, wide = Candidate(0.6, None, 0.55, 0.65), Candidate(0.7, None, 0.4, 0.9)
    assert is_new_best(narrow, wide, Direction.MAX, SelectionRule.LCB)
    assert not is_new_best(wide, narrow, Direction.MAX, SelectionRule.LCB)


@pytest.mark.parametrize(
    ("rule", "candidate", "message"),
    [
        (
            "paired",
            Candidate(0.5),
            r"^best_rule=paired needs the per-prompt outcomes of 'pass@4' \(evaluate_fn records",
        ),
        (
            "lcb",
            Candidate(0.5),
            r"^best_rule=lcb needs the interval of 'pass@4': per-prompt outcomes .* or pass@4/ci_low",
        ),
    ],
)
def test_a_rule_that_lacks_what_it_needs_says_what_at_the_first_round(
    rule: str, candidate: Candidate, message: str
) -> None:
    with pytest.raises(NoiseUnknownError, match=message):
        is_new_best(candidate, None, Direction.MAX, SelectionRule(rule), metric="pass@4")
    assert is_new_best(candidate, None, Direction.MAX, SelectionRule.POINT)


def test_nan_is_never_the_best_and_a_tie_keeps_the_earlier_round() -> None:
    for rule in SelectionRule:
        assert not is_new_best(Candidate(math.nan, _solved(3)), None, Direction.MAX, rule)
    assert not is_new_best(_candidate(10), _candidate(10), Direction.MAX, SelectionRule.POINT)
    assert not is_new_best(_candidate(10), _candidate(10), Direction.MAX, SelectionRule.LCB)


ROUNDS = [10, 11, 18, 19, 19, 20, 20, 20]  # prompts solved at steps 0, 2, 4, ...


def _run(best: BestValues, rounds: list[int], first_step: int = 0) -> list[float]:
    steps = []
    for k, count in enumerate(rounds):
        out = best.update("easy", {"accuracy": count / PROMPTS}, 2 * (first_step + k), {"accuracy": _solved(count)})
        steps.append(out["accuracy/best_step"])
    return steps


def test_best_values_under_each_rule() -> None:
    assert _run(BestValues({"accuracy": "max"}), ROUNDS) == [0, 2, 4, 6, 6, 10, 10, 10]
    assert _run(BestValues({"accuracy": "max"}, "paired"), ROUNDS) == [0, 0, 4, 4, 4, 4, 4, 4]
    # On one eval set of 0/1 outcomes the bound rises with the count: lcb picks as point does.
    assert _run(BestValues({"accuracy": "max"}, "lcb"), ROUNDS) == [0, 2, 4, 6, 6, 10, 10, 10]


@pytest.mark.parametrize("rule", ["paired", "lcb"])
def test_a_resume_decides_as_the_uninterrupted_run_would(rule: str) -> None:
    straight = BestValues({"accuracy": "max"}, rule)
    expected = _run(straight, ROUNDS)
    first = BestValues({"accuracy": "max"}, rule)
    _run(first, ROUNDS[:3])
    state = first.state_dict()
    torch.save(state, buffer := __import__("io").BytesIO())
    buffer.seek(0)
    resumed = BestValues({"accuracy": "max"}, rule)
    resumed.load_state_dict(torch.load(buffer, weights_only=True))
    assert _run(resumed, ROUNDS[3:], first_step=3) == expected[3:]


def test_a_checkpoint_of_the_point_rule_resumed_under_paired_compares_once_by_value() -> None:
    point = BestValues({"accuracy": "max"})
    _run(point, [10])
    paired = BestValues({"accuracy": "max"}, "paired")
    paired.load_state_dict(point.state_dict())
    assert _run(paired, [11, 12, 19], first_step=1) == [2, 2, 6]  # 11 > 10 by value; then paired from 11


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"rule": "lbc"},
            r"^Unsupported parameter value `EvaluationCallback\(best_rule='lbc'\)`. Possible choices "
            r"are: point, lcb, paired$",
        ),
        ({"confidence": 1.0}, r"^`EvaluationCallback\(best_confidence=...\)` must be a number in \(0, 1\), got 1.0$"),
    ],
)
def test_bad_rule_arguments_are_named(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ArgumentError, match=message):
        BestValues({"accuracy": "max"}, **options)


def _scripted(module: Any, batches: list[EvalBatch], ctx: EvalContext) -> dict[str, Any]:
    count = ROUNDS[min(ctx.global_step // 2, len(ROUNDS) - 1)]
    values = []
    for batch in batches:
        outcomes = [float(i < count) for i in batch.indices]
        ctx.record_outcomes("accuracy", batch.indices, outcomes)
        values += outcomes
    return {"accuracy": torch.tensor(values, dtype=torch.float64)}


@pytest.mark.parametrize(("rule", "best_step", "stop_step"), [("paired", 4, 8), ("point", 10, 14)])
def test_checkpoint_and_early_stopping_on_best_step_follow_the_rule(
    tmp_path: Path, rule: str, best_step: int, stop_step: int
) -> None:
    callback = EvaluationCallback(
        [EvalSet("easy", list(range(PROMPTS)), batch_size=7)],
        _scripted,
        schedule={"freq_steps": 2, "eval_before_train": True},
        decisions={"best_metrics": {"accuracy": "max"}, "best_rule": rule},
    )
    monitor = "eval/easy/accuracy/best_step"
    checkpoint = ModelCheckpoint(dirpath=tmp_path / "ckpt", monitor=monitor, mode="max", every_n_train_steps=2)
    stopping = EarlyStopping(monitor=monitor, mode="max", patience=2)
    trainer = make_trainer(tmp_path, [callback, checkpoint, stopping], max_steps=20)
    trainer.fit(CountingModule(epoch_len=20))
    assert trainer.global_step == stop_step
    assert Path(checkpoint.best_model_path).name == f"epoch=0-step={best_step}.ckpt"
    assert float(checkpoint.best_model_score) == best_step
    last = eval_rows(read_history(tmp_path))[-1]["metrics"]
    assert last["accuracy/best"] == ROUNDS[best_step // 2] / PROMPTS


def test_a_changed_eval_set_is_compared_by_value_once_then_by_the_rule() -> None:
    best = BestValues({"accuracy": "max"}, "paired")
    _run(best, [10])
    best.reset("easy")  # its content changed: the kept outcomes are of other prompts
    assert _run(best, [11, 12, 19], first_step=1) == [2, 2, 6]


def test_two_prompts_have_an_interval_and_nan_outcomes_are_not_prompts() -> None:
    low, high = prompt_interval({0: 1.0, 1: math.nan, 2: 0.0}, 0.9)
    reference = stats.t.interval(0.9, 1, loc=0.5, scale=stats.sem([1.0, 0.0]))
    assert (low, high) == pytest.approx(reference, abs=1e-12)
    assert all(math.isnan(b) for b in prompt_interval({0: 1.0, 1: math.nan}, 0.9))


def test_lcb_of_a_lower_is_better_metric_ranks_by_the_published_upper_bound() -> None:
    # Lower loss is better: the narrow round's upper bound (0.65) beats the wide one's (0.9), though
    # its lower bound does not.
    narrow, wide = Candidate(0.6, None, 0.55, 0.65), Candidate(0.5, None, 0.1, 0.9)
    assert is_new_best(narrow, wide, Direction.MIN, SelectionRule.LCB)
    assert not is_new_best(wide, narrow, Direction.MIN, SelectionRule.LCB)
    # A metric that publishes only the bound the direction needs is ranked by it.
    assert is_new_best(Candidate(0.6, None, 0.5), Candidate(0.7, None, 0.4), Direction.MAX, SelectionRule.LCB)


@pytest.mark.parametrize(
    ("rule", "message"),
    [
        (
            "lcb",
            "best_rule=lcb needs the interval of 'pass@4': per-prompt outcomes (evaluate_fn records them with "
            "ctx.record_outcomes('pass@4', ...)) or pass@4/ci_low and pass@4/ci_high among its metrics; record one, "
            "or use best_rule=point",
        ),
        (
            "paired",
            "best_rule=paired needs the per-prompt outcomes of 'pass@4' (evaluate_fn records them with "
            "ctx.record_outcomes('pass@4', ...)); record them, or use best_rule=point or lcb",
        ),
    ],
)
def test_what_a_rule_lacks_is_said_in_full(rule: str, message: str) -> None:
    with pytest.raises(NoiseUnknownError) as err:
        is_new_best(Candidate(0.5), Candidate(0.4, {0: 1.0}), Direction.MAX, SelectionRule(rule), metric="pass@4")
    assert str(err.value) == message


def test_a_lower_is_better_metric_under_point_and_paired_and_its_ties() -> None:
    assert is_new_best(Candidate(0.2), Candidate(0.3), Direction.MIN, SelectionRule.POINT)
    assert not is_new_best(Candidate(0.4), Candidate(0.3), Direction.MIN, SelectionRule.POINT)
    assert not is_new_best(Candidate(0.3), Candidate(0.3), Direction.MIN, SelectionRule.POINT)  # a tie
    same = _candidate(10)
    for direction in Direction:  # the same outcomes: a change of exactly 0 is no gain
        assert not is_new_best(same, _candidate(10), direction, SelectionRule.PAIRED)
    # A slightly higher loss, its change's interval (0.11 .. 0.27) above 0 and below 1: no new best.
    loss = {i: float(i % 2) for i in range(PROMPTS)}
    higher = {i: v + 0.2 * (i % 3) for i, v in loss.items()}
    assert not is_new_best(Candidate(0.7, higher), Candidate(0.5, loss), Direction.MIN, SelectionRule.PAIRED)


def test_without_a_metric_name_the_message_says_metric() -> None:
    with pytest.raises(NoiseUnknownError, match=r"^best_rule=lcb needs the interval of 'metric': "):
        is_new_best(Candidate(0.5), None, Direction.MAX, SelectionRule.LCB)


def test_lcb_against_a_best_of_one_prompt_and_its_ties_and_a_best_without_an_interval() -> None:
    one_prompt = Candidate(1.0, {0: 1.0})  # no spread to bound: any bound beats it
    two = Candidate(0.5, {0: 1.0, 1: 0.0})
    assert is_new_best(two, one_prompt, Direction.MAX, SelectionRule.LCB)
    assert not is_new_best(Candidate(1.0, {3: 1.0}), one_prompt, Direction.MAX, SelectionRule.LCB)
    for direction in Direction:  # the same bound: a tie keeps the earlier round
        assert not is_new_best(_candidate(10), _candidate(10), direction, SelectionRule.LCB)
    with pytest.raises(NoiseUnknownError, match=r"^best_rule=lcb needs the interval of 'loss': "):
        is_new_best(two, Candidate(0.4), Direction.MIN, SelectionRule.LCB, metric="loss")
