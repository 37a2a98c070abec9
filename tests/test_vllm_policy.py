"""The vLLM backend on the CPU build with a tiny random Llama: greedy completions equal
`HFPolicy`'s token for token; a sampled prompt's completions are the same alone and in a batch of
64; weights pushed after training steps give the new greedy completions (prompts long enough to
hit the prefix cache included), and unchanged weights are not pushed again; the caller's RNG
states are the same after the engine started and sampled."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch
from hf_models import save_tiny_llama
from vllm_helpers import CPU_OPTIONS, HIDDEN, require_vllm

from areal_lightning.rl.engines.hf.policy import HFPolicy
from areal_lightning.rl.engines.vllm.evaluator import VLLMEngine, _EnginePolicy
from areal_lightning.rl.policy import completion_mask

require_vllm()

MAX_NEW = 12
PROMPTS = [
    "Question: Tom has 3 apples",
    "What is 12 + 30?",
    "0123456789",
    "Question: What is 12 + 30?\nAnswer: The answer is 42. #### 42 Question: Tom has 3 apples and buys 5 more.",
    "dollars cents",
]
# Longer than two cache blocks of 32 tokens, and sharing their first blocks: what the prefix cache reuses.
LONG = "Question: Tom has 3 apples and buys 5 more. How many apples does he have? Answer: 3 + 5 = 8 #### 8 " * 2
LONG_PROMPTS = [LONG + "Question: What is 12 + 30?", LONG + "Tom has"]


def test_the_engine_leaves_the_callers_rng_states_as_they_were(tmp_path: Path) -> None:
    # First in the file: the process's first engine is the one that reseeds the global RNGs.
    policy = HFPolicy.from_pretrained(save_tiny_llama(tmp_path / "model", hidden=HIDDEN))
    torch.manual_seed(1), np.random.seed(2), random.seed(3)
    states = torch.get_rng_state(), np.random.get_state()[1].copy(), random.getstate()
    engine = VLLMEngine(CPU_OPTIONS)  # built, fed, sampled, closed
    try:
        engine.ensure(policy.model, policy.tokenizer.tokenizer, step=0)
        ids, mask = policy.encode_prompts(PROMPTS)
        _EnginePolicy(engine, policy, stop=[]).generate(
            ids, mask, max_new_tokens=MAX_NEW, temperature=1.0, generators=_generators([1, 2, 3, 4, 5])
        )
    finally:
        engine.close()
    assert torch.equal(torch.get_rng_state(), states[0])
    assert np.array_equal(np.random.get_state()[1], states[1])
    assert random.getstate() == states[2]


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> tuple[HFPolicy, _EnginePolicy]:
    path = save_tiny_llama(tmp_path_factory.mktemp("vllm") / "model", hidden=HIDDEN, digit_bias=2.0)
    policy = HFPolicy.from_pretrained(path)
    engine = VLLMEngine(CPU_OPTIONS)
    engine.ensure(policy.model, policy.tokenizer.tokenizer, step=0)
    yield policy, _EnginePolicy(engine, policy, stop=[])
    engine.close()


def _generators(seeds: list[int]) -> list[torch.Generator]:
    return [torch.Generator().manual_seed(s) for s in seeds]


def _greedy(policy, prompts: list[str]) -> torch.Tensor:
    ids, mask = (
        policy.encode_prompts(prompts) if isinstance(policy, HFPolicy) else policy.policy.encode_prompts(prompts)
    )
    return policy.generate(
        ids, mask, max_new_tokens=MAX_NEW, temperature=0.0, generators=_generators(list(range(len(prompts))))
    )


def test_greedy_completions_equal_hf_policy_token_for_token(setup) -> None:
    policy, engine_policy = setup
    hf, vllm = _greedy(policy, PROMPTS), _greedy(engine_policy, PROMPTS)
    assert hf.shape == vllm.shape == (len(PROMPTS), MAX_NEW)
    assert (hf == policy.eos_id).any(), "some completion must end early, or EOS handling is not compared"
    assert torch.equal(hf, vllm)


def test_a_sampled_prompt_gives_the_same_completions_alone_and_in_a_batch_of_64(setup) -> None:
    policy, engine_policy = setup
    n = 4
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(64 // n)]
    ids, mask = policy.encode_prompts(prompts)
    seeds = list(range(100, 100 + len(prompts)))
    # n rows per prompt share its generator, as in the default evaluation.
    gens = [g for g in _generators(seeds) for _ in range(n)]
    batch = engine_policy.generate(
        ids.repeat_interleave(n, 0),
        mask.repeat_interleave(n, 0),
        max_new_tokens=MAX_NEW,
        temperature=1.0,
        generators=gens,
        top_p=0.95,
        top_k=40,
    )
    assert batch.shape[0] == 64
    assert len({tuple(r) for r in batch[:n].tolist()}) > 1, "a prompt's samples must differ from each other"
    for p in (0, 3, 7):
        one_ids, one_mask = policy.encode_prompts([prompts[p]])
        alone = engine_policy.generate(
            one_ids.repeat(n, 1),
            one_mask.repeat(n, 1),
            max_new_tokens=MAX_NEW,
            temperature=1.0,
            generators=[torch.Generator().manual_seed(seeds[p])] * n,
            top_p=0.95,
            top_k=40,
        )
        assert torch.equal(alone, batch[p * n : (p + 1) * n]), p


def test_pushed_weights_after_training_steps_give_the_new_greedy_completions(setup) -> None:
    policy, engine_policy = setup
    engine = engine_policy.engine
    prompts = [*PROMPTS, *LONG_PROMPTS]
    assert len(policy.encode_prompts(LONG_PROMPTS)[0][0]) > 2 * CPU_OPTIONS.extra["block_size"]
    before = _greedy(engine_policy, prompts)  # fills the prefix cache with the old weights' blocks
    pushes = engine.pushes
    engine.ensure(policy.model, policy.tokenizer.tokenizer, step=0)
    assert engine.pushes == pushes, "unchanged weights must not be pushed again"
    # Only the attention's key and value projections train: the cached keys and values of the
    # long prompts' shared blocks are then stale, while the output layer still follows the context.
    trained = [p for n, p in policy.model.named_parameters() if n.endswith(("k_proj.weight", "v_proj.weight"))]
    optimizer = torch.optim.SGD(trained, lr=0.5)
    ids, mask = policy.encode_prompts(prompts)
    for _ in range(3):
        logits = policy.model(input_ids=ids, attention_mask=mask.long()).logits
        loss = -logits.log_softmax(-1)[..., 7].mean()  # pull every position towards one token
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    engine.ensure(policy.model, policy.tokenizer.tokenizer, step=3)
    assert engine.pushes == pushes + 1 and engine.weights_step == 3
    after = _greedy(engine_policy, prompts)
    assert not torch.equal(before, after), "training changed nothing: the test would not see stale weights"
    assert torch.equal(after, _greedy(policy, prompts))


def test_the_engines_scores_are_the_raw_distributions_of_the_sampled_tokens(setup) -> None:
    # vLLM's own log-probabilities and the EntropyRecorder's entropies equal HFPolicy's forward at
    # temperature 1, whatever the sampling temperature; a stop string ends a completion, unscored EOS after it.
    policy, engine_policy = setup
    ids, mask = policy.encode_prompts(PROMPTS)
    kw = dict(max_new_tokens=MAX_NEW, temperature=0.7, top_k=20)
    out = engine_policy.generate_scored(ids, mask, generators=_generators([1, 2, 3, 4, 5]), **kw)
    assert torch.equal(out.tokens, engine_policy.generate(ids, mask, generators=_generators([1, 2, 3, 4, 5]), **kw))
    with torch.no_grad():
        logp, entropy = policy.completion_logprobs(ids, mask, out.tokens, temperature=1.0)
    scored = out.scored
    assert scored is not None and out.logprobs is not None and out.entropy is not None
    assert torch.equal(scored, completion_mask(out.tokens, policy.eos_id))  # no stop string: every token sampled
    torch.testing.assert_close(out.logprobs[scored], logp[scored], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(out.entropy[scored], entropy[scored], atol=1e-4, rtol=1e-4)
    text = policy.decode_completions(out.tokens[:1])[0]
    stop = text[len(text) // 2 : len(text) // 2 + 1]
    cut = engine_policy.generate_scored(ids[:1], mask[:1], generators=_generators([1]), stop=[stop], **kw)
    end = int((cut.tokens[0] == policy.eos_id).nonzero()[0])
    assert bool(cut.stopped[0]) and cut.scored is not None
    assert cut.scored[0, end - 1] and not cut.scored[0, end]
