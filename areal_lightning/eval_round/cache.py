"""A cache of round results: an eval set already evaluated on the same weights with the same
settings is answered from ``<output_dir>/eval_cache/<key>.json`` instead of running `evaluate_fn`.

The key is a digest of everything that changes a result: the weights (every tensor of the
module's state dict, bytes, dtype and shape), the eval set's fingerprint (samples, options,
batching), the run seed, the evaluation precision, the `evaluate_fn` (`function_identity`: the
code of what it calls and the state it reads) and the number of table rows kept. Any difference
is a miss. An `evaluate_fn` whose state cannot be keyed is refused (`UncacheableError`), not
guessed: a cache that can return a stale result is worse than none.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
import json
import os
import types
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from areal_lightning.eval_round.context import SetResult
from areal_lightning.eval_round.eval_set import EvalSet
from areal_lightning.eval_round.fingerprint import eval_set_fingerprint

CACHE_DIRNAME = "eval_cache"
_DIGEST_BYTES = 16
_PERSON = b"areal/evalcache2"  # bump if the key's encoding changes


def _digest() -> Any:
    return hashlib.blake2b(digest_size=_DIGEST_BYTES, person=_PERSON)


def _is_sharded(module: nn.Module) -> bool:
    """True when the module's weights are split over ranks (FSDP2 DTensors, FSDP1 wrappers)."""
    from torch.distributed.fsdp import FullyShardedDataParallel
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in module.parameters()) or any(
        isinstance(m, FullyShardedDataParallel) for m in module.modules()
    )


