"""Each prompt's story on constructed outcomes, without a Trainer: prompts gained and lost, accuracy
per difficulty bucket (from the first round, or from a stratum field), the pass@k - pass@1 gap, the
names the story may add, and the messages of bad options."""

from __future__ import annotations

import math

import pytest

from areal_lightning.callbacks.prompt_story import (
    PromptStorySettings,
    bucket_means,
    first_round_bucket,
    gained_lost,
    gap_metrics,
    story_metric_names,
    story_metrics,
)
from areal_lightning.errors import ArgumentError

# Four prompts, four samples each: shares of correct samples in three rounds.
ROUND_1 = {0: 0.0, 1: 0.25, 2: 1.0, 3: 0.5}
ROUND_2 = {0: 0.75, 1: 0.0, 2: 1.0, 3: 0.25}  # 0 gained; 3 lost; 1 stays unsolved, 2 solved
ROUND_3 = {0: 0.5, 1: 0.5, 2: 0.25, 3: 0.5}  # 1 and 3 gained; 2 lost


def test_gained_and_lost_count_the_prompts_that_crossed_solved_at() -> None:
    assert gained_lost(ROUND_2, ROUND_1, solved_at=0.5) == (1, 1)
    assert gained_lost(ROUND_3, ROUND_2, solved_at=0.5) == (2, 1)
    # A stricter bar: solved means every sample right.
    assert gained_lost(ROUND_2, ROUND_1, solved_at=1.0) == (0, 0)
    assert gained_lost(ROUND_3, ROUND_2, solved_at=1.0) == (0, 1)


def test_only_prompts_both_rounds_hold_count_and_nan_is_unsolved() -> None:
    assert gained_lost({0: 1.0, 7: 1.0}, {0: 0.0, 8: 0.0}, 0.5) == (1, 0)  # 7 and 8 are in one round each
    assert gained_lost({0: math.nan, 1: 1.0}, {0: 1.0, 1: math.nan}, 0.5) == (1, 1)


def test_first_round_buckets_and_their_accuracy() -> None:
    buckets = {i: first_round_bucket(v) for i, v in ROUND_1.items()}
    assert buckets == {0: "hard", 1: "medium", 2: "easy", 3: "medium"}
    assert first_round_bucket(math.nan) is None
    means = bucket_means(ROUND_3, buckets, ["hard", "medium", "easy"])  # type: ignore[arg-type]
    assert means == {"hard": 0.5, "medium": 0.5, "easy": 0.25}


def test_a_bucket_without_prompts_is_nan_and_nan_outcomes_are_left_out() -> None:
    means = bucket_means({0: 1.0, 1: math.nan, 2: 0.0}, {0: "a", 1: "a", 2: "b"}, ["a", "b", "c"])
    assert means["a"] == 1.0 and means["b"] == 0.0 and math.isnan(means["c"])


def test_bucket_means_do_not_depend_on_the_order_of_the_prompts() -> None:
    values = {i: v for i, v in enumerate([0.1] * 10 + [1e16, 1.0, -1e16])}
    buckets = dict.fromkeys(values, "all")
    reordered = dict(reversed(list(values.items())))
    assert bucket_means(values, buckets, ["all"]) == bucket_means(reordered, buckets, ["all"])
    assert bucket_means(values, buckets, ["all"])["all"] == pytest.approx(2.0 / 13)  # fsum: no 1.0 lost


def test_story_metrics_of_a_round_with_and_without_a_previous_one() -> None:
    buckets = {i: first_round_bucket(v) for i, v in ROUND_1.items()}
    first = story_metrics("accuracy", ROUND_1, None, buckets, ["hard", "medium", "easy"], 0.5)  # type: ignore[arg-type]
    assert first == {
        "accuracy/gained": 0.0,
        "accuracy/lost": 0.0,
        "accuracy/bucket/hard": 0.0,
        "accuracy/bucket/medium": 0.375,
        "accuracy/bucket/easy": 1.0,
    }
    second = story_metrics("accuracy", ROUND_2, ROUND_1, buckets, ["hard", "medium", "easy"], 0.5)  # type: ignore[arg-type]
    assert second["accuracy/gained"] == 1.0 and second["accuracy/lost"] == 1.0
    assert second["accuracy/bucket/hard"] == 0.75 and second["accuracy/bucket/medium"] == 0.125


def test_the_gap_is_pass_at_k_minus_pass_at_1_for_every_k() -> None:
    assert gap_metrics({"pass@1": 0.25, "pass@2": 0.5, "pass@8": 0.875, "pass@8/stderr": 0.1}) == {
        "pass@2/gap": 0.25,
        "pass@8/gap": 0.625,
    }
    assert gap_metrics({"pass@4": 0.5}) == {}  # no pass@1: no gap
    assert gap_metrics({"pass@1": 0.5, "maj@4": 0.5}) == {}


def test_the_names_the_story_may_add_follow_from_the_base_names() -> None:
    base = ["accuracy", "reward/mean", "pass@1", "pass@4", "maj@4"]
    assert story_metric_names(base, PromptStorySettings()) == [
        "accuracy/bucket/easy",
        "accuracy/bucket/hard",
        "accuracy/bucket/medium",
        "accuracy/gained",
        "accuracy/lost",
        "pass@4/gap",
    ]
    strata = PromptStorySettings(metric="reward/mean", buckets="stratum")  # type: ignore[arg-type]
    assert story_metric_names(base, strata, strata=["sum2", "sum1", "sum2"]) == [
        "pass@4/gap",
        "reward/mean/bucket/sum1",
        "reward/mean/bucket/sum2",
        "reward/mean/gained",
        "reward/mean/lost",
    ]
    assert story_metric_names(base, None) == []  # the story off
    assert story_metric_names(["pass@1"], PromptStorySettings()) == []


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"solved_at": 0}, r"^`PromptStorySettings\(solved_at=...\)` must be a number in \(0, 1\], got 0$"),
        ({"metric": ""}, r"^`PromptStorySettings\(metric=...\)` must be a non-empty string, got ''$"),
        ({"max_file_mib": -1}, r"must be a positive number of MiB or None, got -1$"),
    ],
)
def test_bad_options_are_named(options: dict[str, object], message: str) -> None:
    with pytest.raises(ArgumentError, match=message):
        PromptStorySettings(**options)  # type: ignore[arg-type]


def test_a_bucket_source_that_does_not_exist_is_named_with_the_choices() -> None:
    message = r"^Unsupported parameter value `PromptStorySettings\(buckets='strata'\)`. Possible choices are: "
    with pytest.raises(ArgumentError, match=message + "first_round, stratum$"):
        PromptStorySettings(buckets="strata")  # type: ignore[arg-type]


def test_an_outcomes_line_is_the_documented_example_and_every_field_is_documented() -> None:
    import json
    from pathlib import Path

    from areal_lightning.tracking.prompt_outcomes import outcome_row

    outcomes = {"reward/mean": {0: 1.0, 1: 0.25, 2: 0.0}, "accuracy": {2: 0.0, 1: 0.25, 0: 1.0, 3: math.nan}}
    line = outcome_row(120, 1, "easy", outcomes, 4, trigger=["steps"], run_id="k3j9x2a1", time=1764460800.5)
    text = json.dumps(line)
    doc = (Path(__file__).resolve().parents[1] / "docs" / "eval_history.md").read_text()
    assert text in doc
    for field in line:
        assert f"`{field}`" in doc, field
