"""The completion statistics of episodes per turn and over all turns (rl/episodes/completions.py): a
constructed batch of episodes against a hand count, in the evaluation's update (the engine's scores)
and in the training step's (the loss's scores), and the training step's the same on one process and
on two gloo ranks, one of which has no episode that reached turn 3."""

from __future__ import annotations

import math

import pytest
import torch
from ddp_utils import run_ddp

from areal_lightning.rl.engines.generation import Generation
from areal_lightning.rl.episodes.completions import (
    episode_completion_metrics,
    step_episode_completion_stats,
    update_episode_completion_metrics,
)
from areal_lightning.rl.episodes.runner import Episode
from areal_lightning.rl.episodes.training import pad_right
from areal_lightning.tasks.arithmetic import ArithmeticTask

TASK = ArithmeticTask(train_digits=1, train_size=8, seed=0)
TOK = TASK.tokenizer
EOS = TOK.eos_id
WIDTH = 4  # max_new_tokens
MAX_TURNS = 4  # no episode reaches turn 4
OBSERVATION_LOGP = 100.0  # on observation tokens: counted anywhere, it would show in every mean


def _turn(text: str, eos: bool, logp: float, shown: str | None = None) -> tuple[list[int], str, float, bool]:
    """A turn that sampled `text` (then an EOS when `eos`), each token at log-probability `logp`; its
    text after the stop-string cut is `shown` (None: `text`, not cut)."""
    tokens = [*TOK.encode_observation(text), *([EOS] if eos else [])]
    return tokens, text if shown is None else shown, logp, shown is not None


# (tokens, text, logprob of each token, text cut at a stop string); lengths count the EOS.
EPISODES = [
    [_turn("07", True, -1.0)],  # length 3, answered
    [_turn("1+2+", False, -0.5), _turn("8", True, -2.0)],  # 4: truncated, no answer; then 2
    # 1, no answer; 4 without an EOS, but its text held a stop string; 3
    [_turn("", True, -4.0), _turn("1234", False, -1.0, shown="12"), _turn("99", True, -3.0)],
]
EXPECTED = {
    "turn1/completion/length/mean": 8 / 3,
    "turn1/completion/length/p50": 3.0,
    "turn1/completion/length/p95": 4.0,
    "turn1/completion/length/max": 4.0,
    "turn1/completion/truncated": 1 / 3,
    "turn1/completion/stopped": 0.0,
    "turn1/completion/no_answer": 2 / 3,
    "turn1/completion/logprob": (3 * -1.0 + 4 * -0.5 + -4.0) / 8,
    "turn2/completion/length/mean": 3.0,
    "turn2/completion/length/p50": 2.0,
    "turn2/completion/length/max": 4.0,
    "turn2/completion/truncated": 0.0,  # the 4 tokens without an EOS ended at a stop string
    "turn2/completion/stopped": 1 / 2,
    "turn2/completion/no_answer": 0.0,
    "turn2/completion/logprob": (2 * -2.0 + 4 * -1.0) / 6,
    "turn3/completion/length/mean": 3.0,
    "turn3/completion/truncated": 0.0,
    "turn3/completion/logprob": -3.0,
    "turn4/completion/length/mean": math.nan,  # no episode wrote a fourth completion
    "turn4/completion/truncated": math.nan,
    "turn4/completion/logprob": math.nan,
    "completion/length/mean": 17 / 6,
    "completion/length/p50": 3.0,
    "completion/length/p95": 4.0,
    "completion/truncated": 1 / 6,
    "completion/stopped": 1 / 6,
    "completion/no_answer": 2 / 6,
    "completion/logprob": (3 * -1.0 + 4 * -0.5 + 2 * -2.0 - 4.0 + 4 * -1.0 + 3 * -3.0) / 17,
}


def _episodes(scores: bool) -> list[Episode]:
    """`EPISODES` as the runner leaves them (one-row generations, with the engine's scores when `scores`);
    a one-token observation follows each turn but the last."""
    episodes = []
    for number, turns in enumerate(EPISODES):
        episode = Episode(sample=None, seed=0, number=number, prompt_ids=TOK.encode("1+1="))
        for i, (tokens, text, logp, cut) in enumerate(turns):
            row = torch.tensor([[*tokens, *[TOK.pad_id] * (WIDTH - len(tokens))]])
            sampled = torch.arange(WIDTH)[None] < len(tokens)
            values = torch.where(sampled, logp, 0.0)
            episode.generations.append(
                Generation(row, torch.zeros(1, dtype=torch.bool), *((values, -values / 2, sampled) if scores else ()))
            )
            episode.completion_ids.append(tokens)
            episode.completions.append(text)
            episode.stop_in_text.append(cut)
            if i < len(turns) - 1:
                episode.observation_ids.append(TOK.encode_observation("="))
        episodes.append(episode)
    return episodes


def _assert_expected(values: dict[str, float], prefix: str = "") -> None:
    """`values` hold `EXPECTED` (under `prefix`), and each entropy is minus half its log-probability."""
    expected = dict(EXPECTED)
    expected.update({k.replace("logprob", "entropy"): -v / 2 for k, v in EXPECTED.items() if k.endswith("logprob")})
    for name, want in expected.items():
        got = values[prefix + name]
        assert (math.isnan(got) and math.isnan(want)) or got == pytest.approx(want, abs=1e-12), name


@pytest.mark.filterwarnings("ignore:The ``compute`` method")  # turn 4: no update, NaN
def test_each_turns_statistics_count_the_episodes_that_reached_it() -> None:
    metrics = {name: make() for name, make in episode_completion_metrics(MAX_TURNS, WIDTH).items()}
    update_episode_completion_metrics(metrics, _episodes(scores=True), MAX_TURNS, EOS, TASK.answer_id)
    values: dict[str, float] = {}
    for name, metric in metrics.items():
        value = metric.compute()
        items = value.items() if isinstance(value, dict) else [(None, value)]
        values.update({name if key is None else f"{name}/{key}": float(v) for key, v in items})
    _assert_expected(values)


def _training_stats(rank: int, world_size: int) -> dict[str, float]:
    """The training step's statistics of this rank's share of `EPISODES` (the loss's scores: observation
    tokens hold `OBSERVATION_LOGP`, which no statistic may read)."""
    episodes = _episodes(scores=False)[rank::world_size]
    turns = pad_right([e.action_turns() for e in episodes], 0, torch.long)
    logp = torch.full(turns.shape, OBSERVATION_LOGP)
    for row, episode in enumerate(episodes):
        for turn, (tokens, _, value, _) in enumerate(EPISODES[episode.number], start=1):
            logp[row][turns[row] == turn] = value
            assert int((turns[row] == turn).sum()) == len(tokens)
    metrics = {name: make() for name, make in episode_completion_metrics(MAX_TURNS, WIDTH).items()}
    scores = (logp, -logp / 2, turns)
    stats = step_episode_completion_stats(metrics, episodes, MAX_TURNS, EOS, TASK.answer_id, scores)
    return {name: float(value) for name, value in stats.items()}


@pytest.mark.ddp
def test_the_training_steps_statistics_per_turn_are_the_same_on_two_ranks() -> None:
    alone = _training_stats(0, 1)
    _assert_expected(alone, prefix="train/")
    # Rank 0 holds the first and the third episode, rank 1 the second: turn 3 only on rank 0.
    for ranked in run_ddp(_training_stats, 2):
        assert ranked.keys() == alone.keys()
        assert all(ranked[k] == alone[k] or (math.isnan(ranked[k]) and math.isnan(alone[k])) for k in alone)
