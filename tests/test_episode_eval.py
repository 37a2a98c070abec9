"""The default evaluation of a `GRPOModule` with episodes: success within t turns, turns, the
discounted reward, the completion statistics per turn and over all turns; the same numbers on one
process and on two gloo ranks."""

from __future__ import annotations

import math
from typing import Any

import pytest
from ddp_utils import run_ddp
from episode_helpers import episode_module

from areal_lightning.eval_round import EvalSet, SamplingParams, run_round
from areal_lightning.rl.grpo.module import GRPOModule

MAX_TURNS = 3


def _metrics(rank: int = 0, world_size: int = 1) -> tuple[dict[str, float], int, list[dict[str, Any]]]:
    module = episode_module(max_turns=MAX_TURNS)
    samples = module.task.make_samples("eval", digits=1, size=13)
    # Batches of 3 prompts: 5 batches, dealt 3 and 2 on two ranks.
    eval_set = EvalSet(
        "eval",
        samples,
        batch_size=3,
        cost_fn=lambda s: float(len(s.prompt)),
        sampling=SamplingParams(n_samples=4, temperature=1.0, max_new_tokens=3),
    )
    (result,) = run_round(module, [eval_set], GRPOModule.evaluate, seed=5, global_step=0, epoch=0, max_table_rows=2)
    return result.metrics, result.num_prompts, result.table_rows


def test_success_within_t_turns_grows_with_t_and_the_reward_is_discounted() -> None:
    metrics, prompts, rows = _metrics()
    assert prompts == 13
    success = [metrics[f"success@{t}"] for t in range(1, MAX_TURNS + 1)]
    assert 0 < success[0] < success[1] < success[2] < 1 and metrics["accuracy"] == success[-1]
    # A success at turn t earns 0.9 ** (t - 1) (the default turn_discount).
    expected = sum((hi - lo) * 0.9**t for t, (lo, hi) in enumerate(zip([0.0, *success], success, strict=False)))
    assert metrics["reward/mean"] == pytest.approx(expected, abs=1e-12)
    # Episodes that end early are shorter: 1 turn for a first-turn success, 3 for a failure.
    assert metrics["turns/mean"] == pytest.approx(
        1 * success[0] + 2 * (success[1] - success[0]) + 3 * (1 - success[1]), abs=1e-12
    )
    assert [r["index"] for r in rows] == [0, 1] and all(1 <= r["turns"] <= MAX_TURNS for r in rows)
    assert "tool/calls" not in metrics  # a retry environment calls no tool


def test_each_turns_completion_statistics_are_over_the_episodes_that_reached_it() -> None:
    metrics, _, _ = _metrics()
    # The share of episodes that wrote a t-th completion: those not solved within t - 1 turns.
    reached = [1.0] + [1 - metrics[f"success@{t}"] for t in range(1, MAX_TURNS)]
    assert sum(reached) == pytest.approx(metrics["turns/mean"], abs=1e-12)
    for stat in ("length/mean", "truncated", "no_answer", "logprob", "entropy"):
        per_turn = [metrics[f"turn{t}/completion/{stat}"] for t in range(1, MAX_TURNS + 1)]
        assert len(set(per_turn)) > 1, stat  # the turns differ: each reads its own completions
        # All turns' statistic is the turns' weighted by their completions (tokens, for the scores).
        tokens = [r * metrics[f"turn{t}/completion/length/mean"] for t, r in enumerate(reached, start=1)]
        weights = tokens if stat in ("logprob", "entropy") else reached
        expected = sum(w * v for w, v in zip(weights, per_turn, strict=True)) / sum(weights)
        assert metrics[f"completion/{stat}"] == pytest.approx(expected, abs=1e-12), stat
    assert f"turn{MAX_TURNS + 1}/completion/length/mean" not in metrics


@pytest.mark.ddp
def test_two_ranks_give_the_metrics_of_one_process_bit_for_bit() -> None:
    alone, prompts, _ = _metrics()
    (rank0, prompts0, _), (rank1, _, _) = run_ddp(_metrics, 2)
    per_turn = [k for k in alone if k.startswith("turn") and "/completion/" in k]
    assert len(per_turn) == 9 * MAX_TURNS and not any(math.isnan(alone[k]) for k in per_turn)
    assert {k: rank0[k] for k in per_turn} == {k: alone[k] for k in per_turn}  # named in a failure
    assert rank0 == rank1 == alone and prompts0 == prompts == 13
