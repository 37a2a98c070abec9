"""What the result cache keys of an `evaluate_fn` (`function_identity`), without a Trainer: every
value it holds by content (tensors, containers, objects, modules, classes, functions), the code
it runs (its own, its helpers', its class's and bases' methods, also in other modules of the
user's package), and which object an alias points to; installed libraries by name; nothing it
cannot key (refused with the path to the value and the way out), nothing nested past the limit.
A key that stays the same when one of these changes serves a stale result."""

from __future__ import annotations

import functools
import importlib
import inspect
import json
import math
import sys
import threading
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from areal_lightning.eval_round.cache import UncacheableError, function_identity, weights_digest

LIMIT = 8  # how deep the cache follows nested values
_QuantizedLinear = __import__("torch.ao.nn.quantized", fromlist=["Linear"]).Linear


def _evaluate(module: Any, batches: Any, ctx: Any, *args: Any, **kwargs: Any) -> dict[str, float]:
    return {"accuracy": 0.5}


class Holder:
    """A callable instance whose attributes are whatever the test gives it."""

    def __init__(self, **attrs: Any) -> None:
        self.__dict__.update(attrs)

    def __call__(self, module: Any, batches: Any, ctx: Any) -> dict[str, float]:
        return {"accuracy": 0.5}

    def run(self, module: Any, batches: Any, ctx: Any) -> dict[str, float]:
        return {"accuracy": 0.5}


class Plain:
    def __init__(self, v: Any) -> None:
        self.v = v


class Other:
    def __init__(self, v: Any) -> None:
        self.v = v

    def scale(self) -> float:
        return 2.0


def _same(a: Any, b: Any) -> bool:
    return function_identity(a) == function_identity(b)


# ---------------------------------------------------------------------------- values by content


@pytest.mark.parametrize(
    ("one", "two"),
    [
        (torch.tensor([1.0, 2.0]), torch.tensor([1.0, 3.0])),
        (torch.zeros(2, dtype=torch.float32), torch.zeros(2, dtype=torch.int32)),  # the same bytes
        (torch.arange(6.0).reshape(2, 3), torch.arange(6.0).reshape(3, 2)),  # the same bytes
        ([1, 2], [1, 3]),
        ([1, 2], (1, 2)),
        ([torch.ones(2)], [torch.zeros(2)]),
        (frozenset({1, 2}), frozenset({1, 3})),
        ({"a": 1}, {"a": 2}),
        ({"a": 1}, {"b": 1}),
        ({"a": torch.ones(1)}, {"a": torch.zeros(1)}),
        (math, torch),
        (Plain(1), Plain(2)),
        (Plain(1), Other(1)),
        (types.SimpleNamespace(v=1), types.SimpleNamespace(v=2)),
        (types.SimpleNamespace(v=1), __import__("argparse").Namespace(v=1)),
        (nn.ReLU(), nn.Tanh()),  # no weights: the class tells them apart
        (nn.Linear(2, 2), nn.Linear(2, 2)),  # other weights
        (Plain, Other),
        (nn.Linear, _QuantizedLinear),  # one name, two classes
        (_evaluate, Holder.run),
        (functools.partial(_evaluate, 1), functools.partial(_evaluate, 2)),
        (math.floor, math.ceil),
        (json.dumps, json.loads),  # installed Python functions: by name
        (functools.partial(nn.Linear, 2), functools.partial(_QuantizedLinear, 2)),  # a factory of a class
    ],
    ids=[
        "tensor values",
        "tensor dtype",
        "tensor shape",
        "list",
        "list or tuple",
        "tensor in a list",
        "set",
        "mapping value",
        "mapping key",
        "tensor in a mapping",
        "module",
        "object",
        "object's class",
        "installed object",
        "installed object's class",
        "torch module's class",
        "torch module's weights",
        "class",
        "installed class of the same name",
        "function",
        "partial",
        "builtin",
        "installed function",
        "partial of an installed class of the same name",
    ],
)
def test_another_value_held_by_the_evaluate_fn_gives_another_identity(one: Any, two: Any) -> None:
    assert not _same(Holder(x=one), Holder(x=two))
    assert _same(Holder(x=one), Holder(x=one))


