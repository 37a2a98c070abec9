"""SafeScorer: a scorer that hangs is cut off and counted, one that raises is counted, from any thread;
ScoringMetric's counts are exact across ranks."""

from __future__ import annotations

import threading

import pytest
from ddp_utils import run_ddp
from scorer_fns import exact

from areal_lightning.errors import ArgumentError
from areal_lightning.metrics import ScoringMetric
from areal_lightning.scoring import SafeScorer, Score, ScorerFailingError, ScoreStatus

TIMEOUT_S = 1.0


@pytest.mark.process
def test_a_scorer_that_sleeps_forever_is_cut_off_counted_and_replaced():
    with SafeScorer(exact, timeout_s=TIMEOUT_S, workers=2) as scorer:
        scores = scorer.score_many(["5", "hang", "6", "", "raise", "die", "5"], ["5"] * 7)
        statuses = [s.status for s in scores]
        assert statuses == [
            ScoreStatus.OK,
            ScoreStatus.TIMEOUT,
            ScoreStatus.OK,
            ScoreStatus.PARSE_FAILURE,
            ScoreStatus.ERROR,
            ScoreStatus.ERROR,
            ScoreStatus.OK,
        ]
        # A failure scores as wrong, never as right.
        assert [s.reward for s in scores] == [1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0]
        # The hung and the dead workers were replaced: the scorer still answers.
        assert scorer.score_many(["7"] * 4, ["7"] * 4) == [Score(1.0)] * 4  # both workers answer again
    metric = ScoringMetric()
    metric.update(scores)
    assert {k: v.item() for k, v in metric.compute().items()} == {"timeouts": 1.0, "parse_failures": 1.0, "errors": 2.0}


@pytest.mark.process
def test_the_time_limit_works_off_the_main_thread():
    out: list[list[Score]] = []
    with SafeScorer(exact, timeout_s=TIMEOUT_S) as scorer:
        thread = threading.Thread(target=lambda: out.append(scorer.score_many(["hang", "3"], ["3", "3"])))
        thread.start()
        thread.join(60)
        assert not thread.is_alive(), "scoring on a non-main thread hung"
    assert [s.status for s in out[0]] == [ScoreStatus.TIMEOUT, ScoreStatus.OK]


@pytest.mark.process
def test_a_scorer_that_keeps_failing_is_reported_not_silent():
    with SafeScorer(exact, timeout_s=TIMEOUT_S, max_consecutive_failures=3) as scorer:
        scorer.score_many(["raise", "raise", "1"], ["1"] * 3)  # a success in between resets the count
        with pytest.raises(ScorerFailingError, match=r"failed 3 times in a row .*error"):
            scorer.score_many(["raise", "raise", "raise"], ["1"] * 3)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"timeout_s": 0}, r"`SafeScorer\(timeout_s=...\)` must be a positive number of seconds, got 0"),
        ({"workers": 0}, r"`SafeScorer\(workers=...\)` must be a positive integer, got 0"),
        ({"max_consecutive_failures": 0}, r"max_consecutive_failures=...\)` must be a positive integer or None"),
    ],
)
def test_bad_arguments_are_named(kwargs, match):
    with pytest.raises(ArgumentError, match=match):
        SafeScorer(exact, **kwargs)


def _counts_on_rank(rank: int, world_size: int) -> dict[str, float]:
    metric = ScoringMetric()
    # rank 0: 2 timeouts, 1 parse failure; rank 1: 1 timeout, 3 errors
    statuses = {
        0: [ScoreStatus.TIMEOUT] * 2 + [ScoreStatus.PARSE_FAILURE, ScoreStatus.OK],
        1: [ScoreStatus.TIMEOUT] + [ScoreStatus.ERROR] * 3,
    }[rank]
    metric.update([Score(0.0, s) for s in statuses])
    return {k: v.item() for k, v in metric.compute().items()}


@pytest.mark.ddp
def test_counts_are_summed_exactly_across_ranks():
    results = run_ddp(_counts_on_rank, 2)
    assert results == [{"timeouts": 3.0, "parse_failures": 1.0, "errors": 3.0}] * 2
