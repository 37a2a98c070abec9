"""Multi-turn episodes (rl/episodes/runner.py, rl/episodes/environments.py): the conversation as the next turn's
context, per-turn seeds that make an episode the same alone or in any batch, the retry environment
and its discount, and the settings' checks (in Python and in the config, with the key named)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch
from episode_helpers import OddFirstDigit

from areal_lightning.app.config import ConfigError, load_config
from areal_lightning.errors import ArgumentError
from areal_lightning.eval_round import SamplingParams
from areal_lightning.eval_round.sharding import sample_seeds
from areal_lightning.rl.episodes.environments import AREAL_RETRY_FEEDBACK, EpisodeView, Feedback, RetryEnvironment
from areal_lightning.rl.episodes.runner import Episode, run_episodes, turn_seed
from areal_lightning.rl.episodes.settings import EpisodeSettings
from areal_lightning.rl.policy import TinyPolicy
from areal_lightning.tasks.arithmetic import ArithmeticTask, Sample

TASK = ArithmeticTask(train_digits=1, train_size=8, seed=0)
TOK = TASK.tokenizer


def _policy(max_len: int = 40) -> TinyPolicy:
    torch.manual_seed(0)
    return TinyPolicy(
        TOK.vocab_size, d_model=32, n_layers=1, n_heads=2, max_len=max_len, pad_id=TOK.pad_id, eos_id=TOK.eos_id
    )


def _run(policy, env, samples, seeds, *, n=3, max_turns=3, max_new_tokens=4) -> list[Episode]:
    return run_episodes(
        policy,
        TOK,
        env,
        samples,
        seeds,
        n=n,
        settings=EpisodeSettings(max_turns=max_turns),
        sampling=SamplingParams(n_samples=n, temperature=1.0),
        max_new_tokens=max_new_tokens,
    )


def _summary(episodes: Sequence[Episode]) -> list[tuple]:
    return [
        (e.sample.index, e.number, e.completion_ids, e.observation_ids, [f.reward for f in e.feedback])
        for e in episodes
    ]


def test_an_episode_alone_equals_the_same_episode_in_a_batch() -> None:
    policy, env = _policy(), OddFirstDigit()
    samples = TASK.make_samples("episodes", digits=1, size=6)
    seeds = sample_seeds(3, "episodes", [s.index for s in samples])
    together = _run(policy, env, samples, seeds)
    # Episodes end at different turns, so each turn's batch mixes contexts of different lengths.
    assert {e.turns for e in together} == {1, 2, 3}
    alone = [e for s, seed in zip(samples, seeds, strict=True) for e in _run(policy, env, [s], [seed])]
    assert _summary(alone) == _summary(together)
    backwards = _run(policy, env, samples[::-1], seeds[::-1])
    assert sorted(_summary(backwards)) == sorted(_summary(together))


def test_the_conversation_is_the_next_turns_context_and_only_the_policys_tokens_are_its_own() -> None:
    # One token per completion: a two-digit answer is always wrong; a completion that is not EOS gets one.
    samples = TASK.make_samples("context", digits=1, size=4)
    episodes = _run(_policy(), RetryEnvironment(TASK), samples, sample_seeds(1, "context", range(4)), max_new_tokens=1)
    feedback = TOK.encode_observation("=")
    added = 0
    for e in episodes:
        assert e.turns == 3 and e.success_turn is None and e.reward(EpisodeSettings()) == 0.0
        assert e.observations == ["=", "="]
        c = e.completion_ids
        ends = [[] if turn == [TOK.eos_id] else [TOK.eos_id] for turn in c]
        added += sum(map(len, ends))
        assert (
            e.context_ids()
            == TOK.encode(e.sample.prompt) + c[0] + ends[0] + feedback + c[1] + ends[1] + feedback + c[2]
        )
        ids, mine = e.action_ids()
        assert [tok for tok, m in zip(ids, mine, strict=True) if m] == c[0] + c[1] + c[2]
        assert mine == [True] + [False] * len(ends[0] + feedback) + [True] + [False] * len(ends[1] + feedback) + [True]
    assert added > 0


def test_retry_feedback_and_the_discount_of_a_later_right_answer() -> None:
    env = RetryEnvironment(TASK)
    sample = Sample(0, "3+4=", "07")
    wrong, right = env.respond([EpisodeView(sample, ("08",), (), 0), EpisodeView(sample, ("08", "07"), ("=",), 0)])
    assert (wrong.reward, wrong.done, wrong.observation, wrong.correct) == (0.0, False, "=", False)
    assert (right.reward, right.done, right.correct) == (1.0, True, True)
    episode = Episode(sample, 0, 0, TOK.encode(sample.prompt), feedback=[wrong, right], completions=["08", "07"])
    assert episode.success_turn == 2
    assert episode.reward(EpisodeSettings()) == pytest.approx(0.9)  # the documented default turn_discount
    assert episode.reward(EpisodeSettings(turn_discount=0.5)) == 0.5
    assert episode.reward(EpisodeSettings(turn_discount=1.0)) == 1.0
    # A task without a message of its own gets AReaL's; a message given wins.
    assert RetryEnvironment(object()).feedback == AREAL_RETRY_FEEDBACK
    assert RetryEnvironment(TASK, "+").feedback == "+"


def test_an_environment_that_answers_wrongly_is_named() -> None:
    class Silent(OddFirstDigit):
        def respond(self, views):
            return []

    with pytest.raises(ValueError, match=r"^Silent\.respond returned 0 answers for 6 episodes; return one each$"):
        _run(_policy(), Silent(), TASK.make_samples("x", 1, 2), [1, 2])


def test_a_turn_beyond_the_policys_positions_is_refused_before_it_runs() -> None:
    with pytest.raises(
        ValueError,
        match=r"^turn 2 of an episode needs 15 tokens .*max_new_tokens=4\), more than the policy's max_len=14",
    ):
        _run(_policy(max_len=14), RetryEnvironment(TASK), [Sample(0, "3+4=", "07")], [5], max_new_tokens=4)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"max_turns": 0}, r"`EpisodeSettings\(max_turns=\.\.\.\)` must be a positive integer, got 0"),
        ({"turn_discount": 0.0}, r"`EpisodeSettings\(turn_discount=\.\.\.\)` must be a number in \(0, 1\], got 0\.0"),
        ({"env": "chess"}, r"`EpisodeSettings\(env=\.\.\.\)` must be one of retry, python_tool, got 'chess'"),
        ({"feedback": ""}, r"`EpisodeSettings\(feedback=\.\.\.\)` must be a non-empty string or None"),
    ],
)
def test_bad_settings_are_refused_in_python(kwargs, match) -> None:
    with pytest.raises(ArgumentError, match=match):
        EpisodeSettings(**kwargs).validate()


@pytest.mark.parametrize(
    ("override", "match"),
    [
        ("episodes.max_turns=0", r"^episodes\.max_turns must be a positive integer, got 0$"),
        ("episodes.turn_discount=1.5", r"^episodes\.turn_discount must be a number in \(0, 1\], got 1\.5$"),
        ("episodes.env=chess", r"^episodes\.env must be one of retry, python_tool; got 'chess'"),
        ("episodes.maxturns=4", r"unknown config key `episodes\.maxturns`.*Did you mean `max_turns`\?"),
        ("episodes.feedback=wrong", r"^episodes\.feedback must be written in the arithmetic alphabet '0123456789\+='"),
        ("episodes.max_turns=6", r"^policy\.max_len must be at least 39 for episodes\.max_turns=6 .*got 32$"),
        ("evaluator.metric_thresholds={success@3: 0.5}", r"evaluator\.metric_thresholds\.success@3 names a metric"),
        (
            "evaluator.best_metrics={turn3/completion/truncated: min}",
            r"best_metrics\.turn3/completion/truncated names a metric .* Did you mean `turn2/completion/truncated`\?",
        ),
    ],
)
def test_bad_episode_config_is_refused_with_the_key(override, match) -> None:
    with pytest.raises(ConfigError, match=match):
        load_config(None, ["eval_sets.easy.size=4", "episodes.max_turns=2", override])


def test_episode_metric_names_are_accepted_in_thresholds() -> None:
    cfg = load_config(
        None,
        [
            "eval_sets.easy.size=4",
            "episodes.max_turns=4",
            "evaluator.metric_thresholds={success@4: 0.5, turn4/completion/length/p95: 2}",
            "evaluator.best_metrics={completion/truncated: min}",
        ],
    )
    assert cfg.episodes is not None and cfg.episodes.max_turns == 4


def test_episode_settings_are_part_of_each_eval_sets_fingerprint() -> None:
    # The result cache and the drift check key eval sets by fingerprint: MT2 and MT4 results differ.
    from areal_lightning.app.builders import build_eval_sets
    from areal_lightning.eval_round.fingerprint import eval_set_fingerprint

    def fingerprint(*overrides: str) -> str:
        (eval_set,) = build_eval_sets(load_config(None, ["eval_sets.easy.size=4", *overrides]))
        return eval_set_fingerprint(eval_set)

    mt2 = fingerprint("episodes.max_turns=2")
    assert (
        len(
            {
                fingerprint(),
                mt2,
                fingerprint("episodes.max_turns=4"),
                fingerprint("episodes.max_turns=2", "episodes.turn_discount=1"),
            }
        )
        == 4
    )
    assert fingerprint("episodes.max_turns=2") == mt2


def test_lockstep_generation_runs_every_turn_for_every_episode_and_changes_no_episode() -> None:
    # Under sharded parameters every rank must run the same forwards: all episodes, all turns.
    policy, env = _policy(), OddFirstDigit()
    samples = TASK.make_samples("episodes", digits=1, size=6)
    seeds = sample_seeds(3, "episodes", [s.index for s in samples])
    rows_per_call: list[int] = []
    generate = policy.generate_scored  # what the episode runner calls

    def counting(ids, mask, **kwargs):
        rows_per_call.append(ids.shape[0])
        return generate(ids, mask, **kwargs)

    policy.generate_scored = counting  # type: ignore[method-assign]
    settings, sampling = EpisodeSettings(max_turns=3), SamplingParams(n_samples=3, temperature=1.0)
    kwargs = {"n": 3, "settings": settings, "sampling": sampling, "max_new_tokens": 4}
    lockstep = run_episodes(policy, TOK, env, samples, seeds, lockstep=True, **kwargs)
    assert rows_per_call == [18, 18, 18]
    rows_per_call.clear()
    assert _summary(run_episodes(policy, TOK, env, samples, seeds, **kwargs)) == _summary(lockstep)
    assert rows_per_call[0] == 18 and rows_per_call[-1] < 18  # finished episodes are left out


class ContextBlindDigits:
    """A policy of its own that writes digits drawn from each row's generator alone, whatever the
    conversation: two turns that sampled from the same seed write the same completion."""

    def __init__(self) -> None:
        self.digits = torch.tensor([TOK.encode(d)[-1] for d in "0123456789"])

    def generate(self, prompt_ids, prompt_mask, *, max_new_tokens, generators, **sampling) -> torch.Tensor:
        draws = [torch.randint(len(self.digits), (max_new_tokens,), generator=g) for g in generators]
        return self.digits[torch.stack(draws)]


class NeverDone:
    """Every completion is wrong: "=" and another try, until the turn limit."""

    uses_tools = False

    def first_prompt(self, sample: Sample) -> str:
        return sample.prompt

    def respond(self, views: Sequence[EpisodeView]) -> list[Feedback]:
        return [Feedback(0.0, done=False, observation="=", correct=False) for _ in views]


def test_each_turn_samples_from_its_own_seed_of_the_samples_seed_the_episode_and_the_turn() -> None:
    policy, env = ContextBlindDigits(), NeverDone()
    samples = TASK.make_samples("turn-seeds", digits=1, size=4)
    seeds = sample_seeds(5, "episodes", [s.index for s in samples])
    together = _run(policy, env, samples, seeds, max_turns=4, max_new_tokens=6)  # 3 episodes a sample
    assert [e.turns for e in together] == [4] * 12

    def drawn(seed: int) -> list[int]:
        g = torch.Generator().manual_seed(seed)
        return policy.digits[torch.randint(10, (6,), generator=g)].tolist()

    for e in together:
        assert e.completion_ids == [drawn(turn_seed(e.seed, e.number, t)) for t in range(4)]
    # Every turn of every episode wrote its own draw: no two turns (of one episode or of two) share a seed.
    written = [tuple(ids) for e in together for ids in e.completion_ids]
    assert len(set(written)) == len(written) == 48

    # The same on any rank, alone or in a batch: one sample at a time, two shards, or reversed.
    def run(part: slice) -> list[Episode]:
        return _run(policy, env, samples[part], seeds[part], max_turns=4, max_new_tokens=6)

    alone = [e for i in range(4) for e in run(slice(i, i + 1))]
    shards = [*run(slice(0, 2)), *run(slice(2, 4))]
    backwards = run(slice(None, None, -1))
    assert _summary(alone) == _summary(shards) == _summary(together) == sorted(_summary(backwards))