def test_equal_values_in_other_objects_give_the_same_identity() -> None:
    t = torch.arange(6.0).reshape(2, 3)
    assert _same(Holder(x=t.t()), Holder(x=t.t().contiguous()))  # a strided view is keyed by its values
    assert _same(Holder(x=torch.zeros(0)), Holder(x=torch.zeros(0)))
    assert not _same(Holder(x=torch.zeros(0)), Holder(x=torch.zeros(0, 2)))
    assert _same(Holder(x=[Plain({"a": (1, 2)})]), Holder(x=[Plain({"a": (1, 2)})]))
    lin = nn.Linear(2, 2)
    copy = nn.Linear(2, 2)
    copy.load_state_dict(lin.state_dict())
    assert _same(Holder(x=lin), Holder(x=copy))
    with torch.no_grad():
        copy.weight[0, 0] += 1
    assert not _same(Holder(x=lin), Holder(x=copy))


@dataclass(slots=True)
class Slotted:
    scale: float


@dataclass
class WithExtra:
    scale: float

    def __post_init__(self) -> None:
        self.derived = self.scale * 2  # not a field: still part of what evaluate_fn reads


def test_dataclasses_with_slots_or_extra_attributes_are_keyed_by_everything_they_hold() -> None:
    assert not _same(Holder(x=Slotted(1.0)), Holder(x=Slotted(2.0)))
    a, b = WithExtra(1.0), WithExtra(1.0)
    b.derived = 3.0
    assert not _same(Holder(x=a), Holder(x=b))


def test_which_object_an_alias_points_to_is_keyed() -> None:
    """`z` is the same object as `a`'s or as `b`'s part: evaluate_fn reading `z` gets another value."""
    p, q = Plain(1), Plain(2)

    def f(m: Any, b: Any, c: Any) -> dict:
        return {"f": 1.0}

    def g(m: Any, b: Any, c: Any) -> dict:
        return {"g": 1.0}

    class A(Holder):
        def run(self, module: Any, batches: Any, ctx: Any) -> dict[str, float]:
            return {"a": 1.0}

    class B(Holder):
        def run(self, module: Any, batches: Any, ctx: Any) -> dict[str, float]:
            return {"b": 1.0}

    def with_default(m: Any, b: Any, c: Any, x: Any = p) -> dict:
        return {}

    def with_other_default(m: Any, b: Any, c: Any, x: Any = q) -> dict:
        return {}

    def with_kwdefault(m: Any, b: Any, c: Any, *, x: Any = p) -> dict:
        return {}

    def with_other_kwdefault(m: Any, b: Any, c: Any, *, x: Any = q) -> dict:
        return {}

    def closing(v: Any) -> Callable[..., dict]:
        def inner(m: Any, b: Any, c: Any) -> dict:
            return {"v": v}

        return inner

    cases = {
        "objects": ((p, q), p, q),
        "in a list": (([p, q],), p, q),
        "in a mapping": (({"x": p, "y": q},), p, q),
        "functions": ((f, g), f, g),
        "classes": ((A, B), A, B),
        "methods' functions": ((A().run, B().run), A.run, B.run),
        "partials' functions": ((functools.partial(f, 1), functools.partial(g, 1)), f, g),
        "defaults": ((with_default, with_other_default), p, q),
        "keyword defaults": ((with_kwdefault, with_other_kwdefault), p, q),
        "closures": ((closing(p), closing(q)), p, q),
        "helpers' globals": ((_uses_first_helper, _uses_second_helper), _first_helper, _second_helper),
        "classes of objects, built again by partials": ((A(), B()), functools.partial(A), functools.partial(B)),
    }
    for what, (parts, one, two) in cases.items():
        attrs = {f"a{i}": part for i, part in enumerate(parts)}
        assert not _same(Holder(**attrs, z=one), Holder(**attrs, z=two)), what
        assert _same(Holder(**attrs, z=one), Holder(**attrs, z=one)), what


