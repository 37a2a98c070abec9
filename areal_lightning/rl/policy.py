"""The policy interface GRPO trains, and `TinyPolicy`, a small decoder-only transformer in pure torch."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from areal_lightning.rl.engines.generation import Generation, ScoreRecorder

Generators = torch.Generator | Sequence[torch.Generator]
# Log-probs at temperature 0 (greedy sampling) are taken at this temperature instead of dividing by 0.
MIN_LOGPROB_TEMPERATURE = 1e-8


@runtime_checkable
class Policy(Protocol):
    """What `GRPOModule` needs from a language model.

    Prompts come left-padded (`prompt_mask` True on real tokens). Completions are
    `[B, max_new_tokens]` ids that end with EOS and are padded after it. With
    `stop_at_eos=False` generation runs all `max_new_tokens` forwards even after every row ended
    (same output): under sharded parameters every rank must run the same number of forwards.
    """

    eos_id: int
    pad_id: int

    def generate(
        self,
        prompt_ids: Tensor,
        prompt_mask: Tensor,
        *,
        max_new_tokens: int,
        temperature: float,
        generators: Generators,
        top_p: float = 1.0,
        top_k: int | None = None,
        stop_at_eos: bool = True,
    ) -> Tensor: ...

    def completion_logprobs(
        self,
        prompt_ids: Tensor,
        prompt_mask: Tensor,
        completion_ids: Tensor,
        *,
        temperature: float = 1.0,
    ) -> tuple[Tensor, Tensor]: ...


class GeneratesFromScored:
    """`generate` for an engine that has `generate_scored`: its completions without the scores."""

    generate_scored: Callable[..., Generation]
    """The engine's `generate_scored`: `generate`'s keyword arguments, `stop` and `scores`."""

    def generate(
        self,
        prompt_ids: Tensor,
        prompt_mask: Tensor,
        *,
        max_new_tokens: int,
        temperature: float,
        generators: Generators,
        top_p: float = 1.0,
        top_k: int | None = None,
        stop_at_eos: bool = True,
    ) -> Tensor:
        """Samples up to `max_new_tokens` ids per row (greedy when `temperature == 0`); EOS then pad.

        Args:
            prompt_ids: [B, T] left-padded prompt ids.
            prompt_mask: [B, T], True on real prompt tokens.
            max_new_tokens: completion slots per row.
            temperature: softmax temperature; 0 for greedy decoding.
            generators: one `torch.Generator` per row (a row's sample then depends on its seed
                only), or a single one shared by the batch.
            top_p: keep the nucleus of this probability mass of each step's tempered distribution.
            top_k: keep the k most likely tokens of each step; None keeps all.
            stop_at_eos: stop decoding once every row ended; False runs all `max_new_tokens`
                forwards (ranks of a sharded model must run the same number).

        Raises:
            ValueError: for `max_new_tokens < 1`, a negative temperature, a top_p outside (0, 1],
                a top_k below 1, or a generator count that is neither 1 nor B.
        """
        return self.generate_scored(
            prompt_ids,
            prompt_mask,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            generators=generators,
            top_p=top_p,
            top_k=top_k,
            stop_at_eos=stop_at_eos,
            scores=False,
        ).tokens


def completion_mask(completion_ids: Tensor, eos_id: int) -> Tensor:
    """True on completion tokens up to and including the first EOS."""
    is_eos = completion_ids == eos_id
    ended_before = (is_eos.cumsum(dim=1) - is_eos.long()) > 0
    return ~ended_before


def truncate_logits(logits: Tensor, top_k: int | None = None, top_p: float = 1.0) -> Tensor:
    """`logits` [..., V] with the tokens outside the top k, or outside the nucleus of mass `top_p`,
    set to -inf. The nucleus is the smallest set of most likely tokens whose probabilities add up
    to at least `top_p` (the most likely token is always kept). Pass tempered logits: the
    temperature comes first, as in `transformers`.

    Example:
        >>> truncate_logits(torch.tensor([2.0, 1.0, 0.0, -1.0]), top_k=2).tolist()
        [2.0, 1.0, -inf, -inf]
        >>> truncate_logits(torch.tensor([2.0, 1.0, 0.0, -1.0]), top_p=0.5).tolist()  # p = 0.64, 0.24, ...
        [2.0, -inf, -inf, -inf]
    """
    if top_k is not None and top_k < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(dim=-1)
        # A token goes when the tokens before it already hold top_p of the mass.
        drop_sorted = (probs.cumsum(dim=-1) - probs) >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def sampling_noise(generators: Generators, rows: int, steps: int, vocab: int, device: torch.device) -> Tensor:
    """Exponential noise for the exponential-race trick: argmax(log p - log E) samples from p.

    With one generator per row, each row's draws depend only on its own seed, so a sample's
    completion does not depend on which batch or rank it was evaluated in.
    """
    if isinstance(generators, torch.Generator):
        noise = torch.empty(rows, steps, vocab, device=generators.device).exponential_(generator=generators)
        return noise.to(device)
    if len(generators) != rows:
        raise ValueError(f"got {len(generators)} generators for {rows} rows; pass one per row or a single one")
    # Each generator draws on its own device (a CUDA generator cannot fill a CPU tensor).
    return torch.stack(
        [torch.empty(steps, vocab, device=g.device).exponential_(generator=g).to(device) for g in generators]
    )


class _Block(nn.Module):
    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))

    def forward(self, x: Tensor, attn_mask: Tensor, cache: dict[str, Tensor] | None) -> Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.n_heads, d // self.n_heads).transpose(1, 2) for z in (q, k, v))
        if cache is not None:
            if "k" in cache:
                k, v = torch.cat([cache["k"], k], dim=2), torch.cat([cache["v"], v], dim=2)
            cache["k"], cache["v"] = k, v
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


class TinyPolicy(GeneratesFromScored, nn.Module):
    """A pre-LayerNorm decoder-only transformer with a key/value cache for generation.

    Args:
        vocab_size: number of token ids.
        d_model: width of the residual stream.
        n_layers: number of transformer blocks.
        n_heads: attention heads per block (must divide `d_model`).
        max_len: longest prompt plus completion, in tokens.
        pad_id: id of the padding token.
        eos_id: id that ends a completion.

    Example:
        >>> p = TinyPolicy(vocab_size=15, d_model=32, n_layers=1, n_heads=2, max_len=16, pad_id=0, eos_id=2)
        >>> ids, mask = torch.tensor([[1, 5, 6]]), torch.ones(1, 3, dtype=torch.bool)
        >>> p.generate(ids, mask, max_new_tokens=3, temperature=1.0, generators=torch.Generator()).shape
        torch.Size([1, 3])
    """

    def __init__(
        self,
        vocab_size: int,
        d_model: int = 64,
        n_layers: int = 2,
        n_heads: int = 4,
        max_len: int = 32,
        pad_id: int = 0,
        eos_id: int = 2,
    ) -> None:
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"policy.n_heads must divide policy.d_model, got d_model={d_model}, n_heads={n_heads}")
        self.pad_id, self.eos_id, self.max_len = pad_id, eos_id, max_len
        self.tok = nn.Embedding(vocab_size, d_model)
        self.pos = nn.Embedding(max_len, d_model)
        self.blocks = nn.ModuleList(_Block(d_model, n_heads) for _ in range(n_layers))
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size)

    def forward(
        self, ids: Tensor, key_valid: Tensor, positions: Tensor, caches: list[dict[str, Tensor]] | None = None
    ) -> Tensor:
        """Logits for `ids` [B, T]; `key_valid` [B, S] covers cached plus new tokens, S >= T."""
        if int(positions.max()) >= self.max_len:
            raise ValueError(f"sequence of {int(positions.max()) + 1} tokens exceeds policy.max_len={self.max_len}")
        t, s = ids.shape[1], key_valid.shape[1]
        # Causal over the last t of s keys, pads hidden; a query always sees itself so that
        # rows of pure padding stay finite (their outputs are never used).
        causal = torch.ones(t, s, dtype=torch.bool, device=ids.device).tril(diagonal=s - t)
        self_key = torch.zeros(t, s, dtype=torch.bool, device=ids.device)
        self_key[:, s - t :] = torch.eye(t, dtype=torch.bool, device=ids.device)
        attn_mask = ((causal & key_valid[:, None, :]) | self_key)[:, None]
        x = self.tok(ids) + self.pos(positions)
        for i, block in enumerate(self.blocks):
            x = block(x, attn_mask, None if caches is None else caches[i])
        return self.head(self.ln_f(x))

    @torch.no_grad()
    def generate_scored(
        self,
        prompt_ids: Tensor,
        prompt_mask: Tensor,
        *,
        max_new_tokens: int,
        temperature: float,
        generators: Generators,
        top_p: float = 1.0,
        top_k: int | None = None,
        stop_at_eos: bool = True,
        stop: Sequence[str] = (),
        scores: bool = True,
    ) -> Generation:
        """`generate`'s completions with each sampled token's raw log-probability and entropy
        (`rl.engines.generation`) when `scores`. `top_p` and `top_k` truncate each step's tempered
        distribution (`truncate_logits`); the noise each row draws does not depend on them, so a row
        still depends on its seed only. The tiny policy has no text to look for `stop` strings in:
        it never ends at one (its `stopped` is all False)."""
        b = prompt_ids.shape[0]
        noise = sampling_noise(generators, b, max_new_tokens, self.head.out_features, prompt_ids.device)
        caches: list[dict[str, Tensor]] = [{} for _ in self.blocks]
        key_valid = prompt_mask
        positions = (prompt_mask.long().cumsum(dim=1) - 1).clamp(min=0)
        next_pos = positions[:, -1:] + 1
        logits = self(prompt_ids, key_valid, positions, caches)[:, -1]
        out = torch.full((b, max_new_tokens), self.pad_id, dtype=torch.long, device=prompt_ids.device)
        done = torch.zeros(b, dtype=torch.bool, device=prompt_ids.device)
        recorder = ScoreRecorder(b, max_new_tokens, prompt_ids.device, scores)
        for t in range(max_new_tokens):
            if temperature > 0:
                tempered = truncate_logits(logits / temperature, top_k, top_p)
                token = (F.log_softmax(tempered, dim=-1) - noise[:, t].log()).argmax(dim=-1)
            else:
                token = logits.argmax(dim=-1)
            recorder.add(t, logits, token, ~done)
            out[:, t] = torch.where(done, torch.full_like(token, self.pad_id), token)
            done |= token == self.eos_id
            if t == max_new_tokens - 1 or (stop_at_eos and bool(done.all())):
                break
            key_valid = torch.cat([key_valid, torch.ones(b, 1, dtype=torch.bool, device=key_valid.device)], dim=1)
            logits = self(token[:, None], key_valid, next_pos, caches)[:, -1]
            next_pos = next_pos + 1
        return recorder.generation(out, torch.zeros(b, dtype=torch.bool, device=out.device))

    def completion_logprobs(
        self, prompt_ids: Tensor, prompt_mask: Tensor, completion_ids: Tensor, *, temperature: float = 1.0
    ) -> tuple[Tensor, Tensor]:
        """Per-token log-probs and entropies [B, C] of `completion_ids` after the prompts."""
        ids = torch.cat([prompt_ids, completion_ids], dim=1)
        key_valid = torch.cat([prompt_mask, torch.ones_like(completion_ids, dtype=torch.bool)], dim=1)
        positions = (key_valid.long().cumsum(dim=1) - 1).clamp(min=0)
        logits = self(ids, key_valid, positions)[:, prompt_ids.shape[1] - 1 : -1]
        logp = F.log_softmax(logits / max(temperature, MIN_LOGPROB_TEMPERATURE), dim=-1)
        token_logp = logp.gather(-1, completion_ids[..., None]).squeeze(-1)
        entropy = -(logp.exp() * logp).sum(-1)
        return token_logp, entropy
