"""The rules of a stratified subset as a user meets them: each sample's stratum (mapping key,
attribute, none), how places are shared out (ties, the one-per-stratum minimum, more places than
samples), the subset's size from max_prompts or fraction, and the whole message of a bad spec."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from areal_lightning.errors import ArgumentError
from areal_lightning.eval_round import EvalSet
from areal_lightning.eval_round.subsample import Subsample, allocate, sample_stratum, stratified_indices, subsample


@dataclass
class Problem:
    text: str
    level: int


def test_a_samples_stratum_is_its_field_as_text_or_all() -> None:
    assert sample_stratum({"stratum": 3}) == "3"
    assert sample_stratum({"level": "hard"}, "level") == "hard"
    assert sample_stratum(Problem("1+1", 5), "level") == "5"
    assert sample_stratum(Problem("1+1", 5)) == "all"  # no such attribute
    assert sample_stratum({"stratum": "a"}, None) == "all"  # stratification off
    assert sample_stratum(["stratum"]) == "all"


def test_places_go_by_largest_remainder_with_ties_to_the_first_name() -> None:
    assert allocate({"a": 5, "b": 5}, 5) == {"a": 3, "b": 2}
    assert allocate({"b": 5, "a": 5}, 5) == {"a": 3, "b": 2}
    assert allocate({"a": 1, "b": 2, "c": 3}, 3) == {"a": 1, "b": 1, "c": 1}
    assert allocate({"a": 50, "b": 30, "c": 20}, 7) == {"a": 4, "b": 2, "c": 1}  # quotas 3.5, 2.1, 1.4


def test_the_one_per_stratum_minimum_is_paid_by_the_stratum_most_over_its_quota() -> None:
    # quotas 4.85, 0.1, 0.05: the two small strata get one each, the large one gives back.
    assert allocate({"big": 97, "s1": 2, "s2": 1}, 5) == {"big": 3, "s1": 1, "s2": 1}
    assert allocate({"a": 3, "b": 3, "c": 94}, 4) == {"a": 1, "b": 1, "c": 2}


def test_fewer_places_than_strata_go_to_the_largest_with_ties_by_name() -> None:
    assert allocate({"c": 5, "b": 5, "a": 1}, 2) == {"a": 0, "b": 1, "c": 1}
    assert allocate({"a": 2, "b": 2, "c": 2}, 1) == {"a": 1, "b": 0, "c": 0}


def test_more_places_than_samples_keeps_every_sample() -> None:
    assert allocate({"a": 2, "b": 1}, 10) == {"a": 2, "b": 1}
    assert stratified_indices(["a", "b", "a"], 10, seed=0) == [0, 1, 2]


def test_a_stratum_never_gives_more_than_it_holds() -> None:
    assert allocate({"a": 1, "b": 9}, 6) == {"a": 1, "b": 5}
    assert allocate({"a": 2, "b": 2, "c": 10}, 13) == {"a": 2, "b": 2, "c": 9}


def test_the_subset_depends_on_the_seed_and_the_stratum_names_not_their_order() -> None:
    strata = ["x"] * 20 + ["y"] * 20
    first = stratified_indices(strata, 10, seed=3)
    assert first == stratified_indices(strata, 10, seed=3) and len(first) == 10 and first == sorted(first)
    assert stratified_indices(strata, 10, seed=4) != first
    assert sum(i < 20 for i in first) == 5


@pytest.mark.parametrize(
    ("spec", "total", "size"),
    [
        (Subsample(max_prompts=5), 3, 3),
        (Subsample(max_prompts=5), 8, 5),
        (Subsample(fraction=0.5), 9, 4),  # round half to even: 4.5 -> 4
        (Subsample(fraction=0.5), 11, 6),  # 5.5 -> 6
        (Subsample(fraction=0.01), 10, 1),  # at least one
        (Subsample(fraction=1), 7, 7),
    ],
)
def test_the_size_of_the_subset(spec: Subsample, total: int, size: int) -> None:
    assert spec.size(total) == size


def test_the_subset_keeps_the_eval_sets_name_and_options() -> None:
    full = EvalSet("easy", [{"q": i, "stratum": "ab"[i % 2]} for i in range(10)], batch_size=3, options={"k": 1})
    part = subsample(full, Subsample(max_prompts=4, seed=1))
    assert (part.name, part.batch_size, dict(part.options)) == ("easy", 3, {"k": 1})
    assert len(part.samples) == 4 and sorted(s["stratum"] for s in part.samples) == ["a", "a", "b", "b"]
    flat = subsample(full, Subsample(max_prompts=4, seed=1, stratify_by=None))
    assert len(flat.samples) == 4


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "`Subsample(...)` needs exactly one of max_prompts and fraction, got max_prompts=None, fraction=None"),
        (
            {"max_prompts": 3, "fraction": 0.5},
            "`Subsample(...)` needs exactly one of max_prompts and fraction, got max_prompts=3, fraction=0.5",
        ),
        ({"max_prompts": 0}, "`Subsample(max_prompts=...)` must be a positive integer or None, got 0"),
        ({"max_prompts": True}, "`Subsample(max_prompts=...)` must be a positive integer or None, got True"),
        ({"max_prompts": 2.0}, "`Subsample(max_prompts=...)` must be a positive integer or None, got 2.0"),
        ({"fraction": 0}, "`Subsample(fraction=...)` must be a number in (0, 1] or None, got 0"),
        ({"fraction": 1.01}, "`Subsample(fraction=...)` must be a number in (0, 1] or None, got 1.01"),
        ({"fraction": True}, "`Subsample(fraction=...)` must be a number in (0, 1] or None, got True"),
        ({"fraction": "0.5"}, "`Subsample(fraction=...)` must be a number in (0, 1] or None, got '0.5'"),
        ({"max_prompts": 3, "seed": 1.5}, "`Subsample(seed=...)` must be an integer, got 1.5"),
        ({"max_prompts": 3, "seed": False}, "`Subsample(seed=...)` must be an integer, got False"),
    ],
)
def test_a_bad_spec_is_refused_with_its_whole_message(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ArgumentError) as info:
        Subsample(**kwargs)
    assert str(info.value) == message


def test_the_limits_of_a_spec_are_accepted() -> None:
    assert Subsample(max_prompts=1).size(10) == 1 and Subsample(fraction=1.0).size(3) == 3
    assert Subsample(fraction=1e-9, seed=-5).size(3) == 1


def test_a_mapping_without_the_field_is_in_no_stratum() -> None:
    assert sample_stratum({"q": 1}) == "all" and sample_stratum({"q": 1}, "level") == "all"


def test_the_one_per_stratum_minimum_is_given_back_by_the_most_over_quota_first() -> None:
    # quotas a 2.22, b 3.11, c d e 0.22: the minimum of one makes 8 of 6 places. b gives back
    # first (3 is 0.11 under its quota, 2 is 0.22 under a's), then a (2 vs 2.22, b's 2 vs 3.11).
    assert allocate({"a": 10, "b": 14, "c": 1, "d": 1, "e": 1}, 6) == {"a": 1, "b": 2, "c": 1, "d": 1, "e": 1}


def test_no_stratification_draws_from_the_whole_set() -> None:
    full = EvalSet("easy", [{"q": i, "stratum": "b" if i == 9 else "a"} for i in range(10)])
    stratified = [subsample(full, Subsample(max_prompts=2, seed=s)).samples for s in range(10)]
    assert all(any(x["stratum"] == "b" for x in part) for part in stratified)  # one place per stratum
    flat = [subsample(full, Subsample(max_prompts=2, seed=s, stratify_by=None)).samples for s in range(10)]
    assert flat == [[full.samples[i] for i in stratified_indices(["all"] * 10, 2, s)] for s in range(10)]
    assert any(all(x["stratum"] == "a" for x in part) for part in flat)
    by_level = EvalSet("easy", [{"q": i, "level": "hard" if i < 2 else "easy"} for i in range(10)])
    part = subsample(by_level, Subsample(max_prompts=5, stratify_by="level")).samples
    assert sorted(x["level"] for x in part) == ["easy", "easy", "easy", "easy", "hard"]


def test_the_exactly_one_error_carries_its_fields_for_the_config() -> None:
    with pytest.raises(ArgumentError) as info:
        Subsample(max_prompts=3, fraction=0.5)
    assert (info.value.owner, info.value.arg, info.value.value) == ("Subsample", "", (3, 0.5))
    assert info.value.accepted == "needs exactly one of max_prompts and fraction"
