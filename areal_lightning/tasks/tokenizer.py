"""A character tokenizer for small alphabets, with left padding for batched generation."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch loads in `pad_left`: the config measures prompts without it
    import torch

PAD_TOKEN = "<pad>"
BOS_TOKEN = "<bos>"
EOS_TOKEN = "<eos>"


class CharTokenizer:
    """Maps each character of a fixed alphabet to one token id; ids 0-2 are pad, bos and eos.

    Args:
        alphabet: the characters prompts and answers are written in, each once.

    Raises:
        ValueError: when the alphabet repeats a character or is empty.

    Example:
        >>> tok = CharTokenizer("0123456789+=")
        >>> tok.decode(tok.encode("12+3="))
        '12+3='
    """

    def __init__(self, alphabet: str) -> None:
        if not alphabet or len(set(alphabet)) != len(alphabet):
            raise ValueError(f"`CharTokenizer(alphabet=...)` needs distinct characters, got {alphabet!r}")
        self.alphabet = alphabet
        self.special = (PAD_TOKEN, BOS_TOKEN, EOS_TOKEN)
        self.pad_id, self.bos_id, self.eos_id = 0, 1, 2
        self._ids = {ch: i + len(self.special) for i, ch in enumerate(alphabet)}

    @property
    def vocab_size(self) -> int:
        return len(self.special) + len(self.alphabet)

    def encode(self, text: str, *, bos: bool = True) -> list[int]:
        """Token ids of `text`, with a leading BOS unless `bos=False`.

        Raises:
            ValueError: when `text` has a character outside the alphabet.
        """
        unknown = sorted(set(text) - set(self._ids))
        if unknown:
            raise ValueError(f"text {text!r} has characters {unknown} outside the alphabet {self.alphabet!r}")
        ids = [self._ids[ch] for ch in text]
        return [self.bos_id, *ids] if bos else ids

    def encode_observation(self, text: str) -> list[int]:
        """Token ids of an observation that follows a completion in a multi-turn episode (no BOS)."""
        return self.encode(text, bos=False)

    def decode(self, ids: Sequence[int] | torch.Tensor) -> str:
        """Text of `ids`, stopping at the first EOS; special tokens are dropped."""
        out = []
        for i in ids.tolist() if hasattr(ids, "tolist") else ids:
            if i == self.eos_id:
                break
            if i >= len(self.special):
                out.append(self.alphabet[i - len(self.special)])
        return "".join(out)

    def pad_left(self, sequences: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """Left-pads to a [B, T] id tensor and its bool mask (True on real tokens)."""
        import torch

        width = max(len(s) for s in sequences)
        ids = torch.full((len(sequences), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(sequences), width), dtype=torch.bool)
        for row, seq in enumerate(sequences):
            if seq:
                ids[row, width - len(seq) :] = torch.tensor(seq, dtype=torch.long)
                mask[row, width - len(seq) :] = True
        return ids, mask
