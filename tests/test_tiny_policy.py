"""TinyPolicy: cached generation agrees with a full forward; a row's sample depends on its seed only."""

from __future__ import annotations

import pytest
import torch

from areal_lightning.rl.policy import TinyPolicy, completion_mask, sampling_noise


def _policy() -> TinyPolicy:
    torch.manual_seed(0)
    return TinyPolicy(vocab_size=15, d_model=32, n_layers=2, n_heads=2, max_len=16)


def _uncached_tokens(
    p: TinyPolicy, ids: torch.Tensor, mask: torch.Tensor, out: torch.Tensor, temperature: float, noise: torch.Tensor
) -> torch.Tensor:
    """Each generated token recomputed from one full forward over prompt + completion (no cache)."""
    full_ids = torch.cat([ids, out], 1)
    valid = torch.cat([mask, torch.ones_like(out, dtype=torch.bool)], 1)
    positions = (valid.long().cumsum(1) - 1).clamp(min=0)
    logits = p(full_ids, valid, positions)[:, ids.shape[1] - 1 : -1]  # the prediction of every completion token
    if temperature == 0:
        return logits.argmax(-1)
    return (torch.log_softmax(logits / temperature, dim=-1) - noise.log()).argmax(-1)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_every_cached_token_up_to_eos_matches_a_full_forward_with_left_padding(temperature: float):
    p = _policy()
    ids = torch.tensor([[0, 0, 1, 5, 6], [1, 5, 6, 7, 8], [0, 1, 9, 9, 3]])
    mask = ids != 0
    seeds = (5, 6, 7)
    steps = 8
    gens = lambda: [torch.Generator().manual_seed(s) for s in seeds]  # noqa: E731
    out = p.generate(ids, mask, max_new_tokens=steps, temperature=temperature, generators=gens())
    noise = sampling_noise(gens(), len(seeds), steps, p.head.out_features, ids.device)
    expected = _uncached_tokens(p, ids, mask, out, temperature, noise)
    keep = completion_mask(out, p.eos_id)
    assert keep.sum() > len(seeds) * 2  # more than the first token is compared
    assert torch.equal(out[keep], expected[keep])
    alone = p.generate(ids[:1, 2:], mask[:1, 2:], max_new_tokens=steps, temperature=temperature, generators=gens()[:1])
    assert torch.equal(alone[0], out[0])  # padding changes nothing


def test_sample_depends_on_its_own_generator_not_on_its_batch():
    p = _policy()
    ids = torch.tensor([[1, 5, 6], [1, 7, 8], [1, 9, 9]])
    mask = torch.ones_like(ids, dtype=torch.bool)
    gens = lambda: [torch.Generator().manual_seed(s) for s in (11, 22, 33)]  # noqa: E731
    batch = p.generate(ids, mask, max_new_tokens=6, temperature=1.0, generators=gens())
    single = p.generate(
        ids[1:2], mask[1:2], max_new_tokens=6, temperature=1.0, generators=[torch.Generator().manual_seed(22)]
    )
    assert torch.equal(batch[1], single[0])


def test_completion_mask_keeps_tokens_up_to_the_first_eos():
    ids = torch.tensor([[5, 2, 0, 0], [5, 6, 7, 8], [2, 0, 0, 0]])
    assert completion_mask(ids, eos_id=2).tolist() == [
        [True, True, False, False],
        [True, True, True, True],
        [True, False, False, False],
    ]