def weights_digest(module: nn.Module) -> str:
    """A digest of every tensor of the module's state dict (names, dtypes, shapes, bytes).

    Hashes all the weights on every call; not for sharded parameters (each rank would hash its own shard).

    Example:
        >>> a, b = nn.Linear(2, 2), nn.Linear(2, 2)
        >>> weights_digest(a) == weights_digest(a), weights_digest(a) == weights_digest(b)
        (True, False)
    """
    if _is_sharded(module):
        # Its state_dict() would all-gather, and the cache's key is computed on rank 0 alone.
        raise UncacheableError(
            f"{type(module).__name__} has parameters sharded over the ranks (FSDP); the result cache needs "
            "whole weights on rank 0: turn the cache off"
        )
    digest = _digest()
    for name, tensor in sorted(module.state_dict().items()):
        t = tensor.detach().cpu().contiguous()
        digest.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        digest.update(t.view(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return str(digest.hexdigest())


class UncacheableError(ValueError):
    """An `evaluate_fn` whose behaviour the cache cannot key safely (it could return stale results)."""


_PLAIN = (type(None), bool, int, float, complex, str, bytes)
_MAX_DEPTH = 8  # nesting of attributes followed into an instance's state


def _stable_repr(value: Any) -> str:
    """repr, with set elements sorted (a frozenset's order changes with the process's hash seed)."""
    if isinstance(value, (set, frozenset)):
        return f"{type(value).__name__}({sorted(map(_stable_repr, value))})"
    if isinstance(value, tuple):
        return f"({', '.join(map(_stable_repr, value))},)"
    return repr(value)


def _code_identity(code: types.CodeType) -> list[Any]:
    """The bytecode, constants (nested code objects recursively: their repr holds an address),
    and the names a code object uses."""
    consts = [_code_identity(c) if isinstance(c, types.CodeType) else _stable_repr(c) for c in code.co_consts]
    return [code.co_code.hex(), consts, list(code.co_names), code.co_argcount, code.co_kwonlyargcount]


def _package(obj: Any) -> str:
    return str(getattr(obj, "__module__", None) or "").split(".")[0]


def _wrapped(fn: Any) -> Any:
    """What a partial or a bound method calls in the end: a function, or an instance's class."""
    while isinstance(fn, (functools.partial, types.MethodType)):
        fn = fn.func if isinstance(fn, functools.partial) else fn.__func__
    return fn if isinstance(fn, (types.FunctionType, type)) else type(fn)


def _names(code: types.CodeType) -> list[str]:
    """The global names a code object and the code nested in it (comprehensions, lambdas) use."""
    nested = [n for c in code.co_consts if isinstance(c, types.CodeType) for n in _names(c)]
    return list(dict.fromkeys([*code.co_names, *nested]))


def _qualified(cls: type) -> str:
    """`module.qualname` of a class: two installed classes may share a name (`torch.nn.Linear`)."""
    return f"{cls.__module__}.{cls.__qualname__}"


class _Keyer:
    """Turns a callable and the state it can read into JSON-able data, or raises `UncacheableError`.

    What is followed: a function's code, defaults and closure cells; the functions, partials,
    classes and constant values (numbers, strings, tuples of them) it or the code nested in it
    (comprehensions, lambdas) names as globals, when they belong to the same
    top-level package as the callable (code of installed libraries is keyed by name only); the
    class of a callable instance, every function defined on it, and the instance's attributes;
    a bound method's function and its instance; a `functools.partial`'s function and arguments.
    Values are keyed by content (tensors by bytes). Anything else (an open file, a lock, an
    object without attributes) is refused rather than guessed.
    """

    def __init__(self, root: Any) -> None:
        # The user's code is the package of the function a partial or a bound method wraps, or of the
        # callable itself (an instance's class); never of an attribute that happens to be named `func`.
        self.package = _package(_wrapped(root))
        self.seen: dict[int, str] = {}

    def callable(self, fn: Any, where: str, depth: int = 0) -> Any:
        if id(fn) in self.seen:
            return ["seen", self.seen[id(fn)]]
        self.seen[id(fn)] = where
        if isinstance(fn, functools.partial):
            return [
                "partial",
                self.callable(fn.func, f"{where}.func", depth + 1),
                [self.value(a, f"{where}.args[{i}]", depth + 1) for i, a in enumerate(fn.args)],
                {k: self.value(v, f"{where}.keywords[{k!r}]", depth + 1) for k, v in sorted(fn.keywords.items())},
            ]
        if isinstance(fn, types.MethodType):
            return [
                "method",
                self.callable(fn.__func__, f"{where}.__func__", depth + 1),
                self.value(fn.__self__, f"{where}.__self__", depth + 1),
            ]
        if isinstance(fn, types.FunctionType):
            return self.function(fn, where)
        if isinstance(fn, (types.BuiltinFunctionType, type)):
            return ["name", f"{_package(fn)}:{getattr(fn, '__module__', '?')}.{fn.__qualname__}"]
        if callable(fn) and hasattr(fn, "__dict__"):
            return ["instance", self.state(fn, where, depth)]  # the state holds the class and its methods
        raise UncacheableError(
            f"{where} is a {type(fn).__name__} whose behaviour cannot be keyed; pass a function, a bound "
            "method, a functools.partial or an instance of a Python class"
        )

    def function(self, fn: types.FunctionType, where: str) -> Any:
        name = f"{fn.__module__}.{fn.__qualname__}"
        if _package(fn) != self.package:
            return ["name", name]  # installed library code: its name (its version is the installation's)
        cells = [c.cell_contents for c in fn.__closure__ or ()]  # a closure over `fn` itself is "seen"
        globals_used = {}
        for global_name in _names(fn.__code__):
            if global_name not in fn.__globals__:
                continue
            found = fn.__globals__[global_name]
            if isinstance(found, (types.FunctionType, functools.partial)) and _package(_wrapped(found)) == self.package:
                globals_used[global_name] = self.callable(found, f"{where}.__globals__[{global_name!r}]")
            elif isinstance(found, type) and _package(found) == self.package:
                globals_used[global_name] = self.klass(found, f"{where}.__globals__[{global_name!r}]")
            elif self._constant(found):
                globals_used[global_name] = _stable_repr(found)
            # modules, installed classes and mutable globals are not keyed (documented)
        return [
            "function",
            name,
            _code_identity(fn.__code__),
            [self.value(d, f"{where}.__defaults__[{i}]", 1) for i, d in enumerate(fn.__defaults__ or ())],
            {
                k: self.value(v, f"{where}.__kwdefaults__[{k!r}]", 1)
                for k, v in sorted((fn.__kwdefaults__ or {}).items())
            },
            [self.value(c, f"{where}.__closure__[{i}]", 1) for i, c in enumerate(cells)],
            globals_used,
        ]

    def klass(self, cls: type, where: str) -> Any:
        key = f"class {cls.__module__}.{cls.__qualname__}"
        if id(cls) in self.seen:
            return ["seen", key]
        self.seen[id(cls)] = key
        methods = {}
        for base in cls.__mro__:
            if _package(base) != self.package:
                continue
            for attr, found in sorted(vars(base).items()):
                fn = found.__func__ if isinstance(found, (staticmethod, classmethod)) else found
                if isinstance(fn, property):
                    fn = fn.fget
                if isinstance(fn, types.FunctionType) and attr not in methods:
                    methods[attr] = self.function(fn, f"{where}: {base.__qualname__}.{attr}")
        return [key, methods]

    @staticmethod
    def _constant(value: Any) -> bool:
        if isinstance(value, (tuple, frozenset)):
            return all(_Keyer._constant(v) for v in value)
        return isinstance(value, (*_PLAIN, enum.Enum))

    def value(self, value: Any, where: str, depth: int) -> Any:
        if isinstance(value, (*_PLAIN, enum.Enum)):
            return repr(value)
        if depth > _MAX_DEPTH:
            raise UncacheableError(f"{where} nests deeper than {_MAX_DEPTH} levels; the cache cannot key it")
        if isinstance(value, torch.Tensor):
            t = value.detach().cpu().contiguous()
            digest = _digest()
            digest.update(t.view(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
            return ["tensor", str(t.dtype), list(t.shape), digest.hexdigest()]
        if isinstance(value, (list, tuple)):
            return [type(value).__name__, [self.value(v, f"{where}[{i}]", depth + 1) for i, v in enumerate(value)]]
        if isinstance(value, (set, frozenset)):
            return ["set", sorted(json.dumps(self.value(v, where, depth + 1), sort_keys=True) for v in value)]
        if isinstance(value, Mapping):
            return ["map", [[repr(k), self.value(v, f"{where}[{k!r}]", depth + 1)] for k, v in value.items()]]
        if isinstance(value, types.ModuleType):
            return ["module", value.__name__]
        if isinstance(value, type):
            return self.klass(value, where) if _package(value) == self.package else ["name", _qualified(value)]
        if isinstance(value, (types.FunctionType, types.MethodType, functools.partial, types.BuiltinFunctionType)):
            return self.callable(value, where, depth)
        if isinstance(value, nn.Module):
            return ["module-weights", type(value).__qualname__, weights_digest(value)]
        if id(value) in self.seen:
            return ["seen", self.seen[id(value)]]
        self.seen[id(value)] = where
        return self.state(value, where, depth)

    def state(self, value: Any, where: str, depth: int) -> Any:
        """An object's class and attributes (a dataclass's fields)."""
        state = getattr(value, "__dict__", None)
        if state is None and dataclasses.is_dataclass(value):
            state = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
        if state is None:
            raise UncacheableError(
                f"{where} holds a {type(value).__module__}.{type(value).__qualname__}, whose state the cache cannot "
                "read; keep plain values (numbers, strings, tensors, containers) in what evaluate_fn uses, or turn "
                "the cache off"
            )
        cls = self.klass(type(value), where) if _package(type(value)) == self.package else _qualified(type(value))
        return ["object", cls, {k: self.value(v, f"{where}.{k}", depth + 1) for k, v in sorted(state.items())}]


def function_identity(fn: Callable[..., Any]) -> str:
    """A digest of what calling `fn` runs and reads (see `_Keyer`): an edited function, method or
    `__call__`, another argument bound by a partial or a closure, or another attribute of a
    callable instance gives another identity, so the cache misses.

    Raises:
        UncacheableError: `fn` or its state holds something that cannot be keyed safely.

    Example:
        >>> def f(x):
        ...     return x + 1
        >>> def g(x):
        ...     return x + 2
        >>> function_identity(f) == function_identity(f), function_identity(f) == function_identity(g)
        (True, False)
        >>> function_identity(functools.partial(f, 1)) == function_identity(functools.partial(f, 2))
        False
    """
    name = getattr(fn, "__qualname__", type(fn).__qualname__)
    digest = _digest()
    digest.update(json.dumps(_Keyer(fn).callable(fn, "evaluate_fn"), sort_keys=True).encode())
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
        >>> temp = tempfile.TemporaryDirectory()
        >>> cache = ResultCache(temp.name)
        >>> cache.put("k1", SetResult("easy", {"accuracy": 0.5}, 8, 2, 0.3, []))
        >>> cache.get("k1").metrics, cache.get("k2")
        ({'accuracy': 0.5}, None)
        >>> temp.cleanup()
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
                sampling=data.get("sampling"),
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
            "sampling": result.sampling,
            "metrics": {k: (v if v == v else None) for k, v in result.metrics.items()},
        }
        tmp = self._path(key).with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(data, default=str), encoding="utf-8")
        os.replace(tmp, self._path(key))


class Broadcaster(Protocol):
    """What sends rank 0's object to every rank: a Lightning strategy, a Fabric."""

    def broadcast(self, obj: Any, src: int = 0) -> Any: ...


def cached_results(
    cache_dir: Path,
    module: nn.Module,
    eval_sets: Sequence[EvalSet],
    evaluate_fn: Callable[..., Any],
    *,
    is_global_zero: bool,
    broadcaster: Broadcaster,
    **settings: Any,
) -> tuple[dict[str, SetResult], dict[str, str]]:
    """The eval sets the cache answers (rank 0 looks; every rank gets its answer, so every rank
    skips the same sets) and, on rank 0, every set's key for `ResultCache.put`.

    `settings` are what else changes a result besides the weights, the eval set and `evaluate_fn`
    (seed, precision, table rows). An `evaluate_fn` whose state cannot be keyed evaluates every
    set and caches nothing, with a warning.
    """
    keys: dict[str, str] = {}
    hits: dict[str, SetResult] = {}
    if is_global_zero:
        try:
            weights = weights_digest(module)
            identity = function_identity(evaluate_fn)
            keys = {s.name: result_key(weights, s, **settings, evaluate_fn=identity) for s in eval_sets}
        except UncacheableError as err:  # state changed since construction: evaluate, cache nothing
            warnings.warn(f"result cache skipped this round: {err}", stacklevel=2)
        cache = ResultCache(cache_dir)
        hits = {name: r for name, key in keys.items() if (r := cache.get(key)) is not None}
    return broadcaster.broadcast(hits, src=0), keys
