"""`VLLMOptions`: how the vLLM engine is built. Pure Python, so that a config checks its section
without importing torch or vLLM."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from areal_lightning.errors import ArgumentError

DEFAULT_CPU_KV_CACHE_GIB = 1
DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192


@dataclass(frozen=True)
class VLLMOptions:
    """How the engine is built.

    Args:
        in_process: run the engine core in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, the
            ``uni`` executor), the fastest to start; False runs it in a process of its own, slower to
            start, which a crash cannot take down with the trainer.
        max_model_len: longest prompt plus completion, in tokens; None: the model's
            ``max_position_embeddings``.
        kv_cache_gib: CPU only: KV-cache memory in whole GiB (``VLLM_CPU_KVCACHE_SPACE``).
        gpu_memory_utilization: CUDA only: the share of the GPU's memory vLLM may take (weights and
            KV cache); the trainer holds the rest.
        max_num_seqs: sequences the engine runs at once.
        max_num_batched_tokens: tokens per engine step; it must hold the longest prompt, so that no
            prompt's prefill is split across steps (a seeded request whose prefill is split crashes
            the CPU engine); None: the larger of 8192 and `max_model_len`.
        dtype: the engine's weight dtype; None: the policy's.
        extra: more keyword arguments for ``vllm.LLM`` (e.g. ``block_size``).

    Raises:
        ArgumentError: for a value out of range.
    """

    in_process: bool = True
    max_model_len: int | None = None
    kv_cache_gib: int = DEFAULT_CPU_KV_CACHE_GIB
    gpu_memory_utilization: float = 0.3
    max_num_seqs: int = 256
    max_num_batched_tokens: int | None = None
    dtype: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("max_model_len", "max_num_batched_tokens"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise ArgumentError("VLLMOptions", name, value, "a positive integer or None")
        if not isinstance(self.max_num_seqs, int) or isinstance(self.max_num_seqs, bool) or self.max_num_seqs < 1:
            raise ArgumentError("VLLMOptions", "max_num_seqs", self.max_num_seqs, "a positive integer")
        if not isinstance(self.kv_cache_gib, int) or isinstance(self.kv_cache_gib, bool) or self.kv_cache_gib < 1:
            raise ArgumentError("VLLMOptions", "kv_cache_gib", self.kv_cache_gib, "a positive integer (GiB)")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ArgumentError(
                "VLLMOptions", "gpu_memory_utilization", self.gpu_memory_utilization, "a number in (0, 1]"
            )