def _first_helper(x: float) -> float:
    return x + 1


def _second_helper(x: float) -> float:
    return x + 2


def _uses_first_helper(m: Any, b: Any, c: Any) -> dict:
    return {"x": _first_helper(1.0)}


def _uses_second_helper(m: Any, b: Any, c: Any) -> dict:
    return {"x": _second_helper(1.0)}


def _recursive(m: Any, b: Any, c: Any, n: int = 2) -> dict:
    return {} if n == 0 else _recursive(m, b, c, n - 1)


class SelfReferring:
    KIND = "x"

    def __call__(self, module: Any, batches: Any, ctx: Any) -> dict:
        return {"k": float(isinstance(self, SelfReferring))}


def test_functions_classes_and_objects_that_refer_to_themselves_are_keyed() -> None:
    assert _same(_recursive, _recursive)
    node, other = Plain(1), Plain(1)
    node.parent = node.child = Plain(node)  # type: ignore[attr-defined]
    other.parent = other.child = Plain(other)  # type: ignore[attr-defined]
    assert _same(Holder(x=node), Holder(x=other))
    other.v = 2
    assert not _same(Holder(x=node), Holder(x=other))

    def outer() -> Callable[..., dict]:
        def again(m: Any, b: Any, c: Any, n: int = 1) -> dict:
            return {} if n == 0 else again(m, b, c, n - 1)

        return again

    assert _same(outer(), outer())
    assert _same(SelfReferring(), SelfReferring())


# ---------------------------------------------------------------------------- code


USER_PACKAGE = {
    "__init__.py": "",
    "helpers.py": """
FACTOR = {factor}
LIMITS = (frozenset({{1, 2}}), {limit})


def helper(w):
    return [v * FACTOR for v in w]


class Base:
    def shift(self):
        return {shift}


class Counter:
    def __init__(self):
        self.n = 0


class Extra:
    def value(self):
        return {extra}
""",
    "evaluate.py": """
import contextlib
from inspect import getattr_static

from {pkg} import helpers
from {pkg}.helpers import LIMITS, Base, Counter, helper

CALLS = Counter()
PAIR = (Counter(), 1)


class Evaluate(contextlib.ContextDecorator, Base):
    def __call__(self, module, batches, ctx):
        CALLS.n += 1
        return {{"w": float(len(helper([1.0]))) + self.shift() + len(LIMITS) + len(PAIR) + {own}}}

    @staticmethod
    def tool():
        return {static}

    @classmethod
    def make(cls):
        return cls()

    @property
    def size(self):
        return {prop}

    def lookup(self, name):
        return getattr_static(self, name)


def evaluate(module, batches, ctx):
    return Evaluate()(module, batches, ctx) if {own} in {{0, 1}} else {{}}
""",
}
DEFAULTS = {"factor": 1.0, "limit": 3, "shift": 0.0, "own": 0, "static": 1, "prop": 1, "extra": 0}
_imported = iter(range(1_000_000))


def _import_user_package(root: Path, **edits: Any) -> types.ModuleType:
    """The user's package (two modules), written with `edits` and imported afresh, as a new process would."""
    pkg, where = "userpkg", root / f"copy{next(_imported)}"
    (where / pkg).mkdir(parents=True)
    for name, text in USER_PACKAGE.items():
        (where / pkg / name).write_text(text.format(pkg=pkg, **{**DEFAULTS, **edits}))
    for name in [m for m in sys.modules if m == pkg or m.startswith(f"{pkg}.")]:
        del sys.modules[name]
    sys.path.insert(0, str(where))
    try:
        importlib.invalidate_caches()
        return importlib.import_module(f"{pkg}.evaluate")
    finally:
        sys.path.remove(str(where))


@pytest.fixture
def user_package(tmp_path: Path) -> Iterator[Callable[..., types.ModuleType]]:
    before = set(sys.modules)
    yield functools.partial(_import_user_package, tmp_path)
    for name in set(sys.modules) - before:
        if name.startswith("userpkg"):
            del sys.modules[name]


