"""The package stays readable: every module under 400 lines (the app, rl and tasks included), the
callback under 300, no function longer than 60 lines of code (its docstring not counted), no string
that documents nothing."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "areal_lightning"
MAX_MODULE_LINES = 400
MAX_CALLBACK_LINES = 300
MAX_FUNCTION_LINES = 60


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _code_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    body = node.body
    first = body[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        body = body[1:]
    if not body:
        return 0
    assert node.end_lineno is not None
    return node.end_lineno - body[0].lineno + 1


def long_functions(source: str) -> list[tuple[str, int]]:
    """(name, lines) of each function or method over the limit."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _code_lines(node) > MAX_FUNCTION_LINES:
            found.append((node.name, _code_lines(node)))
    return found


def test_every_module_stays_under_400_lines() -> None:
    lines = {str(p.relative_to(PACKAGE)): len(p.read_text().splitlines()) for p in _modules()}
    assert {name: n for name, n in lines.items() if n > MAX_MODULE_LINES} == {}


def test_the_callback_is_a_thin_hook_layer() -> None:
    lines = len((PACKAGE / "callbacks" / "evaluation_callback.py").read_text().splitlines())
    assert lines < MAX_CALLBACK_LINES


@pytest.mark.parametrize("module", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_function_is_longer_than_60_lines(module: Path) -> None:
    assert long_functions(module.read_text()) == []


def test_the_function_length_check_counts_code_not_docstrings() -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    docstring = '    """' + "\n".join(["doc"] * 20) + '"""\n'
    assert long_functions(f"def f():\n{docstring}{body}\n") == []
    assert long_functions(f"def f():\n{body}\n    return 0\n") == [("f", MAX_FUNCTION_LINES + 1)]


def stray_strings(source: str) -> list[int]:
    """Lines of string statements that document nothing: neither the first statement of a module,
    class or function (its docstring) nor right after an assignment (the attribute's docstring)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        for field in ("body", "orelse", "finalbody"):
            body = getattr(node, field, None)
            if not isinstance(body, list):
                continue
            for i, stmt in enumerate(body):
                if not (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)):
                    continue
                if not isinstance(stmt.value.value, str):
                    continue
                documents = field == "body" and (
                    (i == 0 and isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)))
                    or (i > 0 and isinstance(body[i - 1], (ast.Assign, ast.AnnAssign)))
                )
                if not documents:
                    found.append(stmt.lineno)
    return found


@pytest.mark.parametrize("module", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_every_string_statement_documents_something(module: Path) -> None:
    assert stray_strings(module.read_text()) == []


def test_the_stray_string_check_finds_a_docstring_left_after_a_function() -> None:
    documented = '"""Module."""\nX = 1\n"""X\'s doc."""\n\n\ndef f():\n    """f\'s doc."""\n'
    assert stray_strings(documented) == []
    assert stray_strings(documented + '\n\n"""Left behind."""\n') == [10]
