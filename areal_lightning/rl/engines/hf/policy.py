"""`HFPolicy`: any `transformers` causal LM as a `Policy`, with cached batched sampling and per-row seeds."""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from areal_lightning.rl.engines.generation import Generation, ScoreRecorder
from areal_lightning.rl.engines.hf.tokenizer import HFTokenizer
from areal_lightning.rl.policy import MIN_LOGPROB_TEMPERATURE, GeneratesFromScored, Generators, completion_mask
from areal_lightning.rl.sampling import race_noise, sample_tokens

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# A stop string is looked for in this many decoded tokens per character of the longest one:
# a character spans at most 4 byte-level tokens (UTF-8), so a string ending in the newest token fits.
STOP_WINDOW_TOKENS_PER_CHAR = 4
ENTROPY_CHUNK_ROWS = 8
"""Rows per chunk of the entropy computation (its float32 temporaries are chunk x steps x vocab)."""


class LocalModelNotFoundError(FileNotFoundError):
    """`HFPolicy.from_pretrained` got a path that is not a local model directory."""


def zero_dropout(model: nn.Module) -> None:
    """Sets every dropout probability to 0, so that training mode computes the policy that sampled."""
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0
        # Llama-style attention passes this float to its attention function in training mode.
        if isinstance(getattr(module, "attention_dropout", None), float):
            # A plain float attribute; nn.Module types attribute assignment as Tensor | Module only.
            module.attention_dropout = 0.0  # type: ignore[assignment]


