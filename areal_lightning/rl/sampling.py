"""Sampling one decoding step of a batch: per-row race noise and the token it picks (`HFPolicy`'s loop)."""

from __future__ import annotations

import torch
from torch import Tensor

from areal_lightning.rl.policy import Generators, truncate_logits


def race_noise(generators: Generators, rows: int, vocab: int, device: torch.device) -> Tensor:
    """One decoding step's Exponential(1) noise [rows, vocab] for the exponential-race trick.

    With one generator per row, row ``i`` draws one ``vocab``-sized vector from ``generators[i]``
    per step (rows that share a generator draw in row order), so a row's sample depends on its
    own seed only. Each generator draws on its own device; the noise is then moved to `device`.
    Memory is O(rows x vocab) per step, never O(rows x steps x vocab).
    """
    if isinstance(generators, torch.Generator):
        return torch.empty(rows, vocab, device=generators.device).exponential_(generator=generators).to(device)
    if len(generators) != rows:
        raise ValueError(f"got {len(generators)} generators for {rows} rows; pass one per row or a single one")
    return torch.stack([torch.empty(vocab, device=g.device).exponential_(generator=g) for g in generators]).to(device)


def sample_tokens(
    logits: Tensor, temperature: float, noise: Tensor | None, top_p: float = 1.0, top_k: int | None = None
) -> Tensor:
    """Greedy ids when `temperature == 0`, else samples of softmax(logits / temperature),
    truncated to the top k tokens and the nucleus of mass top_p (`truncate_logits`).

    argmax(logits / T - log E) with E ~ Exponential(1) is a sample of softmax(logits / T): the
    exponential race, the same as Gumbel-max. Truncated tokens (-inf) never win.
    """
    if temperature == 0:
        return logits.argmax(dim=-1)
    assert noise is not None, "sampling at temperature > 0 needs noise"
    return (truncate_logits(logits.float() / temperature, top_k, top_p) - noise.log()).argmax(dim=-1)
