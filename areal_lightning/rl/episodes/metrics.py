"""The metrics an episode evaluation keeps, by name: success within t turns, turns, tool use, and
the completion statistics per turn and over all turns (rl/episodes/completions.py).

Every one is a sum of integer counts or an exact mean (float64 states), so a round gives the same
numbers on any number of ranks.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor
from torchmetrics import Metric, SumMetric

from areal_lightning.metrics import AccuracyMetric, ExactMean, PassAtK, RewardMetric
from areal_lightning.rl.episodes.completions import episode_completion_metrics

TURNS_KEY = "turns/mean"
"""Mean number of turns per episode (completions the policy wrote)."""
TOOL_KEYS = ("tool/calls", "tool/errors", "tool/timeouts")
"""Programs run in the round, those that failed (raised, crashed, ran out of memory, did not compile) and
those that ran out of time."""


EPISODE_SUMMARY_METRICS = ("success@*", TURNS_KEY)
"""The metrics of each round's line in the console for episodes: success within each t turns, turns."""


def success_key(turns: int) -> str:
    """``success@t``: the share of episodes solved within `turns` turns."""
    return f"success@{turns}"


class SuccessWithin(AccuracyMetric):
    """The share of episodes solved within `turns` turns, with its Wilson interval.

    ``update`` takes each episode's first successful turn (from 1; 0 for none). ``compute()``
    returns ``{"success@<turns>", "ci_low", "ci_high"}``, so a round logs ``success@2``,
    ``success@2/ci_low`` and ``success@2/ci_high``.

    Example:
        >>> m = SuccessWithin(2)
        >>> m.update(torch.tensor([1, 2, 3, 0]))
        >>> round(m.compute()["success@2"].item(), 2)
        0.5
    """

    def __init__(self, turns: int, **kwargs: Any) -> None:
        super().__init__(threshold=0.5, **kwargs)
        self.turns = turns

    def update(self, success_turns: Tensor) -> None:
        """Count the episodes whose first success came at a turn in 1..turns."""
        within = (success_turns >= 1) & (success_turns <= self.turns)
        super().update(within.double())

    def compute(self) -> dict[str, Tensor]:
        values = super().compute()
        return {success_key(self.turns): values.pop("accuracy"), **values}


def _float64_sum() -> Metric:
    return SumMetric(nan_strategy="disable").set_dtype(torch.float64)


def episode_metrics(
    n_samples: int, max_turns: int, uses_tools: bool, max_new_tokens: int = 1
) -> dict[str, Callable[[], Metric]]:
    """The metrics of an episode evaluation with `n_samples` episodes per prompt, by name.

    ``reward``: the discounted episode rewards; ``accuracy``: success within ``max_turns``;
    ``pass@1`` / ``pass@n``: of the episodes' successes; ``success@t`` for t = 1..max_turns;
    ``turns/mean``; for an environment that uses tools, ``tool/calls``, ``tool/errors``,
    ``tool/timeouts`` (counts over the round); and the completion statistics of completions of at
    most `max_new_tokens` tokens, ``completion/...`` and ``turn<t>/completion/...``.
    """
    factories: dict[str, Callable[[], Metric]] = {"reward": RewardMetric, "accuracy": AccuracyMetric}
    for k in sorted({1, n_samples}):
        factories[f"pass@{k}"] = functools.partial(PassAtK, k)
    for t in range(1, max_turns + 1):
        factories[success_key(t)] = functools.partial(SuccessWithin, t)
    factories[TURNS_KEY] = ExactMean
    if uses_tools:
        for key in TOOL_KEYS:
            factories[key] = _float64_sum
    factories.update(episode_completion_metrics(max_turns, max_new_tokens))
    return factories


def episode_metric_names(n_samples: int, max_turns: int, uses_tools: bool) -> list[str]:
    """Every name an episode evaluation logs for an eval set, known before any round (for the
    config's check of threshold and best-metric names).

    Example:
        >>> [n for n in episode_metric_names(4, 2, False) if n.startswith(("success@2", "turns", "turn2/completion/l"))]
        ['success@2', 'success@2/ci_high', 'success@2/ci_low', 'turn2/completion/length/max', \
'turn2/completion/length/mean', 'turn2/completion/length/p50', 'turn2/completion/length/p95', \
'turn2/completion/logprob', 'turns/mean']
    """
    names = []
    for name, factory in episode_metrics(n_samples, max_turns, uses_tools).items():
        metric = factory()
        metric.distributed_available_fn = _never  # local names only: a config check may run on one rank
        if isinstance(metric, PassAtK):
            metric.update(torch.ones(1, metric.k, dtype=torch.bool))
        else:
            metric.update(torch.ones(1, dtype=torch.float64))
        value = metric.compute()
        keys = value.keys() if isinstance(value, dict) else [name]
        names += [key if key == name else f"{name}/{key}" for key in keys]
    return sorted(names)


def _never() -> bool:
    return False
