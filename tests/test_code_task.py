"""The code task: problems read without a download, both prompt styles, the grader grading its gold."""

from __future__ import annotations

import ast
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from areal_lightning.scoring import ScoreStatus
from areal_lightning.tasks.code import CodeTask, extract_program
from areal_lightning.tasks.code_problems import humaneval_problems, read_code_problems

pytestmark = pytest.mark.process

MBPP_ROWS = [
    {
        "task_id": 11,
        "text": "Write a function to add two numbers.",
        "code": "def add(a, b):\n    return a + b",
        "test_list": ["assert add(1, 2) == 3", "assert add(-1, 1) == 0"],
    },
    {
        "task_id": 12,
        "prompt": "Write a function that doubles a number.",
        "code": "def double(x):\n    return 2 * x",
        "test": "assert double(4) == math.sqrt(64)",  # needs its test_setup_code
        "test_setup_code": "import math",
    },
]


def off_by_one(completion: str, header: str, entry_point: str) -> str:
    """The completion with every ``return x`` of the entry point's own body made ``return (x) + 1``."""
    module = ast.parse(header + completion)

    class OffByOne(ast.NodeTransformer):
        def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.FunctionDef:
            if node.name == entry_point:
                for child in ast.walk(node):
                    if isinstance(child, ast.Return) and child.value is not None:
                        child.value = ast.BinOp(child.value, ast.Add(), ast.Constant(1))
            return node

    return ast.unparse(OffByOne().visit(module))


@pytest.fixture(scope="module")
def humaneval() -> Iterator[CodeTask]:
    task = CodeTask("humaneval", workers=2)
    yield task
    task.sandbox.close()


def test_humaneval_comes_from_the_installed_package() -> None:
    problems = humaneval_problems()
    assert len(problems) == 164 and problems[0].task_id == "HumanEval/0"
    assert all(p.entry_point and p.header and p.reference for p in problems)


@pytest.mark.slow
def test_the_canonical_solutions_pass_and_an_off_by_one_of_each_fails(humaneval: CodeTask) -> None:
    samples = humaneval.samples()
    references = [humaneval.reference_completion(s) for s in samples]
    assert all(r is not None for r in references)
    scores = humaneval.score_many(references, [s.answer for s in samples])
    assert [s.labels for s in scores] == [("code/passed",)] * 164
    assert sum(s.reward for s in scores) == 164.0
    # The wrong solutions replace the whole program (header included): completions of an empty prompt.
    wrong = []
    for sample, problem in zip(samples, humaneval.problems, strict=True):
        assert problem.entry_point is not None and sample.reference is not None
        wrong.append(off_by_one(sample.reference, problem.header, problem.entry_point))
    empty_prefix = [json.dumps({**json.loads(s.answer), "prefix": ""}) for s in samples]
    wrong_scores = humaneval.score_many(wrong, empty_prefix)
    passed = [s.task_id for s, score in zip(samples, wrong_scores, strict=True) if score.reward > 0]
    assert passed == []
    assert {label for s in wrong_scores for label in s.labels} <= {"code/failed", "code/timeout"}


def test_instruction_style_grades_the_last_code_block(tmp_path: Path) -> None:
    task = CodeTask("humaneval", prompt_style="instruction")
    sample = task.samples()[0]
    assert "```python" in sample.prompt and "def has_close_elements" in sample.prompt and task.uses_chat_template
    reference = task.reference_completion(sample)
    assert reference is not None
    chatty = "Sure! First a wrong try:\n```python\ndef f(): pass\n```\nBetter:\n" + reference + "\nDone."
    no_block = "def has_close_elements(numbers, threshold): return False"
    scores = task.score_many([chatty, no_block], [sample.answer] * 2)
    assert scores[0].reward == 1.0 and scores[0].labels == ("code/passed",)
    assert (scores[1].reward, scores[1].status, scores[1].labels) == (
        0.0,
        ScoreStatus.PARSE_FAILURE,
        ("code/syntax_error",),
    )
    task.sandbox.close()


def test_mbpp_shaped_files_in_both_styles(tmp_path: Path) -> None:
    path = tmp_path / "mbpp.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in MBPP_ROWS) + "\n")
    for style in ("completion", "instruction"):
        task = CodeTask(path, prompt_style=style)
        samples = task.samples()
        assert [s.task_id for s in samples] == ["11", "12"] and samples[0].stratum == "mbpp"
        assert (
            "Write a function to add two numbers." in samples[0].prompt and "assert add(1, 2) == 3" in samples[0].prompt
        )
        references = [task.reference_completion(s) for s in samples]
        wrong = [r.replace("a + b", "a - b").replace("2 * x", "3 * x") for r in references if r]
        scores = task.score_many([*references, *wrong], [s.answer for s in samples] * 2)
        assert [s.reward for s in scores] == [1.0, 1.0, 0.0, 0.0], style
        task.sandbox.close()


def test_a_row_without_tests_is_refused_with_its_fields(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"text": "add", "code": "x"}) + "\n")
    with pytest.raises(
        ValueError,
        match=r"row 1 of .*bad.jsonl lacks tests \(field 'test' or 'test_list'\); fields present: code, text",
    ):
        read_code_problems(path)
    with pytest.raises(FileNotFoundError, match="no such file"):
        CodeTask(tmp_path / "missing.jsonl")
    with pytest.raises(ValueError, match=r"Possible choices are: 'completion' \(or 'plain'\), 'instruction'"):
        CodeTask("humaneval", prompt_style="fim")


def test_answer_ids_group_the_same_program() -> None:
    task = CodeTask("humaneval")
    assert task.answer_id("    return 1\n") == task.answer_id("    return 1   \n\n")
    assert task.answer_id("    return 1") != task.answer_id("    return 2")
    assert extract_program("```py\nx = 1\n```") == "x = 1\n"
    assert extract_program("```python\nunclosed = 1\n") == "unclosed = 1\n"  # cut by max_new_tokens
