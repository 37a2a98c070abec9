"""Completion statistics: the metric classes against plain references, the rules that say how a
completion ended, and the engines' own scores (TinyPolicy, HFPolicy) against a full forward."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hf_models import save_tiny_llama

from areal_lightning.errors import ArgumentError
from areal_lightning.metrics import NO_ANSWER, CompletionLength, Share, TokenMean
from areal_lightning.rl.completion_stats import completion_metrics, update_completion_metrics
from areal_lightning.rl.engines.generation import Generation, generate_scored
from areal_lightning.rl.engines.hf.policy import HFPolicy
from areal_lightning.rl.policy import TinyPolicy, completion_mask


# ----------------------------------------------------------------------------- the metric classes
def test_length_quantiles_are_exact_values_of_the_lengths() -> None:
    rng = np.random.default_rng(0)
    lengths = rng.integers(0, 65, size=1001)
    metric = CompletionLength(max_length=64)
    for part in np.array_split(lengths, 7):
        metric.update(torch.as_tensor(part))
    got = {key: value.item() for key, value in metric.compute().items()}
    assert got == {
        "mean": lengths.mean(),
        "p50": float(np.quantile(lengths, 0.5, method="inverted_cdf")),
        "p95": float(np.quantile(lengths, 0.95, method="inverted_cdf")),
        "max": float(lengths.max()),
    }
    # Exactly half the lengths at or below 1: the median is 1 (as numpy's), not 2.
    edge = CompletionLength(max_length=8)
    edge.update(torch.tensor([1] * 10 + [2] * 9 + [7]))
    assert edge.compute()["p50"].item() == 1.0 == np.quantile([1] * 10 + [2] * 9 + [7], 0.5, method="inverted_cdf")
    assert edge.compute()["p95"].item() == 2.0 and edge.compute()["max"].item() == 7.0


def test_length_refuses_lengths_outside_the_histogram() -> None:
    metric = CompletionLength(max_length=4)
    with pytest.raises(ValueError, match=r"whole numbers in \[0, max_length=4\], got 5"):
        metric.update(torch.tensor([1, 5]))
    with pytest.raises(ValueError, match=r"whole numbers in \[0, max_length=4\], got 1.5"):
        metric.update(torch.tensor([1.5]))
    with pytest.raises(ArgumentError, match=r"`CompletionLength\(max_length=...\)` must be a positive integer"):
        CompletionLength(max_length=0)
    assert all(math.isnan(v.item()) for v in CompletionLength(max_length=4).compute().values())


def test_share_and_token_mean_against_plain_arithmetic() -> None:
    share = Share()
    share.update(torch.tensor([True, False, True]))
    share.update(torch.tensor([[0, 0]]))
    assert share.compute().item() == 2 / 5
    with pytest.raises(ValueError, match=r"`Share.update\(flags=...\)` must hold booleans or 0/1 values, got 2"):
        share.update(torch.tensor([2]))
    values = torch.tensor([[0.1, 0.2, 9.0], [0.3, 9.0, 9.0]], dtype=torch.float64)
    mask = torch.tensor([[True, True, False], [True, False, False]])
    mean = TokenMean()
    mean.update(values, mask)
    assert mean.compute().item() == 0.2  # the exact (0.1 + 0.2 + 0.3) / 3, rounded once
    assert math.isnan(TokenMean().compute().item())


# ----------------------------------------------------------------------------- how a completion ended
EOS, PAD = 2, 0


def _facts(generation: Generation, answer_ids: list[int], stop_in_text: list[bool] | None = None) -> dict[str, float]:
    metrics = {name: make() for name, make in completion_metrics(4).items()}
    flags = None if stop_in_text is None else torch.tensor(stop_in_text)
    update_completion_metrics(metrics, generation, EOS, answer_ids, flags)
    out: dict[str, float] = {}
    for name, metric in metrics.items():
        value = metric.compute()
        out.update(
            {f"{name}/{k}": v.item() for k, v in value.items()} if isinstance(value, dict) else {name: value.item()}
        )
    return out


def test_length_truncation_and_stop_rules_on_constructed_completions() -> None:
    tokens = torch.tensor(
        [
            [5, 6, EOS, PAD],  # ended by a sampled EOS: 3 tokens
            [5, 6, 7, 8],  # reached max_new_tokens: truncated, 4 tokens
            [5, 6, EOS, PAD],  # the engine stopped at a stop string and appended the EOS: 2 tokens
            [5, 6, 7, 8],  # stopped at a stop string in the last slot, no room for EOS: not truncated
            [5, 6, 7, 8],  # its text holds the eval set's stop string (a policy that does not stop at it)
        ]
    )
    stopped = torch.tensor([False, False, True, True, False])
    facts = _facts(Generation(tokens, stopped), [1, NO_ANSWER, 3, NO_ANSWER, NO_ANSWER], [False] * 4 + [True])
    assert facts["completion/length/mean"] == (3 + 4 + 2 + 4 + 4) / 5
    assert facts["completion/length/max"] == 4 and facts["completion/length/p50"] == 4
    assert facts["completion/truncated"] == 1 / 5
    assert facts["completion/stopped"] == 3 / 5
    assert facts["completion/no_answer"] == 3 / 5
    assert math.isnan(facts["completion/logprob"]) and math.isnan(facts["completion/entropy"])  # no scores


# ----------------------------------------------------------------------------- the engines' own scores
def _check_scores_match_a_forward(policy, ids, mask, generation: Generation, eos_id: int) -> None:
    assert generation.logprobs is not None and generation.entropy is not None and generation.scored is not None
    with torch.no_grad():
        logp, entropy = policy.completion_logprobs(ids, mask, generation.tokens, temperature=1.0)
    scored = generation.scored
    expected = completion_mask(generation.tokens, eos_id)
    appended = (generation.tokens == eos_id) & generation.stopped[:, None]  # an EOS after a stop string
    assert torch.equal(scored, expected & ~appended)
    torch.testing.assert_close(generation.logprobs[scored], logp[scored], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(generation.entropy[scored], entropy[scored], atol=1e-5, rtol=1e-5)
    assert (generation.logprobs[~scored] == 0).all() and (generation.entropy[scored] > 0).all()


@pytest.mark.parametrize(("temperature", "top_k"), [(0.0, None), (0.7, 3)])
def test_tiny_policy_scores_are_the_raw_distributions_of_the_sampled_tokens(temperature: float, top_k) -> None:
    torch.manual_seed(0)
    policy = TinyPolicy(vocab_size=15, d_model=32, n_layers=2, n_heads=2, max_len=16)
    ids = torch.tensor([[0, 0, 1, 5, 6], [1, 5, 6, 7, 8], [0, 1, 9, 9, 3]])
    mask = ids != 0
    gens = lambda: [torch.Generator().manual_seed(s) for s in (5, 6, 7)]  # noqa: E731
    kw = dict(max_new_tokens=8, temperature=temperature, top_k=top_k)
    generation = policy.generate_scored(ids, mask, generators=gens(), **kw)
    assert torch.equal(generation.tokens, policy.generate(ids, mask, generators=gens(), **kw))  # scores change nothing
    _check_scores_match_a_forward(policy, ids, mask, generation, policy.eos_id)
    plain = policy.generate_scored(ids, mask, generators=gens(), scores=False, **kw)
    assert plain.logprobs is None and torch.equal(plain.tokens, generation.tokens)


@pytest.fixture(scope="module")
def hf_policy(tmp_path_factory) -> HFPolicy:
    return HFPolicy.from_pretrained(save_tiny_llama(tmp_path_factory.mktemp("llama"), digit_bias=1.5))


def test_hf_policy_ends_at_the_eval_sets_stop_strings_and_scores_what_it_sampled(hf_policy: HFPolicy) -> None:
    ids, mask = hf_policy.encode_prompts(["What is 12 + 30?", "Tom has 3 apples"] * 2)
    kw = dict(max_new_tokens=12, temperature=1.0, generators=[torch.Generator().manual_seed(s) for s in range(4)])
    free = hf_policy.generate_scored(ids, mask, **kw)
    assert not free.stopped.any()
    _check_scores_match_a_forward(hf_policy, ids, mask, free, hf_policy.eos_id)
    text = hf_policy.decode_completions(free.tokens[:1])[0]
    stop = text[len(text) // 2 : len(text) // 2 + 1]
    kw["generators"] = [torch.Generator().manual_seed(s) for s in range(4)]
    cut = hf_policy.generate_scored(ids, mask, stop=[stop], **kw)
    assert bool(cut.stopped[0])
    first = cut.tokens[0]
    end = int((first == hf_policy.eos_id).nonzero()[0])
    assert not cut.scored[0, end] and cut.scored[0, end - 1]  # the EOS after the stop string was not sampled
    assert stop in hf_policy.tokenizer.tokenizer.decode(first[:end].tolist())
    metrics = {name: make() for name, make in completion_metrics(12).items()}
    update_completion_metrics(metrics, Generation(cut.tokens[:1], cut.stopped[:1]), hf_policy.eos_id, [1])
    # The sampled tokens, up to the one that completed the stop string; not truncated, stopped.
    assert metrics["completion/length"].compute()["max"].item() == end
    assert metrics["completion/stopped"].compute().item() == 1.0 == 1 - metrics["completion/truncated"].compute().item()


def test_a_policy_without_generate_scored_is_wrapped_without_scores() -> None:
    class Plain:
        eos_id, pad_id = EOS, PAD

        def generate(self, ids, mask, **kw):
            return torch.tensor([[5, EOS, PAD]])

    generation = generate_scored(Plain(), torch.ones(1, 2, dtype=torch.long), torch.ones(1, 2, dtype=torch.bool))
    assert generation.logprobs is None and generation.stopped.tolist() == [False]
