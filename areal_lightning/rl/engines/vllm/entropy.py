"""`EntropyRecorder`: a vLLM logits processor that records the entropy of each sampled token's raw
distribution, for the requests that ask for it, and changes no logit.

vLLM returns the sampled tokens' log-probabilities itself (``SamplingParams(logprobs=0)``, in its
default ``raw_logprobs`` mode) but no entropy. This processor runs in the engine's worker on the
raw float32 logits of every decoding step, before the temperature and top-k / top-p (vLLM applies
processors that are not argmax-invariant there), and keeps one entropy per request and position.
`WeightLoader.take_entropies` hands them over through ``collective_rpc``, in the engine's process
or in the trainer's. Imported by name inside the engine only (it subclasses vLLM's class).
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

import torch
from vllm.v1.sample.logits_processor import LogitsProcessor
from vllm.v1.sample.logits_processor.builtin import process_dict_updates

from areal_lightning.rl.engines.vllm.policy import ENTROPY_REQUEST_KEY

_RECORDERS: weakref.WeakSet[EntropyRecorder] = weakref.WeakSet()  # an engine rebuilt in this process adds one


class EntropyRecorder(LogitsProcessor):
    """Records ``{request key: {position: entropy}}`` for the requests that carry a key."""

    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
        # batch index -> (request key, the request's output token ids, which vLLM keeps growing)
        self.rows: dict[int, tuple[str, list[int]]] = {}
        self.entropies: dict[str, dict[int, float]] = {}
        _RECORDERS.add(self)

    def is_argmax_invariant(self) -> bool:
        return False  # so that vLLM hands over the raw logits, before the temperature

    def update_state(self, batch_update: Any) -> None:
        def new_state(params: Any, prompt_ids: Any, output_ids: list[int]) -> tuple[str, list[int]] | None:
            key = (params.extra_args or {}).get(ENTROPY_REQUEST_KEY)
            return None if key is None else (str(key), output_ids)

        process_dict_updates(self.rows, batch_update, new_state)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if not self.rows:
            return logits
        index = sorted(i for i in self.rows if i < logits.shape[0])
        logp = torch.log_softmax(logits[index].float(), dim=-1)
        entropy = (-torch.special.xlogy(logp.exp(), logp.exp()).sum(-1)).tolist()
        for row, value in zip(index, entropy, strict=True):
            key, output_ids = self.rows[row]
            # The position of the token sampled from these logits; a recomputed step overwrites.
            self.entropies.setdefault(key, {})[len(output_ids)] = value
        return logits


def take_entropies(keys: Sequence[str]) -> list[list[float]]:
    """Each key's recorded entropies in position order, forgotten afterwards (empty for an unknown key)."""
    out: list[list[float]] = [[] for _ in keys]
    for recorder in _RECORDERS:
        for i, key in enumerate(keys):
            found = recorder.entropies.pop(key, None)
            if found:
                out[i] = [found[p] for p in sorted(found)]
    return out
