"""TinyPolicy: cached generation agrees with a full forward; a row's sample depends on its seed only."""

from __future__ import annotations

import torch

from areal_lightning.rl.policy import TinyPolicy, completion_mask


def _policy() -> TinyPolicy:
    torch.manual_seed(0)
    return TinyPolicy(vocab_size=15, d_model=32, n_layers=2, n_heads=2, max_len=16)


def test_cached_greedy_generation_matches_full_forward_with_left_padding():
    p = _policy()
    ids = torch.tensor([[0, 0, 1, 5, 6], [1, 5, 6, 7, 8]])
    mask = ids != 0
    out = p.generate(ids, mask, max_new_tokens=5, temperature=0.0, generators=torch.Generator())
    full_ids = torch.cat([ids, out], 1)
    valid = torch.cat([mask, torch.ones_like(out, dtype=torch.bool)], 1)
    positions = (valid.long().cumsum(1) - 1).clamp(min=0)
    assert torch.equal(p(full_ids, valid, positions)[:, 4:-1].argmax(-1)[:, :1], out[:, :1])
    alone = p.generate(ids[:1, 2:], mask[:1, 2:], max_new_tokens=5, temperature=0.0, generators=torch.Generator())
    assert torch.equal(alone[0], out[0])  # padding changes nothing


def test_sample_depends_on_its_own_generator_not_on_its_batch():
    p = _policy()
    ids = torch.tensor([[1, 5, 6], [1, 7, 8], [1, 9, 9]])
    mask = torch.ones_like(ids, dtype=torch.bool)
    gens = lambda: [torch.Generator().manual_seed(s) for s in (11, 22, 33)]  # noqa: E731
    batch = p.generate(ids, mask, max_new_tokens=6, temperature=1.0, generators=gens())
    single = p.generate(ids[1:2], mask[1:2], max_new_tokens=6, temperature=1.0,
                        generators=[torch.Generator().manual_seed(22)])
    assert torch.equal(batch[1], single[0])


def test_completion_mask_keeps_tokens_up_to_the_first_eos():
    ids = torch.tensor([[5, 2, 0, 0], [5, 6, 7, 8], [2, 0, 0, 0]])
    assert completion_mask(ids, eos_id=2).tolist() == [
        [True, True, False, False], [True, True, True, True], [True, False, False, False]]
