"""The completion statistics of episodes (docs/round_statistics.md), per turn and over all turns.

``turn<t>/completion/...`` reads the completions written at turn t, one per episode that reached
turn t; ``completion/...`` reads every turn's completions together, as a single-turn round reads its
completions. The metrics and their update are `rl.completion_stats`'s own: this module only groups
the episodes' completions (`Episode.generations`) by turn.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence

import torch
from torch import Tensor
from torchmetrics import Metric

from areal_lightning.rl.completion_stats import (
    completion_metrics,
    computed_over_ranks,
    logged_values,
    update_completion_metrics,
)
from areal_lightning.rl.engines.generation import Generation
from areal_lightning.rl.episodes.runner import Episode

TURN_PREFIX = "turn"
Scores = tuple[Tensor, Tensor, Tensor]
COMPUTE_BEFORE_UPDATE = r".*``compute`` method of metric \w+ was called before the ``update`` method"


def turn_name(turn: int, name: str) -> str:
    """The name of statistic `name` over the completions written at `turn` (from 1).

    Example:
        >>> turn_name(2, "completion/length")
        'turn2/completion/length'
    """
    return f"{TURN_PREFIX}{turn}/{name}"


def episode_completion_metrics(max_turns: int, max_new_tokens: int) -> dict[str, Callable[[], Metric]]:
    """`completion_metrics` over all turns, then under `turn_name` for each turn 1..`max_turns`.

    Example:
        >>> names = episode_completion_metrics(2, 4)
        >>> "completion/truncated" in names, "turn2/completion/truncated" in names, len(names)
        (True, True, 18)
    """
    single = completion_metrics(max_new_tokens)
    factories = dict(single)
    for turn in range(1, max_turns + 1):
        factories.update({turn_name(turn, name): factory for name, factory in single.items()})
    return factories


def _cat(generations: Sequence[Generation]) -> Generation:
    """The rows of `generations` (one or more) as one `Generation`."""

    def cat(parts: list[Tensor | None]) -> Tensor | None:
        return None if any(p is None for p in parts) else torch.cat(parts)  # type: ignore[arg-type]

    tokens, stopped = torch.cat([g.tokens for g in generations]), torch.cat([g.stopped for g in generations])
    logprobs, entropy = cat([g.logprobs for g in generations]), cat([g.entropy for g in generations])
    return Generation(tokens, stopped, logprobs, entropy, cat([g.scored for g in generations]))


def turn_completions(
    episodes: Sequence[Episode], turn: int, answer_id: Callable[[str], int]
) -> tuple[Generation, list[int], Tensor] | None:
    """The completions written at `turn` (from 1) by the episodes that reached it, in episode order:
    the `Generation`, the task's answer id of each (`answer_id` of its text) and whether its text held a
    stop string; None when no episode reached `turn`."""
    reached = [e for e in episodes if e.turns >= turn]
    if not reached:
        return None
    generation = _cat([e.generations[turn - 1] for e in reached])
    answers = [answer_id(e.completions[turn - 1]) for e in reached]
    return generation, answers, torch.tensor([e.stop_in_text[turn - 1] for e in reached], dtype=torch.bool)


def _of_turn(metrics: Mapping[str, Metric], turn: int | None) -> dict[str, Metric]:
    """`metrics` of `turn` (None: all turns) under their single-turn names (``completion/length`` ...)."""
    return {name: metrics[name if turn is None else turn_name(turn, name)] for name in completion_metrics(1)}


def update_episode_completion_metrics(
    metrics: Mapping[str, Metric],
    episodes: Sequence[Episode],
    max_turns: int,
    eos_id: int,
    answer_id: Callable[[str], int],
    scores: Scores | None = None,
) -> None:
    """Adds the completions of `episodes` to `metrics` (named as `episode_completion_metrics`): each
    turn's to its own statistics and to those of all turns.

    Args:
        answer_id: the task's answer id of a completion's text (``NO_ANSWER`` for none).
        scores: ``(logprobs, entropy, turns)`` over the episodes' action tokens (``[episodes, actions]``,
            ``turns`` the turn of each token from 1, 0 on observations: `Episode.action_turns`) to use
            instead of the engine's (training: the loss's forward).
    """
    for turn in range(1, max_turns + 1):
        completions = turn_completions(episodes, turn, answer_id)
        if completions is None:
            continue
        generation, answers, stop_in_text = completions
        own = None if scores is None else (scores[0], scores[1], scores[2] == turn)
        for group in (turn, None):
            update_completion_metrics(_of_turn(metrics, group), generation, eos_id, answers, stop_in_text, own)


def step_episode_completion_stats(
    metrics: Mapping[str, Metric],
    episodes: Sequence[Episode],
    max_turns: int,
    eos_id: int,
    answer_id: Callable[[str], int],
    scores: Scores,
) -> dict[str, Tensor]:
    """``train/completion/...`` and ``train/turn<t>/completion/...`` of one training step's episodes
    over every rank's, as `step_completion_stats` gives single-turn training's: `metrics` are reset,
    updated (`update_episode_completion_metrics`) and computed over the ranks in one gather, so every
    rank must call it (as every rank runs each training step)."""
    for metric in metrics.values():
        metric.reset()
    update_episode_completion_metrics(metrics, episodes, max_turns, eos_id, answer_id, scores)
    with warnings.catch_warnings():
        # A turn no episode of this rank reached had no update; its compute still takes part (NaN
        # when no rank's episode reached it), as the round computes its metrics.
        warnings.filterwarnings("ignore", message=COMPUTE_BEFORE_UPDATE)
        return logged_values(computed_over_ranks(metrics))
