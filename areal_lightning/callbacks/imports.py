"""Objects named by dotted paths, so that a YAML file (LightningCLI's ``init_args``) can name a
user's `evaluate_fn` or eval-set factory by a string."""

from __future__ import annotations

import importlib
from typing import Any

from areal_lightning.errors import ArgumentError

ACCEPTED = "a callable or a dotted path 'package.module.name' (or 'package.module:name') to one"


def import_object(path: str, owner: str, arg: str) -> Any:
    """The object `path` names, e.g. ``my_project.evals.evaluate`` or ``my_project.evals:evaluate``.

    A module whose own import fails (a missing dependency) is reported as that failure, not as a
    missing attribute (as `pkgutil.resolve_name` would).

    Args:
        path: the module's import path, then ``.`` or ``:``, then the attribute (nested attributes
            are separated by ``.``: ``module:Class.method``).
        owner, arg: the call and argument named in the error, e.g. ``EvaluationCallback``, ``evaluate_fn``.

    Raises:
        ArgumentError: when no prefix of `path` imports as a module, the module lacks the
            attribute, or the module's own import fails; the message names the argument, the path
            and what failed (for a failing import, the module and its error: the missing dependency).

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
        except ImportError as err:
            if isinstance(err, ModuleNotFoundError) and _is_prefix(err.name, module_name):
                continue  # `module_name` (or its package) is not a module: try a shorter prefix
            failure = f"importing module {module_name!r} failed: {type(err).__name__}: {err}"
            raise ArgumentError(owner, arg, path, ACCEPTED, f"`{owner}({arg}={path!r})`: {failure}") from err
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


def _is_prefix(name: str | None, module_name: str) -> bool:
    """`name` is `module_name` or one of its packages (``a`` and ``a.b`` for ``a.b``, not ``a.bc``)."""
    return name is not None and (module_name == name or module_name.startswith(f"{name}."))


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
