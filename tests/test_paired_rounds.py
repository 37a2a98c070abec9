"""Paired changes as a user reads them in the logs: which round is the reference (previous, best,
NaN never best, a tie keeps the earlier one), that only prompts evaluated in both rounds pair, that
a reset eval set starts over, the interval's edges (no pair, one pair, movement), and messages."""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor

from areal_lightning.metrics.paired import (
    Change,
    PairedChange,
    PairedRounds,
    change_metrics,
    paired_change,
    paired_sums,
    t_cdf,
    t_quantile,
)


def _round(pairs: PairedRounds, outcomes: dict[int, float], value: float, dataset: str = "easy") -> dict[str, float]:
    return pairs.update(dataset, {"acc": outcomes}, ["acc"], {"acc": value})


def test_the_first_round_has_nothing_to_pair_and_the_second_pairs_with_it() -> None:
    pairs = PairedRounds()
    assert _round(pairs, {0: 0.0, 1: 0.0, 2: 1.0}, 1 / 3) == {}
    assert pairs.last_changes == {"easy": {}}
    out = _round(pairs, {0: 1.0, 1: 0.0, 2: 1.0}, 2 / 3)
    assert out["acc/delta"] == pytest.approx(1 / 3) and out["acc/delta_best"] == pytest.approx(1 / 3)
    assert set(out) == {f"acc/{ref}{end}" for ref in ("delta", "delta_best") for end in ("", "_ci_low", "_ci_high")}
    assert pairs.last_changes["easy"]["acc"].n == 3


def test_only_prompts_evaluated_in_both_rounds_pair() -> None:
    pairs = PairedRounds()
    _round(pairs, {0: 0.0, 1: 1.0}, 0.5)
    _round(pairs, {1: 0.0, 2: 1.0, 3: 1.0}, 2 / 3)
    (change,) = pairs.last_changes["easy"].values()
    assert (change.n, change.delta) == (1, -1.0) and math.isnan(change.low)


def test_the_best_round_is_the_highest_value_a_tie_keeps_the_first_and_nan_is_replaced() -> None:
    pairs = PairedRounds()
    _round(pairs, {0: 0.5, 1: 0.5}, math.nan)  # NaN: replaced by the next round
    _round(pairs, {0: 1.0, 1: 1.0}, 1.0)  # the best
    _round(pairs, {0: 0.0, 1: 0.0}, 1.0)  # a tie: the earlier best stays
    out = _round(pairs, {0: 0.5, 1: 0.5}, 0.5)
    assert out["acc/delta_best"] == pytest.approx(-0.5)  # against the first 1.0 round (outcomes 1.0)
    assert out["acc/delta"] == pytest.approx(0.5)  # against the previous round (outcomes 0.0)


def test_a_reset_eval_set_starts_pairing_over_and_the_others_go_on() -> None:
    pairs = PairedRounds()
    for dataset in ("easy", "hard"):
        _round(pairs, {0: 0.0, 1: 1.0}, 0.5, dataset)
    pairs.reset("easy")
    assert "easy" not in pairs.last_changes
    assert _round(pairs, {0: 1.0, 1: 1.0}, 1.0, "easy") == {}  # nothing to pair with: no change
    assert "acc/delta" in _round(pairs, {0: 1.0, 1: 1.0}, 1.0, "hard")
    assert _round(pairs, {0: 0.0, 1: 1.0}, 0.5, "easy")["acc/delta_best"] == pytest.approx(-0.5)
    pairs.reset("never seen")  # nothing to forget: no error


def test_a_metric_missing_on_this_rank_pairs_nothing_but_keeps_the_collective() -> None:
    pairs = PairedRounds()
    pairs.update("easy", {}, ["acc"], {"acc": 0.5})
    out = pairs.update("easy", {}, ["acc"], {"acc": 0.5})
    assert math.isnan(out["acc/delta"]) and pairs.last_changes["easy"]["acc"].n == 0


def test_change_metrics_name_the_reference() -> None:
    assert change_metrics("reward/mean", "delta_best", Change(0.25, 0.125, 0.375, 8)) == {
        "reward/mean/delta_best": 0.25,
        "reward/mean/delta_best_ci_low": 0.125,
        "reward/mean/delta_best_ci_high": 0.375,
    }


def test_the_interval_edges() -> None:
    none = paired_change(0, 0.0, 0.0)
    assert none.n == 0 and all(math.isnan(x) for x in (none.delta, none.low, none.high)) and not none.excludes_zero
    one = paired_change(1, 0.5, 0.25)
    assert (one.n, one.delta) == (1, 0.5) and math.isnan(one.low) and math.isnan(one.high)
    flat = paired_change(4, 2.0, 1.0)  # d = 0.5 four times: no spread, a zero-width interval
    assert (flat.delta, flat.low, flat.high) == (0.5, 0.5, 0.5) and flat.excludes_zero
    assert Change(-0.2, -0.3, -0.1, 5).excludes_zero and not Change(0.1, 0.0, 0.2, 5).excludes_zero
    assert not Change(-0.1, -0.2, 0.0, 5).excludes_zero
    wide = paired_change(4, 0.4, 0.06, confidence=0.99)
    assert wide.high - wide.low > paired_change(4, 0.4, 0.06).high - paired_change(4, 0.4, 0.06).low
    assert paired_change(3.0, 0.3, 0.05).n == 3


