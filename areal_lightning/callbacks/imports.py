"""Objects named by dotted paths, so that a YAML file (LightningCLI's ``init_args``) can name a
user's `evaluate_fn` or eval-set factory by a string."""

from __future__ import annotations

import importlib
from typing import Any

from areal_lightning.errors import ArgumentError

ACCEPTED = "a callable or a dotted path 'package.module.name' (or 'package.module:name') to one"


def import_object(path: str, owner: str, arg: str) -> Any:
    """The object `path` names, e.g. ``my_project.evals.evaluate`` or ``my_project.evals:evaluate``.

    Args:
        path: the module's import path, then ``.`` or ``:``, then the attribute (nested attributes
            are separated by ``.``: ``module:Class.method``).
        owner, arg: the call and argument named in the error, e.g. ``EvaluationCallback``, ``evaluate_fn``.

    Raises:
        ArgumentError: when no prefix of `path` imports as a module, or the module lacks the
            attribute; the message names the argument, the path and what failed.

    Example:
        >>> import_object("os.path:join", "EvaluationCallback", "evaluate_fn")("a", "b")
        'a/b'
        >>> import_object("os.path.nope", "EvaluationCallback", "evaluate_fn")
        Traceback (most recent call last):
        ...
        areal_lightning.errors.ArgumentError: `EvaluationCallback(evaluate_fn='os.path.nope')`: ... attribute 'nope'
    """
    if not isinstance(path, str) or not path.strip(". :"):
        raise ArgumentError(owner, arg, path, ACCEPTED)
    if ":" in path:
        module_name, _, attr_path = path.partition(":")
        candidates = [(module_name, attr_path.split("."))]
    else:
        parts = path.split(".")
        # The longest importable prefix is the module; the rest are attributes.
        candidates = [(".".join(parts[:i]), parts[i:]) for i in range(len(parts) - 1, 0, -1)]
    failure = f"no module of {path!r} can be imported"
    for module_name, attrs in candidates:
        try:
            obj: Any = importlib.import_module(module_name)
        except ModuleNotFoundError as err:
            if err.name is not None and not module_name.startswith(err.name) and err.name != module_name:
                raise  # the module exists but one of its own imports is missing: show the real problem
            continue
        owner_name = f"module {obj.__name__!r}"
        for attr in attrs:
            if not hasattr(obj, attr):
                failure = f"{owner_name} has no attribute {attr!r}"
                break
            obj = getattr(obj, attr)
            owner_name = repr(f"{obj.__module__}.{obj.__qualname__}") if hasattr(obj, "__qualname__") else repr(attr)
        else:
            return obj
        break
    raise ArgumentError(owner, arg, path, ACCEPTED, f"`{owner}({arg}={path!r})`: {failure}")


def named(value: Any, arg: str, *, call: bool = False) -> Any:
    """`EvaluationCallback`'s argument `arg` as given, or, for a string, the object it names (a YAML
    file, e.g. LightningCLI's ``init_args``, names a user's ``my_project.evals.evaluate``); with
    `call`, a named callable is called (a factory of eval sets).

    Example:
        >>> named("os.path:join", "evaluate_fn")("a", "b"), named(max, "evaluate_fn") is max
        ('a/b', True)
    """
    if not isinstance(value, str):
        return value
    found = import_object(value, "EvaluationCallback", arg)
    return found() if call and callable(found) else found
