"""Multi-turn episodes: the policy writes, the environment answers, until it is done or ``max_turns``.

The whole conversation is the next turn's context, as token ids: the first prompt (through the
tokenizer, its chat template when prompts use it), then each completion as it was generated (up to
and including its EOS), then the observation that followed it (`encode_observation`: for a chat
tokenizer, the template's user turn and the assistant's generation prompt). A completion cut at
``max_new_tokens`` gets an EOS before the observation, as AReaL's multi-turn workflow adds one.

Every turn of every episode samples from its own seed (`turn_seed`: the sample's seed, the
episode's number among the sample's ``n`` and the turn), so an episode is the same on any rank,
alone or in a batch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from areal_lightning.eval_round import SamplingParams, cut_at_stop
from areal_lightning.eval_round.sharding import sample_seed
from areal_lightning.rl.engines.generation import Generation, generate_scored
from areal_lightning.rl.episodes.environments import EpisodeView, Feedback, check_feedback
from areal_lightning.rl.episodes.settings import EpisodeSettings
from areal_lightning.rl.protocols import seeded_generators

TURN_STREAM = "episode"
ENV_STREAM = "episode-env"


def turn_seed(seed: int, episode: int, turn: int) -> int:
    """The sampling seed of `turn` (from 0) of episode number `episode` (from 0) of a sample whose
    seed is `seed`; the environment's own seed of that turn comes from `env_seed`.

    Example:
        >>> turn_seed(7, 0, 1) == turn_seed(7, 0, 1) != turn_seed(7, 1, 1)
        True
    """
    return sample_seed(seed, f"{TURN_STREAM}/{episode}", turn)


def env_seed(seed: int, episode: int, turn: int) -> int:
    """The seed `EpisodeView.seed` hands the environment for that turn (apart from the sampling seed)."""
    return sample_seed(seed, f"{ENV_STREAM}/{episode}", turn)


@dataclass
class Episode:
    """One episode: its prompt's tokens, each turn's completion and observation, and the answers."""

    sample: Any
    seed: int
    number: int
    prompt_ids: list[int]
    completion_ids: list[list[int]] = field(default_factory=list)
    observation_ids: list[list[int]] = field(default_factory=list)
    completions: list[str] = field(default_factory=list)
    observations: list[str] = field(default_factory=list)
    feedback: list[Feedback] = field(default_factory=list)
    done: bool = False
    generations: list[Generation] = field(default_factory=list, repr=False, compare=False)
    """Each turn's completion as the engine returned it (a one-row `Generation` on the CPU, with the
    engine's scores when asked for): what the completion statistics read (rl/episodes/completions.py)."""
    stop_in_text: list[bool] = field(default_factory=list, compare=False)
    """Each turn's completion text held one of the sampling's stop strings (and was cut there)."""

    @property
    def turns(self) -> int:
        return len(self.completions)

    @property
    def success_turn(self) -> int | None:
        """The first turn (from 1) the environment called correct; None when none was."""
        return next((t + 1 for t, f in enumerate(self.feedback) if f.correct), None)

    def reward(self, settings: EpisodeSettings) -> float:
        """Each turn's reward times ``turn_discount ** (turn - 1)``, summed over the turns."""
        return sum(settings.discount(t) * f.reward for t, f in enumerate(self.feedback))

    def context_ids(self) -> list[int]:
        """What the policy reads before its next turn: the prompt, then each completion and observation."""
        ids, _ = self.action_ids()
        return [*self.prompt_ids, *ids]

    def action_ids(self) -> tuple[list[int], list[bool]]:
        """The tokens after the prompt, and True on those the policy wrote (False on observations)."""
        ids: list[int] = []
        mine: list[bool] = []
        for turn, completion in enumerate(self.completion_ids):
            ids += completion
            mine += [True] * len(completion)
            if turn < len(self.observation_ids):
                ids += self.observation_ids[turn]
                mine += [False] * len(self.observation_ids[turn])
        return ids, mine

    def action_turns(self) -> list[int]:
        """For each token of `action_ids`, the turn (from 1) whose completion it belongs to; 0 on observations."""
        turns: list[int] = []
        for turn, completion in enumerate(self.completion_ids):
            turns += [turn + 1] * len(completion)
            if turn < len(self.observation_ids):
                turns += [0] * len(self.observation_ids[turn])
        return turns

    def transcript(self) -> str:
        """The turns as text, observations in brackets: ``08 [=] 07``."""
        parts = []
        for turn, completion in enumerate(self.completions):
            parts.append(completion)
            if turn < len(self.observations):
                parts.append(f"[{self.observations[turn]}]")
        return " ".join(parts)


def _encoder(tokenizer: Any) -> Any:
    encode = getattr(tokenizer, "encode_observation", None)
    if not callable(encode):
        raise TypeError(
            f"multi-turn episodes need a tokenizer with encode_observation(text); {type(tokenizer).__name__} has "
            "none (CharTokenizer and HFTokenizer have it)"
        )
    return encode


def _check_length(policy: Any, contexts: Sequence[list[int]], max_new_tokens: int, turn: int) -> None:
    max_len = getattr(policy, "max_len", None)
    # Where the limit comes from, in the words of what the user raises (a server engine names its servers').
    limit = getattr(policy, "max_len_name", None)
    what, key = ("the policy's max_len", "policy.max_len") if limit is None else (limit, limit)
    needed = max(len(c) for c in contexts) + max_new_tokens
    if isinstance(max_len, int) and needed > max_len:
        raise ValueError(
            f"turn {turn + 1} of an episode needs {needed} tokens (the conversation so far plus max_new_tokens="
            f"{max_new_tokens}), more than {what}={max_len}; raise {key} or lower "
            "episodes.max_turns or max_new_tokens"
        )


