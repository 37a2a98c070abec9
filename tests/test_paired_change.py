"""The paired change between rounds: its interval against scipy, narrower than the unpaired one on
correlated rounds, exact on 1 and 2 ranks, and logged by the callback with a real Trainer."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest
import torch
from callback_helpers import CountingModule, make_trainer
from ddp_utils import run_ddp
from lightning.pytorch.callbacks import ModelCheckpoint
from scipy import stats

from areal_lightning.callbacks import EvaluationCallback
from areal_lightning.eval_round import EvalBatch, EvalContext, EvalSet, run_round
from areal_lightning.metrics.paired import PairedChange, PairedRounds, paired_change, t_quantile
from areal_lightning.tracking.history import eval_rows, read_history

PROMPTS = 60
ROUNDS = 3
TIMEOUT_S = 120.0


@pytest.mark.parametrize("df", [1, 2, 5, 29, 199, 5000])
@pytest.mark.parametrize("p", [0.6, 0.975, 0.995])
def test_t_quantile_matches_scipy(df: int, p: float) -> None:
    assert math.isclose(t_quantile(p, df), stats.t.ppf(p, df), rel_tol=1e-9)
    assert math.isclose(t_quantile(1 - p, df), stats.t.ppf(1 - p, df), rel_tol=1e-9)


def _outcome(index: int, round_: int) -> float:
    """A prompt's share of correct samples: mostly its own difficulty, a little drift per round."""
    base = random.Random(f"base/{index}").random()
    noise = random.Random(f"noise/{index}/{round_}").gauss(0.0, 0.05)
    return min(1.0, max(0.0, base + 0.04 * round_ + noise))


def test_interval_matches_scipy_paired_t_and_is_narrower_than_the_unpaired_one() -> None:
    before = [_outcome(i, 0) for i in range(PROMPTS)]
    after = [_outcome(i, 1) for i in range(PROMPTS)]
    metric = PairedChange()
    metric.update(torch.tensor(after, dtype=torch.float64), torch.tensor(before, dtype=torch.float64))
    change = metric.compute()
    reference = stats.ttest_rel(after, before).confidence_interval(0.95)
    assert math.isclose(change.delta, sum(a - b for a, b in zip(after, before, strict=True)) / PROMPTS, abs_tol=1e-12)
    assert math.isclose(change.low, reference.low, abs_tol=1e-9)
    assert math.isclose(change.high, reference.high, abs_tol=1e-9)
    assert change.n == PROMPTS
    unpaired = stats.ttest_ind(after, before, equal_var=False).confidence_interval(0.95)
    # The prompts' difficulty is shared by both rounds and cancels only in the paired difference.
    assert (change.high - change.low) * 3 < unpaired.high - unpaired.low
    assert change.excludes_zero and unpaired.low < 0 < unpaired.high


def test_one_pair_has_no_interval_and_no_pair_nothing() -> None:
    assert math.isnan(paired_change(1, 0.5, 0.25).low)
    assert math.isnan(paired_change(0, 0.0, 0.0).delta)
    with pytest.raises(ValueError, match="confidence"):
        paired_change(3, 0.0, 0.0, confidence=1.5)


def _scripted_evaluate(module: Any, batches: list[EvalBatch], ctx: EvalContext) -> dict[str, Any]:
    values = []
    for batch in batches:
        outcomes = [_outcome(i, ctx.global_step) for i in batch.indices]
        ctx.record_outcomes("accuracy", batch.indices, outcomes)
        values += outcomes
    return {"accuracy": torch.tensor(values, dtype=torch.float64)}


def _rounds(rank: int, world_size: int) -> list[dict[str, float]]:
    eval_set = EvalSet("easy", list(range(PROMPTS)), batch_size=7)  # 9 batches: uneven over 2 ranks
    pairs = PairedRounds()
    out = []
    for round_ in range(ROUNDS):
        (result,) = run_round(
            torch.nn.Linear(1, 1), [eval_set], _scripted_evaluate, seed=3, global_step=round_, epoch=0
        )
        out.append(pairs.update("easy", result.outcomes, result.outcome_names, result.metrics))
    return out


@pytest.mark.ddp
def test_changes_are_the_same_on_one_and_two_ranks() -> None:
    one = _rounds(0, 1)
    two = run_ddp(_rounds, 2, timeout_s=TIMEOUT_S)
    assert one[0] == {}  # nothing to pair the first round with
    for round_ in (1, 2):
        before = [_outcome(i, round_ - 1) for i in range(PROMPTS)]
        after = [_outcome(i, round_) for i in range(PROMPTS)]
        reference = stats.ttest_rel(after, before).confidence_interval(0.95)
        assert math.isclose(one[round_]["accuracy/delta_ci_low"], reference.low, abs_tol=1e-9)
        for key, value in one[round_].items():
            assert two[0][round_][key] == value, key  # bit for bit: the sums are exact
            assert two[1][round_][key] == two[0][round_][key], key
    # Round 2 against the best round (round 1, the highest accuracy so far).
    best = stats.ttest_rel([_outcome(i, 2) for i in range(PROMPTS)], [_outcome(i, 1) for i in range(PROMPTS)])
    assert math.isclose(one[2]["accuracy/delta_best_ci_high"], best.confidence_interval(0.95).high, abs_tol=1e-9)