def test_the_unchanged_users_package_imported_again_gives_the_same_identity(user_package: Any) -> None:
    """Also with a global tuple holding an object (not a constant: not keyed, its repr holds an address)."""
    first, second = user_package(), user_package()
    assert first.Evaluate is not second.Evaluate  # another import: other objects, the same code
    assert function_identity(first.Evaluate()) == function_identity(second.Evaluate())
    assert function_identity(first.evaluate) == function_identity(second.evaluate)
    assert function_identity(functools.partial(first.evaluate)) == function_identity(functools.partial(second.evaluate))


@pytest.mark.parametrize(
    "edit",
    [
        {"own": 1},  # __call__ itself
        {"factor": 2.0},  # a constant of another module of the package, read by a helper
        {"limit": 4},  # a tuple constant imported from the other module
        {"shift": 1.0},  # a method of a base class defined in the other module
        {"static": 2},  # a staticmethod
        {"prop": 2},  # a property
    ],
    ids=lambda e: next(iter(e)),
)
def test_an_edit_anywhere_in_the_users_package_gives_another_identity(user_package: Any, edit: dict) -> None:
    before, after = user_package(), user_package(**edit)
    assert function_identity(before.Evaluate()) != function_identity(after.Evaluate())
    # The same through a partial, a bound method and the module-level function that calls the class.
    assert function_identity(functools.partial(before.Evaluate())) != function_identity(
        functools.partial(after.Evaluate())
    )
    assert function_identity(before.Evaluate().lookup) != function_identity(after.Evaluate().lookup)
    assert function_identity(before.evaluate) != function_identity(after.evaluate)


def test_a_mutable_global_and_installed_code_are_not_followed(user_package: Any) -> None:
    """A call counter in a global does not make every round a miss; an installed function (here one
    with a sentinel object as its default, which the cache could not key) is keyed by its name."""
    module = user_package()
    evaluate = module.Evaluate()
    identity = function_identity(evaluate)
    evaluate(None, [], None)
    assert module.CALLS.n == 1 and function_identity(evaluate) == identity
    sentinel = (inspect.getattr_static.__defaults__ or (None,))[0]
    assert type(sentinel) is object  # a default the cache could not key, were it followed
    assert function_identity(functools.partial(_evaluate, post=inspect.getattr_static)) == function_identity(
        functools.partial(_evaluate, post=inspect.getattr_static)
    )


def test_a_callable_with_an_attribute_named_func_still_keys_its_own_code(user_package: Any) -> None:
    before, after = user_package(), user_package(own=1)
    one, two = before.Evaluate(), after.Evaluate()
    one.func = two.func = torch.sigmoid  # an installed function under the name a partial uses
    assert function_identity(one) != function_identity(two)
    one.__module__ = two.__module__ = "torch"  # an instance's own __module__ is not its class's
    assert function_identity(one) != function_identity(two)


def test_code_constants_are_keyed_by_value() -> None:
    def a(m: Any, b: Any, c: Any) -> dict:
        return {"x": float(c in {"easy", "hard"}), "t": (1, 2)}

    def b(m: Any, b: Any, c: Any) -> dict:
        return {"x": float(c in {"easy", "other"}), "t": (1, 2)}

    def c(m: Any, b: Any, c: Any) -> dict:
        return {"x": float(c in {"easy", "hard"}), "t": (1, 3)}

    assert len({function_identity(f).split(":")[1] for f in (a, b, c)}) == 3


# ---------------------------------------------------------------------------- refused, with the path


def _lock() -> Any:
    return threading.Lock()


def _with_default(lock: Any) -> Callable[..., dict]:
    def evaluate(m: Any, b: Any, c: Any, x: Any = lock) -> dict:
        return {}

    return evaluate


def _with_kwdefault(lock: Any) -> Callable[..., dict]:
    def evaluate(m: Any, b: Any, c: Any, *, x: Any = lock) -> dict:
        return {}

    return evaluate


