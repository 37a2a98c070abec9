"""Episodes with a `transformers` policy on the math task: the feedback reaches the policy as a user
turn of its chat template, and a round of the default evaluation runs retries on GSM8K rows."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("transformers")

from hf_models import save_tiny_llama, tiny_tokenizer, write_gsm8k

from areal_lightning.eval_round import EvalSet, SamplingParams, run_round
from areal_lightning.rl.engines.hf.policy import HFPolicy
from areal_lightning.rl.engines.hf.tokenizer import HFTokenizer
from areal_lightning.rl.episodes.environments import RetryEnvironment
from areal_lightning.rl.episodes.runner import run_episodes
from areal_lightning.rl.episodes.settings import EpisodeSettings
from areal_lightning.rl.grpo.config import GRPOConfig
from areal_lightning.rl.grpo.module import GRPOModule
from areal_lightning.tasks.math import MathTask

FEEDBACK = "Please answer."  # words the tiny tokenizer knows


def test_an_observation_is_a_user_turn_of_the_chat_template() -> None:
    chat = HFTokenizer(tiny_tokenizer(), chat=True)
    ids = chat.encode_observation(FEEDBACK)
    # The template writes "<role> content " per message: the user turn, then the assistant's prompt.
    assert chat.tokenizer.decode(ids).replace(" ", "") == "<user>Pleaseanswer.<assistant>"
    plain = HFTokenizer(tiny_tokenizer())
    assert plain.encode_observation(FEEDBACK) == plain.tokenizer(FEEDBACK, add_special_tokens=False)["input_ids"]


def test_math_episodes_retry_through_the_chat_template(tmp_path: Path) -> None:
    policy = HFPolicy.from_pretrained(save_tiny_llama(tmp_path / "model", digit_bias=2.0), chat=True)
    task = MathTask(write_gsm8k(tmp_path / "train.jsonl", 6), prompt_style="chat", verifier="numeric")
    env = RetryEnvironment(task, FEEDBACK)
    settings = EpisodeSettings(max_turns=2)
    sampling = SamplingParams(n_samples=2, temperature=1.0)
    samples = task.samples()
    episodes = run_episodes(
        policy, policy.tokenizer, env, samples, range(6), n=2, settings=settings, sampling=sampling, max_new_tokens=6
    )
    retried = [e for e in episodes if e.turns == 2]
    assert retried
    for e in retried:  # turn 2 read: the prompt, the first completion (with its EOS), the feedback as a user turn
        turn_two_context = e.prompt_ids + e.completion_ids[0] + e.observation_ids[0]
        text = policy.tokenizer.tokenizer.decode(turn_two_context).replace(" ", "")
        assert text.endswith("<user>Pleaseanswer.<assistant>")

    module = GRPOModule(policy, task, GRPOConfig(max_new_tokens=6), episodes=settings, environment=env)
    eval_set = EvalSet("gsm8k", samples, batch_size=3, sampling=sampling)
    (result,) = run_round(module, [eval_set], GRPOModule.evaluate, seed=1, global_step=0, epoch=0)
    assert result.num_prompts == 6 and 1.0 <= result.metrics["turns/mean"] <= 2.0
    assert result.metrics["success@1"] <= result.metrics["success@2"] == result.metrics["accuracy"]