def test_paired_sums_count_only_common_prompts() -> None:
    assert paired_sums({0: 1.0, 5: 2.0}, {5: 0.5, 7: 1.0}) == (1, 1.5, 2.25)
    assert paired_sums({}, {1: 1.0}) == (0, 0.0, 0.0)


def test_the_t_distribution_is_symmetric_and_its_quantiles_invert_it() -> None:
    assert t_cdf(-1.5, 7) == pytest.approx(1 - t_cdf(1.5, 7), abs=1e-14)
    assert t_quantile(0.025, 9) == pytest.approx(-t_quantile(0.975, 9), abs=1e-12)
    assert t_quantile(0.5, 3) == pytest.approx(0.0, abs=1e-12)
    for p in (0.6, 0.9, 0.999):
        assert t_cdf(t_quantile(p, 4), 4) == pytest.approx(p, abs=1e-12)
    assert t_quantile(0.9999999, 1) > 1e5  # a heavy tail: the bracket keeps doubling


@pytest.mark.parametrize(("p", "df"), [(0.0, 3), (1.0, 3), (0.5, 0), (-0.1, 2), (0.5, -1)])
def test_bad_quantile_arguments_are_named(p: float, df: float) -> None:
    with pytest.raises(ValueError) as info:
        t_quantile(p, df)
    assert str(info.value) == f"`t_quantile(p=..., df=...)` needs 0 < p < 1 and df > 0, got p={p!r}, df={df!r}"


def test_bad_change_arguments_are_named() -> None:
    with pytest.raises(ValueError) as info:
        paired_change(-1, 0.0, 0.0)
    assert str(info.value) == "`paired_change(n=...)` must be a count >= 0, got -1"
    with pytest.raises(ValueError, match=r"`PairedRounds\(confidence=...\)` must be a number in \(0, 1\), got 1.5"):
        PairedRounds(confidence=1.5)
    with pytest.raises(ValueError, match=r"`PairedChange\(confidence=...\)` must be a number in \(0, 1\), got 0"):
        PairedChange(confidence=0)


def test_the_metric_pairs_across_updates() -> None:
    metric = PairedChange()
    metric.update(torch.tensor([1.0, 0.0]), torch.tensor([0.0, 0.0]))
    metric.update(torch.tensor([1.0]), torch.tensor([1.0]))
    change = metric.compute()
    assert (change.n, change.delta) == (3, pytest.approx(1 / 3))


def test_the_t_distribution_at_the_infinities() -> None:
    assert t_cdf(math.inf, 5) == 1.0 and t_cdf(-math.inf, 5) == 0.0


def test_a_compute_after_merging_or_loading_sums_counts_them() -> None:
    """torchmetrics' result cache does not notice `merge_state` or `load_state_dict`: a cached
    change would still be the one read before them."""
    other = PairedChange()
    other.update(torch.tensor([1.0, 1.0, 1.0]), torch.zeros(3))
    merged = PairedChange()
    merged.update(torch.tensor([1.0, 0.0]), torch.zeros(2))
    assert merged.compute().n == 2
    merged.merge_state(other)
    assert merged.compute() == paired_change(5, 4.0, 4.0)
    loaded = PairedChange()
    loaded.update(torch.zeros(1), torch.ones(1))
    assert loaded.compute().delta == -1.0
    loaded.load_state_dict({"sums": other.sums.clone()})
    assert loaded.compute() == paired_change(3, 3.0, 3.0)


def test_every_compute_gathers_the_ranks_sums_again() -> None:
    """Each compute() is a collective under DDP: a rank that answered its second compute() from a
    cache would skip the gather the other ranks run (they would wait for ever) and miss the pairs
    another rank added since. torchmetrics' own injection points stand in for a second rank."""
    other_rank = PairedChange()
    other_rank.update(torch.tensor([1.0]), torch.zeros(1))
    gathered: list[Tensor] = []

    def gather(state: Tensor, group: object = None) -> list[Tensor]:
        gathered.append(state)
        return [state, other_rank.sums.clone()]

    metric = PairedChange(dist_sync_fn=gather, distributed_available_fn=lambda: True)
    metric.update(torch.tensor([0.5, 0.5]), torch.zeros(2))
    assert metric.compute() == paired_change(3, 2.0, 1.5)
    other_rank.update(torch.tensor([0.0]), torch.ones(1))  # the other rank pairs one more prompt
    assert metric.compute() == paired_change(4, 1.0, 2.5)
    assert len(gathered) == 2
