"""What the vLLM tests share: the import guard and the engine's CPU settings.

In the main environment vLLM is absent and the vLLM tests skip; `make test-vllm` runs them in
`.venv-vllm` with ``VLLM_TESTS_REQUIRED=1``, where a missing vLLM is a failure, not a skip.
"""

from __future__ import annotations

import os

import pytest

from areal_lightning.rl.engines.vllm.evaluator import VLLMOptions

HIDDEN = 128
"""Width of the test Llama: 4 heads of 32 (the CPU attention needs head_dim >= 32)."""
CPU_OPTIONS = VLLMOptions(max_model_len=256, kv_cache_gib=1, max_num_seqs=64, extra={"block_size": 32})
"""Small cache blocks (the CPU attention takes multiples of 32): long test prompts span several,
so the prefix cache has something to reuse."""


def require_vllm() -> None:
    """Skips the calling module where vLLM is not installed, unless the vLLM environment runs it."""
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    if os.environ.get("VLLM_TESTS_REQUIRED"):
        import vllm  # noqa: F401 - must be there: `make test-vllm` runs these tests to test vLLM
    else:
        pytest.importorskip("vllm", reason="vLLM is not installed here; `make test-vllm` runs these tests")