class HFPolicy(GeneratesFromScored, nn.Module):
    """A `transformers` causal language model as a `Policy` (`eos_id`, `pad_id`, `generate`,
    `completion_logprobs`), the drop-in for `TinyPolicy`.

    `generate` runs its own decode loop over the model's key/value cache: left-padded prompts,
    positions counted from each row's first real token, one sampling step per token for the
    whole batch. A row's completion depends on its own generator only (see `race_noise`), so it
    is the same alone, in any batch and on any rank. Completions are ``[B, max_new_tokens]``:
    tokens, EOS, then `pad_id`. A row that produces one of the `stop` strings stops there and gets an
    EOS in the next slot (if there is one); that EOS was not sampled, and GRPO trains on it like
    on any other completion token.

    The whole model starts in training mode, as a freshly built module does (``from_pretrained``
    leaves it in eval mode); the evaluation round switches it to eval mode and back. Dropout is
    a stated choice: ``disable_dropout=True`` (the default, as RL trainers such as TRL's
    ``disable_dropout``) sets every dropout probability of the model to 0, so that a training
    forward computes the policy that sampled; False keeps the model's own dropout.

    Args:
        model: a `transformers` causal LM (`AutoModelForCausalLM`).
        tokenizer: an `HFTokenizer`, or a `transformers` tokenizer that is wrapped in one
            (`chat`, `system_prompt`, `stop` and `eos_id` then configure the wrapper).

    Raises:
        ValueError: for a wrapper option given together with an `HFTokenizer` (it has its own).

    Example:
        >>> policy = HFPolicy.from_pretrained(  # doctest: +SKIP
        ...     "/models/qwen2.5-0.5b-instruct", dtype="bfloat16", chat=True
        ... )
        >>> ids, mask = policy.encode_prompts(["What is 2+3?"])  # doctest: +SKIP
        >>> out = policy.generate(  # doctest: +SKIP
        ...     ids, mask, max_new_tokens=64, temperature=0.0, generators=torch.Generator()
        ... )
        >>> policy.decode_completions(out)  # doctest: +SKIP
        ['2 + 3 = 5']
    """

    def __init__(
        self,
        model: nn.Module,
        tokenizer: Any,
        *,
        chat: bool = False,
        system_prompt: str | None = None,
        stop: Sequence[str] = (),
        eos_id: int | None = None,
        disable_dropout: bool = True,
    ) -> None:
        super().__init__()
        if isinstance(tokenizer, HFTokenizer):
            if chat or system_prompt is not None or stop or eos_id is not None:
                raise ValueError(
                    "`HFPolicy(tokenizer=HFTokenizer(...))` takes chat, system_prompt, stop and "
                    "eos_id from that HFTokenizer; pass them to it, not to HFPolicy"
                )
        else:
            tokenizer = HFTokenizer(tokenizer, chat=chat, system_prompt=system_prompt, stop=stop, eos_id=eos_id)
        self.model = model
        self.tokenizer = tokenizer
        self.eos_id, self.pad_id = tokenizer.eos_id, tokenizer.pad_id
        if disable_dropout:
            zero_dropout(model)
        model.train()  # every module, whatever `from_pretrained` left: training mode is the module's own
        params = inspect.signature(model.forward).parameters
        # transformers 5 renamed `past_key_values` to `cache`; the output key follows the argument.
        self._cache_key = "cache" if "cache" in params else "past_key_values"
        # Without it, a forward returns logits for every position: [B, T, vocab], 150k wide on real models.
        self._logits_to_keep = "logits_to_keep" in params

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        *,
        dtype: str | torch.dtype = "float32",
        attn_implementation: str | None = None,
        device: str | torch.device | None = None,
        tokenizer_path: str | Path | None = None,
        chat: bool = False,
        chat_template: str | None = None,
        system_prompt: str | None = None,
        stop: Sequence[str] = (),
        eos_id: int | None = None,
        disable_dropout: bool = True,
        **model_kwargs: Any,
    ) -> HFPolicy:
        """Loads a model and its tokenizer from a LOCAL directory; nothing is ever downloaded.

        Args:
            path: a directory written by `save_pretrained` (config.json, weights, tokenizer files).
            dtype: weight dtype: one of `DTYPES`' names, a `torch.dtype`, or "auto" (the checkpoint's).
            attn_implementation: e.g. "sdpa", "eager", "flash_attention_2"; None lets transformers choose.
            device: where to put the model; None leaves it on the CPU.
            tokenizer_path: a directory holding the tokenizer, when it is not `path`.
            chat, system_prompt, stop, eos_id: see `HFTokenizer`.
            disable_dropout: every dropout probability of the model set to 0 (see the class).
            chat_template: a Jinja chat template replacing the tokenizer's own (or giving one to a
                tokenizer that has none).
            **model_kwargs: passed to `AutoModelForCausalLM.from_pretrained`.

        Raises:
            LocalModelNotFoundError: `path` (or `tokenizer_path`) is not a local directory, or has
                no config.json; a hub name such as "Qwen/Qwen2.5-0.5B" is refused the same way.
            ValueError: for an unknown `dtype` name.
        """
        from transformers import AutoModelForCausalLM, AutoTokenizer

        model_dir = _local_dir(path, "path", need_config=True)
        tokenizer_dir = model_dir if tokenizer_path is None else _local_dir(tokenizer_path, "tokenizer_path")
        if isinstance(dtype, str) and dtype != "auto":
            if dtype not in DTYPES:
                raise ValueError(
                    f"Unsupported parameter value `HFPolicy.from_pretrained(dtype={dtype!r})`. "
                    f"Possible choices are: {', '.join([*DTYPES, 'auto'])} or a torch.dtype"
                )
            dtype = DTYPES[dtype]
        if attn_implementation is not None:
            model_kwargs["attn_implementation"] = attn_implementation
        model = AutoModelForCausalLM.from_pretrained(
            model_dir, local_files_only=True, **{_dtype_kwarg(): dtype}, **model_kwargs
        )
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir, local_files_only=True)
        if chat_template is not None:
            tokenizer.chat_template = chat_template
        policy = cls(
            model,
            tokenizer,
            chat=chat,
            system_prompt=system_prompt,
            stop=stop,
            eos_id=eos_id,
            disable_dropout=disable_dropout,
        )
        return policy if device is None else policy.to(device)

    def encode_prompts(self, prompts: Sequence[str]) -> tuple[Tensor, Tensor]:
        """Left-padded prompt ids and mask (on the CPU), through the chat template if configured."""
        return self.tokenizer.encode_batch(prompts)

    def decode_completions(self, completions: Tensor) -> list[str]:
        """Each completion's text up to EOS (special tokens dropped, cut after a stop string)."""
        return self.tokenizer.decode_batch(completions)

    def _forward(
        self, ids: Tensor, mask: Tensor, positions: Tensor, *, keep: int, use_cache: bool, cache: Any = None
    ) -> tuple[Tensor, Any]:
        """Logits of the last `keep` positions, and the key/value cache when `use_cache`."""
        kwargs: dict[str, Any] = {self._cache_key: cache, "use_cache": use_cache}
        if self._logits_to_keep:
            kwargs["logits_to_keep"] = keep
        out = self.model(input_ids=ids, attention_mask=mask.long(), position_ids=positions, **kwargs)
        return out.logits[:, -keep:], out[self._cache_key] if use_cache else None

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
        """`generate`, ending a completion also at the `stop` strings (beside the tokenizer's own),
        with each sampled token's raw log-probability and entropy when `scores` (`rl.engines.generation`).

        Raises:
            ValueError: as `generate`.
        """
        _check_sampling(max_new_tokens, temperature, top_p, top_k)
        b, device = prompt_ids.shape[0], prompt_ids.device
        if not isinstance(generators, torch.Generator) and len(generators) != b:
            raise ValueError(f"got {len(generators)} generators for {b} rows; pass one per row or a single one")
        mask = prompt_mask.to(device=device, dtype=torch.bool)
        positions = (mask.long().cumsum(dim=1) - 1).clamp(min=0)
        next_pos = mask.long().sum(dim=1, keepdim=True)  # the first completion token's position, per row
        logits, cache = self._forward(prompt_ids, mask, positions, keep=1, use_cache=True)
        out = torch.full((b, max_new_tokens), self.pad_id, dtype=torch.long, device=device)
        done = torch.zeros(b, dtype=torch.bool, device=device)
        stopped = torch.zeros(b, dtype=torch.bool, device=device)
        stop_strings = (*self.tokenizer.stop, *stop)
        stop_window = STOP_WINDOW_TOKENS_PER_CHAR * max((len(s) for s in stop_strings), default=0)
        recorder = ScoreRecorder(b, max_new_tokens, device, scores)
        for t in range(max_new_tokens):
            noise = None if temperature == 0 else self._step_noise(generators, done, logits.shape[-1], device)
            token = sample_tokens(logits[:, -1], temperature, noise, top_p, top_k)
            recorder.add(t, logits[:, -1], token, ~done)
            out[:, t] = torch.where(done, out[:, t], token)  # a finished row keeps its pad (or appended EOS)
            ended = ~done & (token == self.eos_id)
            if stop_window:
                hits = ~done & ~ended & self._stop_string_hits(out, t, stop_window, device, stop_strings)
                if t + 1 < max_new_tokens:
                    out[hits, t + 1] = self.eos_id
                ended |= hits
                stopped |= hits
            done |= ended
            if t == max_new_tokens - 1 or (stop_at_eos and bool(done.all())):
                break
            mask = torch.cat([mask, torch.ones(b, 1, dtype=torch.bool, device=device)], dim=1)
            logits, cache = self._forward(token[:, None], mask, next_pos, keep=1, use_cache=True, cache=cache)
            next_pos = next_pos + 1
        return recorder.generation(out, stopped)

    def _step_noise(self, generators: Generators, done: Tensor, vocab: int, device: torch.device) -> Tensor:
        """This step's race noise; finished rows with their own generators draw nothing (ones)."""
        if isinstance(generators, torch.Generator):
            return race_noise(generators, done.shape[0], vocab, device)
        # Skipping finished rows keeps draws per generator a function of its own rows' tokens only.
        live = (~done).nonzero().flatten().tolist()
        noise = torch.ones(done.shape[0], vocab, device=device)
        if live:
            noise[live] = race_noise([generators[i] for i in live], len(live), vocab, device)
        return noise

    def _stop_string_hits(
        self, out: Tensor, t: int, window: int, device: torch.device, stop_strings: Sequence[str]
    ) -> Tensor:
        """True for rows whose last `window` completion tokens, decoded, contain one of `stop_strings`."""
        tails = out[:, max(0, t + 1 - window) : t + 1].tolist()
        decode = self.tokenizer.tokenizer.decode
        hits = [any(s in decode(tail) for s in stop_strings) for tail in tails]
        return torch.tensor(hits, dtype=torch.bool, device=device)

    def completion_logprobs(
        self, prompt_ids: Tensor, prompt_mask: Tensor, completion_ids: Tensor, *, temperature: float = 1.0
    ) -> tuple[Tensor, Tensor]:
        """Per-token log-probs and entropies [B, C] (float32) of `completion_ids` after the prompts.

        Computed in one forward over prompt and completion; prompt padding is masked out of
        attention and positions, and entries after a completion's first EOS are 0.
        """
        c = completion_ids.shape[1]
        ids = torch.cat([prompt_ids, completion_ids], dim=1)
        mask = torch.cat([prompt_mask.bool(), torch.ones_like(completion_ids, dtype=torch.bool)], dim=1)
        positions = (mask.long().cumsum(dim=1) - 1).clamp(min=0)
        # The logits at the last prompt token and at each completion token but the last.
        logits, _ = self._forward(ids, mask, positions, keep=c + 1, use_cache=False)
        scaled = logits[:, :-1].float() / max(temperature, MIN_LOGPROB_TEMPERATURE)
        # gather - logsumexp keeps one float32 [B, C, vocab] tensor for the backward pass, where
        # log_softmax followed by the entropy's exp kept three. The entropy is a metric: no graph,
        # a few rows at a time.
        token_logp = scaled.gather(-1, completion_ids[..., None]).squeeze(-1) - scaled.logsumexp(dim=-1)
        with torch.no_grad():
            entropy = torch.cat([_entropy(rows) for rows in scaled.split(ENTROPY_CHUNK_ROWS)])
        valid = completion_mask(completion_ids, self.eos_id)
        return token_logp.masked_fill(~valid, 0.0), entropy.masked_fill(~valid, 0.0)


