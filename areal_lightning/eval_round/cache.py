"""A cache of round results: an eval set already evaluated on the same weights with the same
settings is answered from ``<output_dir>/eval_cache/<key>.json`` instead of running `evaluate_fn`.

The key is a digest of everything that changes a result: the weights (every tensor of the
module's state dict, bytes, dtype and shape), the eval set's fingerprint (samples, options,
batching), the run seed, the evaluation precision, the `evaluate_fn` (its qualified name and its
code) and the number of table rows kept. Any difference is a miss.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from areal_lightning.eval_round.context import SetResult
from areal_lightning.eval_round.eval_set import EvalSet
from areal_lightning.eval_round.fingerprint import eval_set_fingerprint

CACHE_DIRNAME = "eval_cache"
_DIGEST_BYTES = 16
_PERSON = b"areal/evalcache1"  # bump if the key's encoding changes


def _digest() -> Any:
    return hashlib.blake2b(digest_size=_DIGEST_BYTES, person=_PERSON)


def weights_digest(module: nn.Module) -> str:
    """A digest of every tensor of the module's state dict (names, dtypes, shapes, bytes).

    Hashes all the weights (about 1 GB/s on one core): meant for the models evaluated here, and
    not for sharded parameters (each rank would hash its own shard).

    Example:
        >>> a, b = nn.Linear(2, 2), nn.Linear(2, 2)
        >>> weights_digest(a) == weights_digest(a), weights_digest(a) == weights_digest(b)
        (True, False)
    """
    digest = _digest()
    for name, tensor in sorted(module.state_dict().items()):
        t = tensor.detach().cpu().contiguous()
        digest.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        digest.update(t.view(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return str(digest.hexdigest())


def function_identity(fn: Callable[..., Any]) -> str:
    """The qualified name of a function plus a digest of its code (a lambda's too), so that an
    edited `evaluate_fn` misses the cache.

    Example:
        >>> function_identity(len)
        'builtins.len'
    """
    target = getattr(fn, "__func__", fn)  # a bound method: its function
    name = f"{getattr(target, '__module__', '?')}.{getattr(target, '__qualname__', type(target).__qualname__)}"
    code = getattr(target, "__code__", None)
    if code is None:
        return name
    digest = _digest()
    digest.update(code.co_code)
    digest.update(repr(code.co_consts).encode())
    return f"{name}:{digest.hexdigest()}"


def cache_key(parts: Mapping[str, Any]) -> str:
    """A hex digest of `parts` (JSON, keys sorted).

    Example:
        >>> cache_key({"a": 1}) == cache_key({"a": 1}), cache_key({"a": 1}) == cache_key({"a": 2})
        (True, False)
    """
    digest = _digest()
    digest.update(json.dumps(parts, sort_keys=True, default=repr).encode())
    return str(digest.hexdigest())


def result_key(weights: str, eval_set: EvalSet, **settings: Any) -> str:
    """The cache key of one eval set's result: weights digest, eval-set fingerprint, `settings`
    (seed, precision, evaluate_fn identity, ...)."""
    return cache_key({"weights": weights, "eval_set": eval_set_fingerprint(eval_set), **settings})


class ResultCache:
    """`SetResult`s stored as one JSON file per key under `directory`; rank 0 alone should use it.

    Example:
        >>> import tempfile
        >>> cache = ResultCache(tempfile.mkdtemp())
        >>> cache.put("k1", SetResult("easy", {"accuracy": 0.5}, 8, 2, 0.3, []))
        >>> cache.get("k1").metrics, cache.get("k2")
        ({'accuracy': 0.5}, None)
    """

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)

    def _path(self, key: str) -> Path:
        return self.directory / f"{key}.json"

    def get(self, key: str) -> SetResult | None:
        """The stored result, or None (also for an unreadable file: a miss, never an error)."""
        try:
            data = json.loads(self._path(key).read_text(encoding="utf-8"))
            return SetResult(
                dataset=data["dataset"],
                metrics={k: float("nan") if v is None else float(v) for k, v in data["metrics"].items()},
                num_samples=int(data["num_samples"]),
                num_prompts=int(data["num_prompts"]),
                eval_secs=float(data["eval_secs"]),
                table_rows=list(data["table_rows"]),
            )
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def put(self, key: str, result: SetResult) -> None:
        """Stores `result` (atomically: a reader sees the whole file or none)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        data = {
            "dataset": result.dataset,
            "num_samples": result.num_samples,
            "num_prompts": result.num_prompts,
            "eval_secs": result.eval_secs,
            "table_rows": result.table_rows,
            "metrics": {k: (v if v == v else None) for k, v in result.metrics.items()},
        }
        tmp = self._path(key).with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(data, default=str), encoding="utf-8")
        os.replace(tmp, self._path(key))
