"""The code task's prompts, programs and null programs in both styles, without running a program
(a `CodeTask` starts its sandbox only when it grades): what the policy is shown, what is run for a
completion, and what the integrity check's null program is. `test_code_task.py` grades them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from areal_lightning.metrics.constants import NO_ANSWER
from areal_lightning.scoring import SandboxLimits
from areal_lightning.tasks.code import CodePromptStyle, CodeTask, null_program
from areal_lightning.tasks.code_problems import problem_from_row

HEADER = 'import math\nfrom typing import Final\n\n\ndef root(x: float) -> float:\n    """The square root of x."""\n'
HUMANEVAL_ROW = {
    "task_id": "mine/0",
    "prompt": HEADER,
    "canonical_solution": "    return math.sqrt(x)\n",
    "test": "def check(candidate):\n    assert candidate(4) == 2\n",
    "entry_point": "root",
}
MBPP_ROW = {
    "task_id": 7,
    "text": "Write a function to add two numbers.  ",
    "code": "def add(a, b):\n    return a + b",
    "test_list": ["assert add(1, 2) == 3", "assert add(0, 0) == 0"],
}


def _task(tmp_path: Path, row: dict, **kwargs: object) -> CodeTask:
    path = tmp_path / "problems.jsonl"
    path.write_text(json.dumps(row) + "\n")
    return CodeTask(path, **kwargs)  # type: ignore[arg-type]


def test_the_completion_style_shows_the_header_and_runs_header_plus_completion(tmp_path: Path) -> None:
    task = _task(tmp_path, HUMANEVAL_ROW, prompt_style="plain")
    (sample,) = task.samples()
    assert task.prompt_style is CodePromptStyle.COMPLETION and not task.uses_chat_template
    assert (sample.index, sample.prompt, sample.task_id, sample.stratum) == (0, HEADER, "mine/0", "problems")
    assert task.reference_completion(sample) == "    return math.sqrt(x)\n"
    assert task.null_completion(sample) == "    return None\n"
    spec = json.loads(sample.answer)
    assert spec == {"style": "completion", "prefix": HEADER, "tests": HUMANEVAL_ROW["test"], "entry_point": "root"}
    assert task.program("    return 1.0\n", sample.answer) == HEADER + "    return 1.0\n"
    assert sample.key == HEADER + sample.answer
    assert task.train_samples() == task.samples() and task.samples() is not task.samples()


def test_the_instruction_style_asks_for_a_code_block_and_runs_its_last_block(tmp_path: Path) -> None:
    task = _task(tmp_path, HUMANEVAL_ROW, prompt_style="chat")
    (sample,) = task.samples()
    assert task.prompt_style is CodePromptStyle.INSTRUCTION and task.uses_chat_template
    assert sample.prompt == (
        "Complete this Python function:\n```python\n" + HEADER.rstrip() + "\n```\n\n"
        "Answer with the complete Python program in one ```python code block."
    )
    assert task.reference_completion(sample) == "```python\n" + HEADER + "    return math.sqrt(x)\n\n```"
    assert task.null_completion(sample) == "```python\n" + HEADER + "    return None\n```"
    # the header's imports go before the answer's program: a program that forgot them still runs
    assert json.loads(sample.answer)["prefix"] == "import math\nfrom typing import Final\n"
    answer = "First:\n```python\nwrong = 1\n```\nThen:\n```python\ndef root(x):\n    return x\n```\nDone."
    assert task.program(answer, sample.answer) == "import math\nfrom typing import Final\ndef root(x):\n    return x\n"
    assert task.program("def root(x): return x", sample.answer) is None


def test_a_problem_in_words_is_stated_with_its_tests_in_both_styles(tmp_path: Path) -> None:
    tests = "assert add(1, 2) == 3\nassert add(0, 0) == 0"
    plain = _task(tmp_path, MBPP_ROW)
    (sample,) = plain.samples()
    assert sample.prompt == f'"""\nWrite a function to add two numbers.\n{tests}\n"""\n'
    assert plain.null_completion(sample) == "pass\n"  # no entry point: an empty module
    chat = _task(tmp_path, MBPP_ROW, prompt_style=CodePromptStyle.INSTRUCTION, prompt_template="Q: {question}")
    (sample,) = chat.samples()
    assert sample.prompt == f"Q: Write a function to add two numbers.\nYour code should pass these tests:\n{tests}"
    assert json.loads(sample.answer)["prefix"] == ""
    assert chat.reference_completion(sample) == "```python\ndef add(a, b):\n    return a + b\n```"


def test_a_null_program_returns_none_at_the_headers_indent_or_from_the_entry_point() -> None:
    tabbed = problem_from_row({"prompt": "def f(x):\n\t'Doc.'", "test": "def check(c):\n    pass"}, 0, "t")
    assert null_program(tabbed) == "def f(x):\n\t'Doc.'\n\treturn None\n"
    deep = problem_from_row({"prompt": "def f(x):\n        'Doc.'\n\n", "test": "def check(c):\n    pass"}, 0, "t")
    assert null_program(deep) == "def f(x):\n        'Doc.'\n\n        return None\n"
    bare = problem_from_row({"prompt": "def f(x):\n", "test": "def check(c):\n    pass"}, 0, "t")
    assert null_program(bare) == "def f(x):\n    return None\n"  # no body line: four spaces
    words = problem_from_row({"text": "Add.", "test": "assert add(1, 1) == 2", "entry_point": "add"}, 0, "t")
    assert null_program(words) == "def add(*args, **kwargs):\n    return None\n"


def test_a_template_without_its_question_and_an_unknown_style_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"^`CodeTask\(prompt_template='Solve it'\)` must contain '\{question\}'$"):
        _task(tmp_path, MBPP_ROW, prompt_template="Solve it")
    with pytest.raises(ValueError) as err:
        _task(tmp_path, MBPP_ROW, prompt_style="fim")
    assert str(err.value) == (
        "Unsupported parameter value `CodeTask(prompt_style='fim')`. Possible choices are: "
        "'completion' (or 'plain'), 'instruction' (or 'chat')"
    )


def test_answer_ids_group_a_program_whatever_its_blanks_and_chat(tmp_path: Path) -> None:
    chat = _task(tmp_path, HUMANEVAL_ROW, prompt_style="instruction")
    one = chat.answer_id("Here:\n```python\nx = 1\n```")
    assert one == chat.answer_id("Surely:\n```python\n\nx = 1   \n\n```\nBye.")
    assert one != chat.answer_id("```python\nx = 2\n```")
    assert chat.answer_id("no code at all") == chat.answer_id("```python\n   \n```") == NO_ANSWER
    plain = _task(tmp_path, HUMANEVAL_ROW)
    assert plain.answer_id("\n\n") == NO_ANSWER and plain.answer_id("x = 1") == one
    assert plain.answer_id("if x:\n    y = 1") != plain.answer_id("if x:\ny = 1")  # indentation is syntax
    assert 0 <= one < 2**56  # seven bytes: an id every rank computes alike


def test_the_sandbox_the_source_and_samples_without_a_reference(tmp_path: Path) -> None:
    # no program runs: a task starts its sandbox's workers when it first grades
    default, three = _task(tmp_path, MBPP_ROW), _task(tmp_path, MBPP_ROW, workers=3, limits=SandboxLimits(wall_s=2.0))
    assert (default.sandbox.workers, three.sandbox.workers, three.sandbox.limits.wall_s) == (1, 3, 2.0)
    assert CodeTask("humaneval").samples()[0].stratum == "humaneval"
    unsolved = {k: v for k, v in HUMANEVAL_ROW.items() if k != "canonical_solution"}
    for style in ("completion", "instruction"):
        (sample,) = _task(tmp_path, unsolved, prompt_style=style).samples()
        assert sample.reference is None
    assert default.reference_completion(object()) is None and default.null_completion(object()) is None
