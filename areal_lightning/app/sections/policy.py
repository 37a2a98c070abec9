"""The ``policy`` section: the language model being trained, and the vLLM engine that may evaluate it."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Optional

from areal_lightning.app.config_errors import ConfigError, at_least, owned_by_key
from areal_lightning.rl.engines.server.options import ServerKind


class PolicyKind(str, Enum):
    """``tiny``: a small transformer built from the config; ``hf``: a local `transformers` causal LM."""

    TINY = "tiny"
    HF = "hf"


class EvalEngine(str, Enum):
    """What the evaluation generates with: ``policy``: the policy's own `generate`; ``vllm``: a vLLM
    engine fed the trained weights in place (``hf`` policies; docs/vllm.md); ``server``: OpenAI-compatible
    inference servers loaded with each round's weights (``hf`` policies; docs/servers.md)."""

    POLICY = "policy"
    VLLM = "vllm"
    SERVER = "server"


class ModelDtype(str, Enum):
    """Weight dtype of an ``hf`` policy; ``auto`` keeps the checkpoint's."""

    FLOAT32 = "float32"
    BFLOAT16 = "bfloat16"
    FLOAT16 = "float16"
    AUTO = "auto"


@dataclass
class VLLMConfig:
    """The vLLM engine of ``policy.eval_engine: vllm`` (`VLLMOptions`; docs/vllm.md)."""

    in_process: bool = True
    """Run the engine in the training process (starts in seconds); false: in a process of its own."""
    max_model_len: Optional[int] = None
    """Longest prompt plus completion, in tokens; null: the model's max_position_embeddings."""
    kv_cache_gib: int = 1
    """CPU: the KV cache's memory in whole GiB."""
    gpu_memory_utilization: float = 0.3
    """CUDA: the share of the GPU's memory the engine may take (the trainer keeps the rest)."""
    max_num_seqs: int = 256
    """Sequences the engine decodes at once."""
    max_num_batched_tokens: Optional[int] = None
    """Tokens per engine step; at least the longest prompt; null: max(8192, max_model_len)."""

    def check(self, path: str) -> None:
        with owned_by_key(path):
            self.build()

    def build(self) -> Any:
        """The `VLLMOptions` of this section."""
        from areal_lightning.rl.engines.vllm.options import VLLMOptions

        return VLLMOptions(
            in_process=self.in_process,
            max_model_len=self.max_model_len,
            kv_cache_gib=self.kv_cache_gib,
            gpu_memory_utilization=self.gpu_memory_utilization,
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
        )


@dataclass
class ServerConfig:
    """The inference servers of ``policy.eval_engine: server`` (`ServerOptions`; docs/servers.md)."""

    urls: list[str] = field(default_factory=list)
    """The servers' base URLs (http://host:port), each serving the model; at least one."""
    model: Optional[str] = None
    """The served model name (vllm serve --served-model-name)."""
    snapshot_dir: Optional[str] = None
    """Where each round's weights are published, a directory every server can read."""
    kind: ServerKind = ServerKind.VLLM
    """The servers' weight routes: vllm or sglang (sglang untested here)."""
    keep_snapshots: int = 2
    """Published snapshots kept on disk."""
    max_in_flight: int = 32
    """Requests in flight per server."""
    retries: int = 2
    """Attempts after the first on one server (transport errors and 5xx only), then the next server."""
    retry_wait_s: float = 0.5
    """The wait before the first retry, doubled after each."""
    timeout_base_s: float = 30.0
    """A request's time limit: this plus timeout_per_token_s per max_new_tokens."""
    timeout_per_token_s: float = 0.1
    """See timeout_base_s."""
    load_timeout_s: float = 600.0
    """The time limit of a weight load on one server."""

    def check(self, path: str) -> None:
        with owned_by_key(path):
            self.build()

    def build(self) -> Any:
        """The `ServerOptions` of this section."""
        from areal_lightning.rl.engines.server.options import ServerOptions

        return ServerOptions(
            urls=list(self.urls),
            model=self.model or "",
            snapshot_dir=self.snapshot_dir or "",
            kind=self.kind,
            keep_snapshots=self.keep_snapshots,
            max_in_flight=self.max_in_flight,
            retries=self.retries,
            retry_wait_s=self.retry_wait_s,
            timeout_base_s=self.timeout_base_s,
            timeout_per_token_s=self.timeout_per_token_s,
            load_timeout_s=self.load_timeout_s,
        )


