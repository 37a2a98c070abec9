"""What a generation engine reports besides the tokens: how each completion ended, and its own scores.

`Generation` is what `generate_scored` returns (`TinyPolicy`, `HFPolicy` and the vLLM engine
have it); `generate_scored(policy, ...)` calls it where the policy has it and wraps a plain
`generate` otherwise (no scores, no stop-string ends). The scores are the engine's own, taken
while sampling at no extra forward: the log-probability of each sampled token and the entropy of
the distribution it was drawn from, both of the model's raw distribution (temperature 1, before
top-k and top-p, as vLLM's default ``raw_logprobs``), so they compare across eval sets with
different sampling settings (greedy ones too).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor


@dataclass(frozen=True)
class Generation:
    """Completions and what the engine knows about them.

    Attributes:
        tokens: ``[B, max_new_tokens]`` ids, EOS then pad (`Policy.generate`'s contract).
        stopped: ``[B]`` bool, the completion ended at a stop string (the engine's own or the
            eval set's); such a completion may have an EOS after it that was not sampled.
        logprobs: ``[B, max_new_tokens]`` float32, the raw log-probability of each sampled token,
            0 elsewhere; None when the engine gave no scores.
        entropy: ``[B, max_new_tokens]`` float32, the raw entropy of each sampled token's
            distribution (nats), 0 elsewhere; None when the engine gave no scores, or gave
            log-probabilities only (an inference server: `rl.engines.server`).
        scored: ``[B, max_new_tokens]`` bool, the tokens that were sampled (an EOS appended after a
            stop string and the padding are not); None without scores.
    """

    tokens: Tensor
    stopped: Tensor
    logprobs: Tensor | None = None
    entropy: Tensor | None = None
    scored: Tensor | None = None


def step_scores(logits: Tensor, token: Tensor) -> tuple[Tensor, Tensor]:
    """The raw log-probability of `token` [B] under `logits` [B, V] and the entropy of softmax(logits), float32.

    Example:
        >>> logp, entropy = step_scores(torch.zeros(1, 4), torch.tensor([2]))
        >>> round(logp.item(), 4), round(entropy.item(), 4)  # uniform over 4: log(1/4), log(4)
        (-1.3863, 1.3863)
    """
    logp = F.log_softmax(logits.float(), dim=-1)
    # xlogy(0, 0) = 0: a token masked to -inf adds nothing (0 * -inf would be NaN).
    return logp.gather(-1, token[:, None]).squeeze(-1), -torch.special.xlogy(logp.exp(), logp.exp()).sum(-1)


SCORE_BUFFER_ELEMENTS = 1 << 24
"""Logits a `ScoreRecorder` holds before scoring them in one go (64 MB of float32): a small
vocabulary is scored once per generation, a large one every step."""


class ScoreRecorder:
    """Collects a decode loop's scores (nothing when `enabled` is False). The steps' logits are kept
    until `SCORE_BUFFER_ELEMENTS` and then scored together: a few tensor operations per batch of
    steps rather than per step, which is what the scores cost a small model."""

    def __init__(self, rows: int, steps: int, device: torch.device, enabled: bool) -> None:
        self.enabled = enabled
        shape = (rows, steps) if enabled else (0, 0)
        self.logprobs = torch.zeros(shape, device=device)
        self.entropy = torch.zeros(shape, device=device)
        self.scored = torch.zeros(shape, dtype=torch.bool, device=device)
        self._pending: list[tuple[int, Tensor, Tensor, Tensor]] = []
        self._held = 0

    def add(self, step: int, logits: Tensor, token: Tensor, live: Tensor) -> None:
        """Scores of `token` [B] sampled from the raw `logits` [B, V] at `step`, kept for the `live` rows."""
        if not self.enabled:
            return
        self._pending.append((step, logits, token, live.clone()))
        self._held += logits.numel()
        if self._held >= SCORE_BUFFER_ELEMENTS:
            self._flush()

    def _flush(self) -> None:
        if not self._pending:
            return
        steps = [p[0] for p in self._pending]
        logits = torch.stack([p[1] for p in self._pending], dim=1)  # [B, S, V]
        token = torch.stack([p[2] for p in self._pending], dim=1)
        live = torch.stack([p[3] for p in self._pending], dim=1)
        logp, entropy = step_scores(logits.flatten(0, 1), token.flatten())
        self.logprobs[:, steps] = torch.where(live, logp.view_as(live), 0.0)
        self.entropy[:, steps] = torch.where(live, entropy.view_as(live), 0.0)
        self.scored[:, steps] = live
        self._pending, self._held = [], 0

    def generation(self, tokens: Tensor, stopped: Tensor) -> Generation:
        if not self.enabled:
            return Generation(tokens, stopped)
        self._flush()
        return Generation(tokens, stopped, self.logprobs, self.entropy, self.scored)


def generate_scored(
    policy: Any,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    *,
    stop: Sequence[str] = (),
    scores: bool = True,
    **sampling: Any,
) -> Generation:
    """`policy.generate_scored(...)` where the policy has it, else its `generate` wrapped in a
    `Generation` without scores, whose `stopped` is all False. `sampling` holds `generate`'s
    keyword arguments (max_new_tokens, temperature, generators, top_p, top_k, stop_at_eos).

    Args:
        stop: the eval set's stop strings, for an engine that can end a completion at them.
        scores: ask for the log-probabilities and entropies (an engine may skip their cost without).
    """
    if callable(getattr(policy, "generate_scored", None)):
        return policy.generate_scored(prompt_ids, prompt_mask, stop=stop, scores=scores, **sampling)
    tokens = policy.generate(prompt_ids, prompt_mask, **sampling)
    return Generation(tokens, torch.zeros(tokens.shape[0], dtype=torch.bool, device=tokens.device))