def _closing(value: Any) -> Callable[..., dict]:
    def evaluate(m: Any, b: Any, c: Any) -> dict:
        return {"v": value}

    return evaluate


LOCKED = functools.partial(_evaluate, threading.Lock())


def _uses_locked(m: Any, b: Any, c: Any) -> dict:
    return LOCKED(m, b, c)


def _calling(helper: Callable[..., dict]) -> Callable[..., dict]:
    """A function that calls `helper` through a global of its module."""
    global _HELPER
    _HELPER = helper

    def evaluate(m: Any, b: Any, c: Any) -> dict:
        return _HELPER(m, b, c)

    return evaluate


_HELPER: Callable[..., dict] = _evaluate


def _method_over(fn: Any) -> Any:
    return types.MethodType(fn, Plain(0))


_ROUTES: dict[str, tuple[Callable[[Any], Any], str]] = {
    # route: (evaluate_fn holding `inner` that way, the path the message names for `inner`)
    "attribute": (lambda inner: Holder(x=inner), "evaluate_fn.x"),
    "partial argument": (lambda inner: functools.partial(_evaluate, inner), "evaluate_fn.args[0]"),
    "partial keyword": (lambda inner: functools.partial(_evaluate, k=inner), "evaluate_fn.keywords['k']"),
    "partial's instance": (lambda inner: functools.partial(Holder(x=inner)), "evaluate_fn.func.x"),
    "bound method's instance": (lambda inner: Holder(x=inner).run, "evaluate_fn.__self__.x"),
    "method over a partial": (
        lambda inner: _method_over(functools.partial(_evaluate, inner)),
        "evaluate_fn.__func__.args[0]",
    ),
    "default": (_with_default, "evaluate_fn.__defaults__[0]"),
    "keyword default": (_with_kwdefault, "evaluate_fn.__kwdefaults__['x']"),
    "closure": (_closing, "evaluate_fn.__closure__[0]"),
    "helper's default": (
        lambda inner: _calling(_with_default(inner)),
        "evaluate_fn.__globals__['_HELPER'].__defaults__[0]",
    ),
    "list item": (lambda inner: Holder(x=[1, inner]), "evaluate_fn.x[1]"),
    "mapping value": (lambda inner: Holder(x={"k": inner}), "evaluate_fn.x['k']"),
    "set member": (lambda inner: Holder(x=frozenset({inner})), "evaluate_fn.x"),
    "attribute's partial": (lambda inner: Holder(x=functools.partial(_evaluate, inner)), "evaluate_fn.x.args[0]"),
    "attribute's object": (lambda inner: Holder(x=Plain(inner)), "evaluate_fn.x.v"),
}
_CANNOT_READ = (
    "holds a _thread.lock, whose state the cache cannot read; keep plain values (numbers, strings, tensors, "
    "containers) in what evaluate_fn uses, or turn the cache off"
)


@pytest.mark.parametrize("route", list(_ROUTES))
def test_a_value_the_cache_cannot_key_is_refused_naming_where_it_is(route: str) -> None:
    make, path = _ROUTES[route]
    with pytest.raises(UncacheableError) as err:
        function_identity(make(threading.Lock()))
    assert str(err.value) == f"{path} {_CANNOT_READ}"


def test_refusals_of_a_global_and_of_a_callable_without_state_say_what_is_accepted() -> None:
    with pytest.raises(UncacheableError) as err:
        function_identity(_uses_locked)
    assert str(err.value) == f"evaluate_fn.__globals__['LOCKED'].args[0] {_CANNOT_READ}"
    import operator

    with pytest.raises(UncacheableError) as err:
        function_identity(operator.itemgetter(1))
    assert str(err.value) == (
        "evaluate_fn is a itemgetter whose behaviour cannot be keyed; pass a function, a bound method, "
        "a functools.partial or an instance of a Python class"
    )


def _nested(levels: int) -> Any:
    """`levels` lists, one inside the other (an empty list innermost)."""
    value: list = []
    for _ in range(levels - 1):
        value = [value]
    return value


