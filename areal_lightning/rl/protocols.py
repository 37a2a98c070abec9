"""What `GRPOModule` and the default evaluation need of a task and of a tokenizer.

`ArithmeticTask` and `MathTask` are tasks; `CharTokenizer` (the tiny policy's) and `HFTokenizer`
(an `HFPolicy`'s) are tokenizers. A task need not own a tokenizer: the module takes the policy's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import torch
from torch import Tensor


@runtime_checkable
class RLTask(Protocol):
    """Training prompts and a verifiable reward.

    A task may also have ``reference_completion(sample) -> str | None``: a completion its reward must
    score correct (None: no gold answer for that sample); the integrity checks at the start of fit
    grade every eval sample's with the task's own reward (`GRPOModule.integrity_grade`).
    """

    def train_samples(self) -> Sequence[Any]:
        """Samples with `index`, `prompt` and `answer` attributes."""
        ...

    def reward(self, completion: str, answer: str) -> float:
        """1.0 (`CORRECT_REWARD`) for a correct completion."""
        ...

    def answer_id(self, completion: str) -> int:
        """An id per distinct final answer (for maj@k); the same on every rank."""
        ...


@runtime_checkable
class PromptTokenizer(Protocol):
    """Prompts in, completions out."""

    pad_id: int
    eos_id: int

    def encode(self, prompt: str) -> list[int]: ...

    def decode(self, ids: Sequence[int] | Tensor) -> str: ...

    def pad_left(self, sequences: Sequence[Sequence[int]]) -> tuple[Tensor, Tensor]: ...


def seeded_generators(seeds: Sequence[int], device: torch.device | str) -> list[torch.Generator]:
    """One `torch.Generator` per seed, on `device` when it is a CUDA device, else on the CPU.

    Sampling noise is drawn on each generator's device: on a GPU, noise drawn on the CPU would be
    copied over at every decoding step (a real vocabulary is 150k wide). A seed gives the same
    numbers on every GPU and on every rank, but not the same numbers on a GPU as on the CPU.

    Example:
        >>> [g.initial_seed() for g in seeded_generators([3, 4], "cpu")]
        [3, 4]
    """
    device = torch.device(device)
    where = device if device.type == "cuda" else torch.device("cpu")
    return [torch.Generator(device=where).manual_seed(int(seed)) for seed in seeds]