@dataclass
class PolicyConfig:
    """The language model being trained."""

    kind: PolicyKind = PolicyKind.TINY
    """tiny: a small transformer built from this config; hf: the `transformers` causal LM saved at `path`."""
    path: Optional[str] = None
    """hf: local directory of the model and its tokenizer (`save_pretrained`); never downloaded."""
    dtype: ModelDtype = ModelDtype.FLOAT32
    """hf: weight dtype (float32, bfloat16, float16, auto)."""
    attn_implementation: Optional[str] = None
    """hf: transformers' attention kernel (eager, sdpa, flash_attention_2); null: its default."""
    chat_template: Optional[str] = None
    """hf: a Jinja chat template replacing the tokenizer's own (for task.prompt_style: chat); null: the tokenizer's."""
    system_prompt: Optional[str] = None
    """hf: a system message before each chat prompt (task.prompt_style: chat only)."""
    stop: list[str] = field(default_factory=list)
    """hf: a completion ends after the first of these strings, in training and evaluation (e.g.
    "\\nQuestion:" for base models); it stays in the text, while an eval set's `stop` is cut off."""
    disable_dropout: bool = True
    """hf: set every dropout probability of the model to 0 (as RL trainers do, e.g. TRL's
    disable_dropout), so a training forward computes the policy that sampled; false keeps the
    model's own dropout, active in training steps. The whole model trains in training mode either way."""
    d_model: int = 64
    """Width of the tiny transformer."""
    n_layers: int = 2
    """Blocks of the tiny transformer."""
    n_heads: int = 4
    """Attention heads per block of the tiny transformer."""
    max_len: int = 32
    """Longest prompt plus completion, in tokens."""
    eval_engine: EvalEngine = EvalEngine.POLICY
    """What evaluation generates with: policy (its own generate) or vllm (kind: hf only; docs/vllm.md)."""
    vllm: VLLMConfig = field(default_factory=VLLMConfig)
    """hf with eval_engine: vllm: how the engine is built."""
    server: ServerConfig = field(default_factory=ServerConfig)
    """hf with eval_engine: server: the inference servers (docs/servers.md)."""

    def check(self, path: str) -> None:
        self.vllm.check(f"{path}.vllm")
        if self.eval_engine is EvalEngine.SERVER:
            self.server.check(f"{path}.server")
        if self.eval_engine is not EvalEngine.POLICY and self.kind is not PolicyKind.HF:
            raise ConfigError(
                f"{path}.eval_engine: {self.eval_engine.value} needs {path}.kind: hf (vLLM serves transformers "
                f"models), got kind: {self.kind.value}; set kind: hf and path, or eval_engine: policy"
            )
        for name in ("d_model", "n_layers", "n_heads", "max_len"):
            at_least(f"{path}.{name}", getattr(self, name), 1)
        if self.d_model % self.n_heads:
            raise ConfigError(
                f"{path}.n_heads must divide {path}.d_model, got d_model={self.d_model}, n_heads={self.n_heads}"
            )
        if self.kind is PolicyKind.TINY and self.path is not None:
            # A path the run would silently ignore: the user believes a trained model is loaded.
            raise ConfigError(
                f"{path}.path is not read by {path}.kind=tiny (built from d_model, n_layers, ...), "
                f"got {self.path!r}; remove {path}.path (or set kind: hf to load it)"
            )
        if self.kind is PolicyKind.HF:
            if self.path is None:
                raise ConfigError(
                    f"{path}.path is required for {path}.kind: hf; give the local directory of a model "
                    "saved with save_pretrained (models are never downloaded)"
                )
            model_dir = Path(self.path).expanduser()
            if not model_dir.is_dir():
                raise ConfigError(
                    f"{path}.path {self.path!r} is not a local directory; give the directory of a "
                    "model saved with save_pretrained (models are never downloaded, hub names are refused)"
                )
            if not (model_dir / "config.json").is_file():
                raise ConfigError(
                    f"{path}.path {self.path!r} has no config.json, so it holds no saved model; give "
                    "the directory written by save_pretrained"
                )
        if any(not s for s in self.stop):
            raise ConfigError(f"{path}.stop must be non-empty strings, got {list(self.stop)!r}")