def _nested_sets(levels: int) -> Any:
    value: frozenset = frozenset()
    for _ in range(levels - 1):
        value = frozenset({value})
    return value


# The depth at which each route holds its value (the callable itself is at 0).
_START = {
    "attribute": 1,
    "partial argument": 1,
    "partial keyword": 1,
    "partial's instance": 2,
    "bound method's instance": 2,
    "method over a partial": 2,
    "default": 1,
    "keyword default": 1,
    "closure": 1,
    "list item": 2,
    "mapping value": 2,
    "attribute's partial": 2,
    "attribute's object": 2,
}


@pytest.mark.parametrize("route", list(_START))
def test_values_nested_up_to_the_limit_are_keyed_and_deeper_ones_refused(route: str) -> None:
    make, path = _ROUTES[route]
    levels = LIMIT - _START[route] + 1  # the innermost list at depth LIMIT
    function_identity(make(_nested(levels)))
    with pytest.raises(UncacheableError) as err:
        function_identity(make(_nested(levels + 1)))
    assert str(err.value) == f"{path}{'[0]' * levels} nests deeper than {LIMIT} levels; the cache cannot key it"


def test_nested_sets_count_their_levels_too() -> None:
    function_identity(Holder(x=_nested_sets(LIMIT)))
    with pytest.raises(UncacheableError, match=r"^evaluate_fn.x nests deeper than 8 levels; the cache cannot key it$"):
        function_identity(Holder(x=_nested_sets(LIMIT + 1)))


# ---------------------------------------------------------------------------- sharded weights


def test_sharded_weights_are_refused_naming_the_module_and_the_way_out() -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    if dist.is_initialized():
        pytest.skip("a process group is already up in this process")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        model = nn.Linear(2, 2)
        model.weight = nn.Parameter(distribute_tensor(model.weight.detach(), mesh, [Shard(0)]))
        with pytest.raises(UncacheableError) as err:
            weights_digest(model)
        assert str(err.value) == (
            "Linear has parameters sharded over the ranks (FSDP); the result cache needs whole weights on "
            "rank 0: turn the cache off"
        )
    finally:
        dist.destroy_process_group()


def _class_with_default(lock: Any) -> type:
    class Locked:
        def __call__(self, m: Any, b: Any, c: Any, x: Any = lock) -> dict:
            return {}

    return Locked


def _calling_class(cls: type) -> Callable[..., dict]:
    """A function that builds `cls` through a global of its module."""
    global _CLASS
    _CLASS = cls

    def evaluate(m: Any, b: Any, c: Any) -> dict:
        return _CLASS()(m, b, c)

    return evaluate


_CLASS: type = Plain


@pytest.mark.parametrize(
    ("make", "path"),
    [
        (lambda cls: cls(), "evaluate_fn"),
        (lambda cls: Holder(x=cls()), "evaluate_fn.x"),
        (lambda cls: Holder(x=cls), "evaluate_fn.x"),
        (_calling_class, "evaluate_fn.__globals__['_CLASS']"),
    ],
    ids=["callable instance", "attribute's object", "class held", "class of a global"],
)
def test_a_method_default_the_cache_cannot_key_is_refused_naming_the_method(make: Any, path: str) -> None:
    cls = _class_with_default(threading.Lock())
    with pytest.raises(UncacheableError) as err:
        function_identity(make(cls))
    assert str(err.value) == f"{path}: {cls.__qualname__}.__call__.__defaults__[0] {_CANNOT_READ}"


def test_an_edited_class_held_as_a_value_gives_another_identity(user_package: Any) -> None:
    """A class of the user's package that the instance holds (not one it calls) is keyed by its code."""

    def holding(module: types.ModuleType) -> Any:
        evaluate = module.Evaluate()
        evaluate.kind = module.helpers.Extra
        return evaluate

    before, after, again = user_package(), user_package(extra=1), user_package()
    assert function_identity(before.Evaluate()) == function_identity(after.Evaluate())  # not used by Evaluate
    assert function_identity(holding(before)) != function_identity(holding(after))
    assert function_identity(holding(before)) == function_identity(holding(again))
