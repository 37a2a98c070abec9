"""Names a package imports on first use (PEP 562), so that importing it stays cheap."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(
    package: str, exports: Mapping[str, str], namespace: dict[str, Any]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The `__getattr__` and `__dir__` of `package`: ``exports[name]`` is the module that defines
    `name`; it is imported on the first access and the value kept in `namespace` (the package's
    ``globals()``).

    Example:
        >>> getattr_, dir_ = lazy_exports("demo", {"sqrt": "math"}, ns := {})
        >>> getattr_("sqrt")(4.0), "sqrt" in ns, dir_()
        (2.0, True, ['sqrt'])
    """

    def __getattr__(name: str) -> Any:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(exports[name]), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *exports})

    return __getattr__, __dir__