def _generate(
    policy: Any,
    tokenizer: Any,
    rows: Sequence[Episode],
    turn: int,
    sampling: SamplingParams,
    max_new_tokens: int,
    device: Any,
    lockstep: bool,
    scores: bool,
) -> Generation:
    """One turn's completions of `rows`, on the CPU. The engine is not stopped at the stop strings
    (the text is cut at them afterwards), so the next turn's context holds every generated token."""
    contexts = [e.context_ids() for e in rows]
    _check_length(policy, contexts, max_new_tokens, turn)
    ids, mask = tokenizer.pad_left(contexts)
    generators = seeded_generators([turn_seed(e.seed, e.number, turn) for e in rows], device)
    generation = generate_scored(
        policy,
        ids.to(device),
        mask.to(device),
        scores=scores,
        max_new_tokens=max_new_tokens,
        temperature=sampling.temperature,
        generators=generators,
        top_p=sampling.top_p,
        top_k=sampling.top_k,
        stop_at_eos=not lockstep,
    )
    return _map(generation, lambda x: x.cpu())


def _map(generation: Generation, fn: Callable[[torch.Tensor], torch.Tensor]) -> Generation:
    """`generation` with `fn` applied to each of its tensors (the scores where it has them)."""

    def optional(x: torch.Tensor | None) -> torch.Tensor | None:
        return None if x is None else fn(x)

    g = generation
    return Generation(fn(g.tokens), fn(g.stopped), optional(g.logprobs), optional(g.entropy), optional(g.scored))


def _row(generation: Generation, row: int) -> Generation:
    """Row `row` of `generation` as a one-row `Generation`."""
    return _map(generation, lambda x: x[row : row + 1])


def _completion(row: torch.Tensor, eos_id: int) -> list[int]:
    """The generated ids up to and including the first EOS (all of them when there is none)."""
    ids = row.tolist()
    return ids[: ids.index(eos_id) + 1] if eos_id in ids else ids


def _add_completions(rows: Sequence[Episode], generated: Generation, tokenizer: Any, stop: Sequence[str]) -> None:
    """Each running episode's completion of the turn: its ids up to the EOS, its text cut at the stop
    strings, and its row of the engine's `Generation`."""
    for i, (episode, row) in enumerate(zip(rows, generated.tokens, strict=True)):
        if episode.done:
            continue  # lockstep: an ended episode's row is dropped
        text = tokenizer.decode(row)
        episode.completion_ids.append(_completion(row, tokenizer.eos_id))
        episode.completions.append(cut_at_stop(text, stop))
        episode.generations.append(_row(generated, i))
        episode.stop_in_text.append(len(episode.completions[-1]) < len(text))


def run_episodes(
    policy: Any,
    tokenizer: Any,
    env: Any,
    samples: Sequence[Any],
    seeds: Sequence[int],
    *,
    n: int,
    settings: EpisodeSettings,
    sampling: SamplingParams,
    max_new_tokens: int,
    device: torch.device | str = "cpu",
    lockstep: bool = False,
    scores: bool = False,
) -> list[Episode]:
    """`n` episodes per sample, in order (sample 0's episodes 0..n-1, then sample 1's ...).

    Each turn generates for the episodes still running, in one batch; `lockstep` (sharded
    parameters) generates for every episode at every turn, all ``max_new_tokens`` steps, so that all
    ranks run the same number of forwards (the finished episodes' extra completions are dropped).
    Each turn's completion is kept as the engine returned it (`Episode.generations`), with the
    engine's per-token scores when `scores` (`rl.engines.generation`).

    Raises:
        ValueError: a turn's context plus `max_new_tokens` exceeds the policy's ``max_len``, or the
            environment answered wrongly (`check_feedback`).
        TypeError: the tokenizer has no ``encode_observation``.
    """
    encode_observation = _encoder(tokenizer)
    eos = tokenizer.eos_id
    episodes = [
        Episode(sample, int(seed), j, list(tokenizer.encode(env.first_prompt(sample))))
        for sample, seed in zip(samples, seeds, strict=True)
        for j in range(n)
    ]
    for turn in range(settings.max_turns):
        active = [e for e in episodes if not e.done]
        if not active and not lockstep:
            break
        rows = episodes if lockstep else active
        generated = _generate(policy, tokenizer, rows, turn, sampling, max_new_tokens, device, lockstep, scores)
        _add_completions(rows, generated, tokenizer, sampling.stop)
        if not active:
            continue
        views = [
            EpisodeView(e.sample, tuple(e.completions), tuple(e.observations), env_seed(e.seed, e.number, turn))
            for e in active
        ]
        answers = check_feedback(env, views, env.respond(views))
        last = turn == settings.max_turns - 1
        for episode, answer in zip(active, answers, strict=True):
            episode.feedback.append(answer)
            if answer.done or last:
                episode.done = True
                continue
            ended = episode.completion_ids[-1][-1:] == [eos]
            episode.observations.append(answer.observation)
            episode.observation_ids.append(([] if ended else [eos]) + list(encode_observation(answer.observation)))
    return episodes