def _check_sampling(max_new_tokens: int, temperature: float, top_p: float, top_k: int | None) -> None:
    if max_new_tokens < 1:
        raise ValueError(f"`HFPolicy.generate(max_new_tokens={max_new_tokens})` must be a positive integer")
    if temperature < 0:
        raise ValueError(f"`HFPolicy.generate(temperature={temperature})` must be >= 0 (0 is greedy)")
    if not 0 < top_p <= 1:
        raise ValueError(f"`HFPolicy.generate(top_p={top_p})` must be in (0, 1]")
    if top_k is not None and top_k < 1:
        raise ValueError(f"`HFPolicy.generate(top_k={top_k})` must be a positive integer or None")


def _entropy(logits: Tensor) -> Tensor:
    logp = F.log_softmax(logits, dim=-1)
    return -(logp.exp() * logp).sum(-1)


def _local_dir(path: str | Path, name: str, need_config: bool = False) -> Path:
    """`path` as an existing local directory, or a `LocalModelNotFoundError` that says why not."""
    directory = Path(path).expanduser()
    hint = (
        "HFPolicy never downloads models: save the model and tokenizer to a local directory "
        "(`save_pretrained`, or `huggingface-cli download NAME --local-dir DIR` on a machine with network) "
        "and pass that directory"
    )
    if not directory.is_dir():
        raise LocalModelNotFoundError(
            f"`HFPolicy.from_pretrained({name}={str(path)!r})`: no such local directory. {hint}"
        )
    if need_config and not (directory / "config.json").is_file():
        raise LocalModelNotFoundError(
            f"`HFPolicy.from_pretrained({name}={str(path)!r})`: the directory has no config.json, so it holds no "
            f"saved model. {hint}"
        )
    return directory


def _dtype_kwarg() -> str:
    """`from_pretrained`'s dtype argument: `dtype` since transformers 4.56, `torch_dtype` before."""
    import transformers

    major, minor = (int(p) for p in transformers.__version__.split(".")[:2])
    return "dtype" if (major, minor) >= (4, 56) else "torch_dtype"
