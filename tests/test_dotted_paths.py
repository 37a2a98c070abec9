"""`evaluate_fn` and `eval_sets` named by a dotted path: a path that does not resolve is refused with
what failed, and a user's module whose own import fails is reported with its missing dependency."""

from __future__ import annotations

import pkgutil
from pathlib import Path

import pytest

from areal_lightning.callbacks import EvaluationCallback
from areal_lightning.errors import ArgumentError

MISSING = "a_dependency_that_is_not_installed"


@pytest.fixture
def user_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """``my_project`` with ``evals`` (imports fine) and ``broken`` (imports a missing dependency)."""
    package = tmp_path / "my_project"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "evals.py").write_text("def evaluate(module, batches, ctx):\n    return {}\n")
    (package / "broken.py").write_text(f"import {MISSING}\n\n\ndef evaluate(module, batches, ctx):\n    return {{}}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return "my_project"


def _callback(evaluate_fn: str) -> EvaluationCallback:
    return EvaluationCallback({"s": [1, 2]}, evaluate_fn, output_dir=None)


@pytest.mark.parametrize("path", ["my_project.broken.evaluate", "my_project.broken:evaluate"])
def test_a_module_whose_own_import_fails_is_reported_with_its_missing_dependency(user_package: str, path: str) -> None:
    with pytest.raises(ArgumentError, match=rf"importing module 'my_project.broken' failed: .*'{MISSING}'") as info:
        _callback(path)
    assert str(info.value).startswith(f"`EvaluationCallback(evaluate_fn={path!r})`")
    assert isinstance(info.value.__cause__, ModuleNotFoundError)  # the traceback shows the import that failed


def test_pkgutil_resolve_name_would_hide_the_missing_dependency(user_package: str) -> None:
    # Why `import_object` does not call `pkgutil.resolve_name`: its dotted form takes the failing
    # import for the end of the modules and names an attribute instead.
    with pytest.raises(AttributeError, match="module 'my_project' has no attribute 'broken'") as info:
        pkgutil.resolve_name("my_project.broken.evaluate")
    assert MISSING not in str(info.value)


@pytest.mark.parametrize(
    ("path", "failure"),
    [
        ("my_project.evals.evaluat", "module 'my_project.evals' has no attribute 'evaluat'"),
        ("my_project.evalz.evaluate", "module 'my_project' has no attribute 'evalz'"),
        ("my_project.evalz:evaluate", "no module of 'my_project.evalz:evaluate' can be imported"),
        ("not_a_project.evals.evaluate", "no module of 'not_a_project.evals.evaluate' can be imported"),
    ],
)
def test_a_path_that_does_not_resolve_names_what_failed(user_package: str, path: str, failure: str) -> None:
    with pytest.raises(ArgumentError) as info:
        _callback(path)
    assert str(info.value) == f"`EvaluationCallback(evaluate_fn={path!r})`: {failure}"
