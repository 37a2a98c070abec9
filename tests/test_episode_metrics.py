"""An episode evaluation's metrics without a round: which are made for a set's settings, success
within t turns at its boundaries, the tools' counts, and the names a config check accepts.
(`test_episode_eval.py` computes them in a round.)"""

from __future__ import annotations

import torch

from areal_lightning.metrics import PassAtK
from areal_lightning.rl.episodes.metrics import SuccessWithin, episode_metric_names, episode_metrics


def test_success_within_counts_first_successes_from_turn_one_up_to_its_turns() -> None:
    # first successful turn of each episode: 0 is none, t is turn t
    turns = torch.tensor([0, 1, 2, 3, 4, 2, 0, 1])
    values = {}
    for t in (1, 2, 3):
        metric = SuccessWithin(t)
        metric.update(turns)
        values[t] = metric.compute()
    assert [values[t][f"success@{t}"].item() for t in (1, 2, 3)] == [2 / 8, 4 / 8, 5 / 8]
    assert set(values[2]) == {"success@2", "ci_low", "ci_high"}
    assert values[2]["ci_low"] < 0.5 < values[2]["ci_high"]


def test_a_sets_metrics_follow_its_samples_turns_and_tools() -> None:
    plain = episode_metrics(n_samples=4, max_turns=2, uses_tools=False, max_new_tokens=5)
    base = ["reward", "accuracy", "pass@1", "pass@4", "success@1", "success@2", "turns/mean"]
    assert list(plain)[: len(base)] == base
    assert [k for k in plain if not k.startswith(("completion/", "turn1/", "turn2/"))] == base
    assert {k for k in plain if k.startswith("turn")} == {"turns/mean"} | {
        f"turn{t}/{k}" for t in (1, 2) for k in plain if k.startswith("completion/")
    }
    assert [(f().k if isinstance(f(), PassAtK) else None) for k, f in plain.items() if k.startswith("pass@")] == [1, 4]
    one = episode_metrics(n_samples=1, max_turns=1, uses_tools=True)
    assert [k for k in one if not k.startswith(("completion/", "turn1/"))] == [
        "reward",
        "accuracy",
        "pass@1",
        "success@1",
        "turns/mean",
        "tool/calls",
        "tool/errors",
        "tool/timeouts",
    ]


def test_the_completion_lengths_histogram_has_the_sets_max_new_tokens() -> None:
    lengths = episode_metrics(2, 1, False, max_new_tokens=7)["completion/length"]()
    lengths.update(torch.tensor([7]))  # the longest completion the set allows
    assert lengths.compute()["max"].item() == 7


def test_tool_counts_add_up_exactly_in_float64() -> None:
    calls = episode_metrics(2, 1, True)["tool/calls"]()
    calls.update(torch.tensor([2.0**53]))
    calls.update(torch.tensor([1.0]))
    value = calls.compute()
    assert value.dtype == torch.float64 and value.item() == 2.0**53 + 1
    nan = episode_metrics(2, 1, True)["tool/errors"]()
    nan.update(torch.tensor([float("nan")]))  # kept, not dropped: a NaN count is a bug to see
    assert torch.isnan(nan.compute())


def test_the_names_a_config_may_name_are_those_the_metrics_log() -> None:
    names = episode_metric_names(3, 2, True)
    assert names == sorted(names) and len(names) == len(set(names))
    for expected in (
        "reward/mean",
        "accuracy",
        "accuracy/ci_low",
        "pass@1",
        "pass@3",
        "success@2/ci_high",
        "turns/mean",
        "tool/calls",
        "tool/timeouts",
        "turn2/completion/length/p95",
        "completion/truncated",
    ):
        assert expected in names, expected
    assert "pass@2" not in names and "success@3" not in names and "turn3/completion/truncated" not in names
    assert not any(n.startswith("tool/") for n in episode_metric_names(3, 2, False))


def test_success_within_takes_the_accuracy_metrics_options() -> None:
    wide, narrow = SuccessWithin(2), SuccessWithin(2, confidence=0.5)
    for metric in (wide, narrow):
        metric.update(torch.tensor([1, 0, 2, 3]))
    w, n = wide.compute(), narrow.compute()
    assert w["success@2"] == n["success@2"] == 0.5
    assert w["ci_low"] < n["ci_low"] < 0.5 < n["ci_high"] < w["ci_high"]
