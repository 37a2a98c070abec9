"""`HFTokenizer`: a `transformers` tokenizer behind the interface the trainer uses for `CharTokenizer`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor


class HFTokenizer:
    """Encodes prompts (plain, or through the tokenizer's chat template) and decodes completions.

    It offers what `GRPOModule` calls on `task.tokenizer` (`encode`, `decode`, `pad_left`,
    `pad_id`, `eos_id`, `vocab_size`) plus batch helpers, so a transformers model can stand in
    for `TinyPolicy` without the trainer knowing which tokenizer it holds.

    Args:
        tokenizer: a `transformers` tokenizer (`PreTrainedTokenizerBase`).
        chat: wrap each prompt as one user message and render it with the tokenizer's chat
            template, ending with the assistant's generation prompt.
        system_prompt: a system message placed before the user message when `chat` is True.
        stop: `decode` cuts the text right after the first of these it finds (generation
            stops there too, see `HFPolicy`).
        eos_id: the id that ends a completion; by default the tokenizer's EOS.

    Raises:
        ValueError: when the tokenizer has no EOS token and no `eos_id` is given, when `chat` is
            True but the tokenizer has no chat template, or a system prompt comes without `chat`.

    Example:
        >>> hf_tok = AutoTokenizer.from_pretrained("/models/qwen", local_files_only=True)  # doctest: +SKIP
        >>> tok = HFTokenizer(hf_tok, chat=True)  # doctest: +SKIP
        >>> ids, mask = tok.encode_batch(["What is 2+3?", "And 7*6?"])  # doctest: +SKIP
        >>> tok.decode_batch(policy.generate(ids, mask, ...))  # doctest: +SKIP
    """

    def __init__(
        self,
        tokenizer: Any,
        *,
        chat: bool = False,
        system_prompt: str | None = None,
        stop: Sequence[str] = (),
        eos_id: int | None = None,
    ) -> None:
        eos_id = tokenizer.eos_token_id if eos_id is None else eos_id
        if eos_id is None:
            raise ValueError("`HFTokenizer(eos_id=None)`: the tokenizer has no EOS token; pass `eos_id` explicitly")
        if chat and not getattr(tokenizer, "chat_template", None):
            raise ValueError(
                "`HFTokenizer(chat=True)`: the tokenizer has no chat template; use chat=False for plain prompts"
            )
        if system_prompt is not None and not chat:
            raise ValueError("`HFTokenizer(system_prompt=...)` needs chat=True: plain prompts have no system message")
        if any(not s for s in stop):
            raise ValueError(f"`HFTokenizer(stop=...)` must be non-empty strings, got {list(stop)!r}")
        self.tokenizer = tokenizer
        self.chat = chat
        self.system_prompt = system_prompt
        self.stop = tuple(stop)
        self.eos_id = int(eos_id)
        # Without a pad token, pad with EOS: a completion's tokens end at its first EOS either way.
        self.pad_id = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_id)

    @property
    def vocab_size(self) -> int:
        return len(self.tokenizer)

    def render(self, prompt: str) -> str:
        """The text the model reads for `prompt`: itself, or its chat-template rendering."""
        if not self.chat:
            return prompt
        messages = [{"role": "user", "content": prompt}]
        if self.system_prompt is not None:
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    def encode(self, prompt: str) -> list[int]:
        """Token ids of `prompt` as the model reads it (see `render`)."""
        # A chat template writes its own special tokens (BOS included); adding them again would double them.
        return list(self.tokenizer(self.render(prompt), add_special_tokens=not self.chat)["input_ids"])

    def encode_observation(self, text: str) -> list[int]:
        """Token ids that follow a completion (ended by EOS) in a multi-turn episode and show `text`
        as the next user turn: with `chat`, the template's user message and the assistant's generation
        prompt, found as AReaL finds them (an assistant message rendered with and without the user
        message after it: the difference); without, the tokens of `text` alone."""
        if not self.chat:
            return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        messages = [{"role": "assistant", "content": "x"}]
        before = self.tokenizer.apply_chat_template(messages, tokenize=False)
        after = self.tokenizer.apply_chat_template(
            [*messages, {"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
        )
        if not after.startswith(before):
            raise ValueError("the chat template renders an assistant message differently when a user turn follows")
        return list(self.tokenizer(after[len(before) :], add_special_tokens=False)["input_ids"])

    def decode(self, ids: Sequence[int] | Tensor) -> str:
        """Text of a completion up to its first EOS, special tokens dropped, cut after a stop string."""
        ids = ids.tolist() if isinstance(ids, Tensor) else list(ids)
        if self.eos_id in ids:
            ids = ids[: ids.index(self.eos_id)]
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        return cut_after_stop_string(text, self.stop)

    def pad_left(self, sequences: Sequence[Sequence[int]]) -> tuple[Tensor, Tensor]:
        """Left-pads to a [B, T] id tensor and its bool mask (True on real tokens)."""
        width = max(len(s) for s in sequences)
        ids = torch.full((len(sequences), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(sequences), width), dtype=torch.bool)
        for row, seq in enumerate(sequences):
            if seq:
                ids[row, width - len(seq) :] = torch.tensor(list(seq), dtype=torch.long)
                mask[row, width - len(seq) :] = True
        return ids, mask

    def encode_batch(self, prompts: Sequence[str]) -> tuple[Tensor, Tensor]:
        """Left-padded ids and mask of `prompts`, ready for `HFPolicy.generate`."""
        return self.pad_left([self.encode(p) for p in prompts])

    def decode_batch(self, completions: Tensor) -> list[str]:
        """`decode` of each row of a [B, C] completion tensor."""
        return [self.decode(row) for row in completions.cpu()]


def cut_after_stop_string(text: str, stop_strings: Sequence[str]) -> str:
    """`text` up to and including the earliest stop string in it; all of it when none occurs."""
    ends = [i + len(s) for s in stop_strings if (i := text.find(s)) >= 0]
    return text[: min(ends)] if ends else text