def _step_evaluate(module: CountingModule, batches: list[EvalBatch], ctx: EvalContext) -> dict[str, Any]:
    return _scripted_evaluate(module, batches, ctx)


def test_callback_logs_the_change_since_the_previous_and_the_best_round(tmp_path) -> None:
    cb = EvaluationCallback(
        {"easy": list(range(PROMPTS))}, _step_evaluate, schedule={"freq_steps": 1, "eval_at_end": False}
    )
    make_trainer(tmp_path, [cb], max_steps=3).fit(CountingModule())
    rows = eval_rows(read_history(tmp_path))
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert "accuracy/delta" not in rows[0]["metrics"]
    for row in rows[1:]:
        step = row["step"]
        d = [_outcome(i, step) - _outcome(i, step - 1) for i in range(PROMPTS)]
        assert math.isclose(row["metrics"]["accuracy/delta"], sum(d) / PROMPTS, abs_tol=1e-12)
        low, high = row["metrics"]["accuracy/delta_ci_low"], row["metrics"]["accuracy/delta_ci_high"]
        ref = stats.ttest_rel(
            [_outcome(i, step) for i in range(PROMPTS)], [_outcome(i, step - 1) for i in range(PROMPTS)]
        )
        assert (low, high) == pytest.approx(tuple(ref.confidence_interval(0.95)), abs=1e-9)
        assert "accuracy/delta_best" in row["metrics"]


def test_a_resumed_run_pairs_its_first_round_with_the_round_in_the_checkpoint(tmp_path) -> None:
    """Resumed at step 3 (a Trainer-level checkpoint): the round of step 4 reports the change since
    step 3, and the change since the best round, as an uninterrupted run does."""

    def callback() -> EvaluationCallback:
        return EvaluationCallback(
            {"easy": list(range(PROMPTS))}, _step_evaluate, schedule={"freq_steps": 1, "eval_at_end": False}
        )

    uninterrupted = tmp_path / "uninterrupted"
    make_trainer(uninterrupted, [callback()], max_steps=5).fit(CountingModule())
    expected = {r["step"]: r["metrics"] for r in eval_rows(read_history(uninterrupted))}

    resumed = tmp_path / "resumed"
    ckpt = ModelCheckpoint(dirpath=resumed / "ckpt", filename="step{step}", auto_insert_metric_name=False)
    make_trainer(resumed, [callback(), ckpt], max_steps=3).fit(CountingModule())
    make_trainer(resumed, [callback()], max_steps=5).fit(CountingModule(), ckpt_path=resumed / "ckpt" / "step3.ckpt")
    rows = {r["step"]: r["metrics"] for r in eval_rows(read_history(resumed)) if r["step"] > 3}
    assert list(rows) == [4, 5]
    for step, metrics in rows.items():
        for key in ("accuracy/delta", "accuracy/delta_ci_low", "accuracy/delta_best", "accuracy/delta_best_ci_high"):
            assert metrics[key] == expected[step][key], (step, key)


def _saved_after_two_rounds(rank: int, world_size: int) -> dict[str, Any]:
    eval_set = EvalSet("easy", list(range(PROMPTS)), batch_size=7)
    pairs = PairedRounds()
    for round_ in range(2):
        (result,) = run_round(
            torch.nn.Linear(1, 1), [eval_set], _scripted_evaluate, seed=3, global_step=round_, epoch=0
        )
        pairs.update("easy", result.outcomes, result.outcome_names, result.metrics)
    return pairs.state_dict()


@pytest.mark.ddp
def test_the_saved_state_holds_every_ranks_prompts_and_resumes_on_one_rank() -> None:
    """Saved on two ranks (each evaluated half of the prompts), resumed on one: round 2 pairs every
    prompt with round 1 and with the best round, exactly as an uninterrupted one-rank run does."""
    saved = run_ddp(_saved_after_two_rounds, 2, timeout_s=TIMEOUT_S)
    assert saved[0] == saved[1]
    assert sorted(saved[0]["previous"]["easy"]["accuracy"]) == list(range(PROMPTS))
    pairs = PairedRounds()
    pairs.load_state_dict(saved[0])
    eval_set = EvalSet("easy", list(range(PROMPTS)), batch_size=7)
    (result,) = run_round(torch.nn.Linear(1, 1), [eval_set], _scripted_evaluate, seed=3, global_step=2, epoch=0)
    resumed = pairs.update("easy", result.outcomes, result.outcome_names, result.metrics)
    assert resumed == _rounds(0, 1)[2]
