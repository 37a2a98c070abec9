"""Complete sampling settings: checked at load time with the key named, honoured by TinyPolicy
(top_p, top_k, per-row seeds kept), recorded in every history record of a round."""

from __future__ import annotations

import pytest
import torch

from areal_lightning.app.config import ConfigError, load_config
from areal_lightning.rl.policy import TinyPolicy, truncate_logits

BASE = ["eval_sets.easy.size=4"]


@pytest.mark.parametrize(
    ("override", "match"),
    [
        ("eval_sets.easy.top_p=0", r"eval_sets\.easy\.top_p must be a number in \(0, 1\], got 0"),
        ("eval_sets.easy.top_p=1.5", r"eval_sets\.easy\.top_p must be a number in \(0, 1\], got 1\.5"),
        ("eval_sets.easy.top_k=0", r"eval_sets\.easy\.top_k must be a positive integer or null, got 0"),
        ("eval_sets.easy.stop=['']", r"eval_sets\.easy\.stop must be a list of non-empty strings, got \[''\]"),
        ("eval_sets.easy.seed=-3", r"eval_sets\.easy\.seed must be a non-negative integer or null, got -3"),
    ],
)
def test_bad_sampling_settings_name_the_key(override, match):
    with pytest.raises(ConfigError, match=match):
        load_config(None, [*BASE, override])


def _policy() -> TinyPolicy:
    torch.manual_seed(0)
    return TinyPolicy(vocab_size=15, d_model=32, n_layers=2, n_heads=2, max_len=24)


PROMPTS = torch.tensor([[1, 5, 6], [1, 7, 8], [1, 9, 9], [3, 4, 5]])
MASK = torch.ones_like(PROMPTS, dtype=torch.bool)


def _generate(policy: TinyPolicy, seeds: list[int], rows: slice = slice(None), **kwargs) -> torch.Tensor:
    return policy.generate(
        PROMPTS[rows],
        MASK[rows],
        max_new_tokens=8,
        temperature=1.0,
        generators=[torch.Generator().manual_seed(s) for s in seeds],
        **kwargs,
    )


def test_top_k_of_one_is_greedy_and_top_k_of_all_changes_nothing():
    p = _policy()
    greedy = p.generate(PROMPTS, MASK, max_new_tokens=8, temperature=0.0, generators=torch.Generator())
    assert torch.equal(_generate(p, [1, 2, 3, 4], top_k=1), greedy)
    assert torch.equal(_generate(p, [1, 2, 3, 4], top_k=15), _generate(p, [1, 2, 3, 4]))
    assert torch.equal(_generate(p, [1, 2, 3, 4], top_p=1e-6), greedy)  # the nucleus is the top token


def test_sampled_tokens_stay_inside_the_nucleus_and_depend_on_their_own_seed():
    p = _policy()
    seeds = list(range(100, 164))
    prompts = PROMPTS[:1].repeat(64, 1)
    first = p.generate(
        prompts,
        torch.ones_like(prompts, dtype=torch.bool),
        max_new_tokens=1,
        temperature=1.0,
        generators=[torch.Generator().manual_seed(s) for s in seeds],
        top_p=0.5,
    )[:, 0]
    logits = p(PROMPTS[:1], MASK[:1], torch.arange(3)[None])[0, -1]
    allowed = torch.isfinite(truncate_logits(logits, top_p=0.5)).nonzero().flatten().tolist()
    assert set(first.tolist()) <= set(allowed)
    unrestricted = p.generate(
        prompts,
        torch.ones_like(prompts, dtype=torch.bool),
        max_new_tokens=1,
        temperature=1.0,
        generators=[torch.Generator().manual_seed(s) for s in seeds],
    )[:, 0]
    assert not set(unrestricted.tolist()) <= set(allowed)  # the cut did something
    # A row in a batch equals the row alone, with top_p and top_k.
    batch = _generate(p, [11, 22, 33, 44], top_p=0.9, top_k=5)
    alone = _generate(p, [33], slice(2, 3), top_p=0.9, top_k=5)
    assert torch.equal(batch[2], alone[0])


def test_truncate_logits_keeps_the_smallest_set_reaching_top_p():
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.0]])  # probabilities 0.032, 0.644, 0.087, 0.237
    kept = lambda top_p: torch.isfinite(truncate_logits(logits, top_p=top_p))[0].tolist()  # noqa: E731
    assert kept(0.6) == [False, True, False, False]
    assert kept(0.7) == [False, True, False, True]
    assert kept(0.95) == [False, True, True, True]
    assert kept(1.0) == [True] * 4


def test_every_round_result_says_how_it_was_sampled():
    from areal_lightning.app.builders import build_eval_sets, build_module
    from areal_lightning.eval_round import run_round
    from areal_lightning.rl.rollout_eval import rollout_evaluate

    cfg = load_config(
        None,
        [
            "eval_sets.easy.size=6",
            "eval_sets.easy.top_p=0.9",
            "eval_sets.easy.top_k=4",
            "eval_sets.easy.stop=['9']",
            "eval_sets.hard.size=6",
            "eval_sets.hard.seed=7",
            "eval_sets.hard.n_samples=2",
            "seed=5",
            "grpo.max_new_tokens=3",
        ],
    )
    module = build_module(cfg)
    results = run_round(
        module, build_eval_sets(cfg, module.task), rollout_evaluate, seed=cfg.seed, global_step=0, epoch=0
    )
    easy, hard = results
    assert easy.sampling == {
        "n_samples": 4,
        "temperature": 0.6,
        "top_p": 0.9,
        "top_k": 4,
        "max_new_tokens": 3,
        "stop": ["9"],
        "seed": 5,
        "ks": [1, 4],
    }
    assert hard.sampling == {
        "n_samples": 2,
        "temperature": 0.6,
        "top_p": 1.0,
        "top_k": None,
        "max_new_tokens": 3,
        "stop": [],
        "seed": 7,
        "ks": [1, 2],
    }
    assert hard.num_samples == 12
    assert {"scoring/timeouts", "scoring/parse_failures", "scoring/errors"} <= set(easy.metrics)
