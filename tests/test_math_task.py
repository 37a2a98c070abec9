"""MathTask: GSM8K and MATH rows from local files, prompts, and both verifiers on equivalent
answers written differently and on wrong answers."""

from __future__ import annotations

import importlib.util
import json
import threading

import pytest

from areal_lightning.metrics.functional import NO_ANSWER
from areal_lightning.tasks import math as math_task
from areal_lightning.tasks.math import CHAT_TEMPLATE, MathSample, MathTask, Verifier
from areal_lightning.tasks.math_answers import CORRECT_REWARD, WRONG_REWARD, extract_boxed, math_verify_score

HAS_MATH_VERIFY = importlib.util.find_spec("math_verify") is not None
GSM8K_ROWS = [
    {"question": "Tom has 3 apples and buys 5 more. How many?", "answer": "3 + 5 = <<3+5=8>>8\n#### 8"},
    {"question": "A bike costs $1,000 and a helmet $50. Total?", "answer": "1000 + 50 = 1050\n#### 1,050"},
]
MATH_ROWS = [
    {"problem": "Simplify $\\frac{2}{4}$.", "solution": "It is $\\boxed{\\frac{1}{2}}$.", "level": "Level 1"},
    {"problem": "Find the set.", "solution": "So $\\boxed{\\{1, \\frac{3}{4}\\}}$.", "level": "Level 5"},
]

# (completion, reference): the same answer written differently.
EQUIVALENT = [
    ("So the total is \\boxed{1,000}.", "1000"),
    ("3 + 5 = 8\n#### 8", "8"),
    ("The answer is 0.5", "\\frac{1}{2}"),
    ("so \\boxed{\\frac{1}{2}}", "0.5"),
    ("so \\boxed{\\dfrac{3}{4}}", "0.75"),
    ("She pays $18.", "18"),
    ("\\boxed{50\\%}", "50"),
    ("\\boxed{-\\frac{3}{4}}", "-0.75"),
    ("The answer is \\boxed{0.333333}", "\\frac{1}{3}"),
]
NUMERIC_ONLY_EQUIVALENT = [  # spellings math-verify reads differently (units, unboxed LaTeX)
    ("The answer is 18 dollars.", "$18"),
    ("answer: 12 apples", "12"),
    ("x = \\dfrac{3}{4}", "0.75"),
    ("\\boxed{90^\\circ}", "90"),
]
WRONG = [
    ("So the total is \\boxed{1001}.", "1000"),
    ("#### 0.49", "1/2"),
    ("\\boxed{0.33}", "\\frac{1}{3}"),
    ("First 8, then I got 9", "8"),  # the last number counts
    ("I don't know.", "3"),
    ("\\boxed{\\frac{1}{3}}", "\\frac{1}{2}"),
]


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def gsm8k(tmp_path):
    return _jsonl(tmp_path / "gsm8k_test.jsonl", GSM8K_ROWS)


def test_gsm8k_rows_become_samples_with_plain_prompts(gsm8k):
    samples = MathTask(gsm8k).samples()
    assert samples == [
        MathSample(
            index=0,
            prompt=f"Question: {GSM8K_ROWS[0]['question']}\nAnswer:",
            answer="8",
            stratum="gsm8k_test",
            solution=GSM8K_ROWS[0]["answer"],  # the row's whole solution: the reference completion
        ),
        MathSample(
            index=1,
            prompt=f"Question: {GSM8K_ROWS[1]['question']}\nAnswer:",
            answer="1,050",
            stratum="gsm8k_test",
            solution=GSM8K_ROWS[1]["answer"],
        ),
    ]
    assert samples[0].key == samples[0].prompt + "8"


def test_math_rows_from_parquet_with_boxed_answers_chat_prompts_and_levels(tmp_path):
    pa, pq = pytest.importorskip("pyarrow"), pytest.importorskip("pyarrow.parquet")
    path = tmp_path / "math.parquet"
    pq.write_table(pa.Table.from_pylist(MATH_ROWS), path)
    task = MathTask(
        path,
        question_field="problem",
        answer_field="solution",
        answer_format="boxed",
        stratum_field="level",
        prompt_style="chat",
        verifier="numeric",
    )
    samples = task.samples()
    assert [s.answer for s in samples] == ["\\frac{1}{2}", "\\{1, \\frac{3}{4}\\}"]  # nested braces kept
    assert [s.stratum for s in samples] == ["Level 1", "Level 5"]
    assert samples[0].prompt == CHAT_TEMPLATE.format(question=MATH_ROWS[0]["problem"])
    assert "\\boxed{}" in samples[0].prompt and task.uses_chat_template
    assert task.reward("Halving: $\\boxed{0.5}$", samples[0].answer) == CORRECT_REWARD


def test_plain_answer_field_and_json_list_and_custom_template(tmp_path):
    path = tmp_path / "math500.json"
    path.write_text(json.dumps([{"problem": "2+2?", "answer": " 4 ", "subject": "Algebra"}]))
    task = MathTask(
        path,
        question_field="problem",
        answer_format="plain",
        stratum_field="subject",
        prompt_template="Q: {question}\nA:",
    )
    assert task.samples() == [MathSample(index=0, prompt="Q: 2+2?\nA:", answer="4", stratum="Algebra")]
    assert not task.uses_chat_template


def test_extract_boxed_keeps_nested_braces_and_takes_the_last_closed_box():
    assert extract_boxed("a \\boxed{\\frac{1}{\\sqrt{2}}} b") == "\\frac{1}{\\sqrt{2}}"
    assert extract_boxed("\\boxed{1} then \\fbox{2}") == "2"
    assert extract_boxed("\\boxed{1} then \\boxed{2") == "1"  # a truncated box does not count
    assert extract_boxed("no box") is None


def test_missing_file_field_and_bad_options_are_named(tmp_path, gsm8k):
    with pytest.raises(FileNotFoundError, match=r"`MathTask\(path='.*nope.jsonl'\)`: no such file"):
        MathTask(tmp_path / "nope.jsonl")
    with pytest.raises(
        ValueError, match=r"row 1 of .* has no field 'problem'; fields present: \['answer', 'question'\]"
    ):
        MathTask(gsm8k, question_field="problem")
    with pytest.raises(ValueError, match=r"has no field 'level'; fields present"):
        MathTask(gsm8k, stratum_field="level")
    with pytest.raises(ValueError, match=r"no 'boxed' answer in field 'answer'"):
        MathTask(gsm8k, answer_format="boxed")
    with pytest.raises(
        ValueError, match=r"`MathTask\(answer_format='latex'\)`. Possible choices are: 'gsm8k', 'boxed', "
    ):
        MathTask(gsm8k, answer_format="latex")
    with pytest.raises(ValueError, match=r"`MathTask\(verifier='sympy'\)`. Possible choices are: 'auto'"):
        MathTask(gsm8k, verifier="sympy")
    with pytest.raises(ValueError, match=r"must contain '\{question\}'"):
        MathTask(gsm8k, prompt_template="Q:")
    (tmp_path / "rows.csv").write_text("question,answer\n")
    with pytest.raises(ValueError, match=r"unsupported file type '.csv'; use one of .jsonl, .json, .parquet"):
        MathTask(tmp_path / "rows.csv")
    (tmp_path / "bad.jsonl").write_text(json.dumps(GSM8K_ROWS[0]) + "\n{oops\n")
    with pytest.raises(ValueError, match=r"bad.jsonl, line 2: not JSON"):
        MathTask(tmp_path / "bad.jsonl")


@pytest.mark.parametrize(("completion", "reference"), EQUIVALENT + NUMERIC_ONLY_EQUIVALENT)
def test_numeric_verifier_accepts_equivalent_answers(gsm8k, completion, reference):
    assert MathTask(gsm8k, verifier="numeric").reward(completion, reference) == CORRECT_REWARD


@pytest.mark.parametrize(("completion", "reference"), WRONG)
def test_numeric_verifier_rejects_wrong_answers(gsm8k, completion, reference):
    assert MathTask(gsm8k, verifier="numeric").reward(completion, reference) == WRONG_REWARD


def test_numeric_verifier_compares_non_numbers_as_normalised_text(gsm8k):
    task = MathTask(gsm8k, verifier="numeric")
    assert task.reward("\\boxed{(1, 2)}", "(1,2)") == CORRECT_REWARD
    assert task.reward("\\boxed{\\text{(B)}}", "(B)") == CORRECT_REWARD
    assert task.reward("\\boxed{(2, 1)}", "(1,2)") == WRONG_REWARD
    assert task.reward("\\boxed{\\frac{\\sqrt{3}}{2}}", "\\frac{\\sqrt3}{2}") == WRONG_REWARD  # needs math-verify


@pytest.mark.skipif(not HAS_MATH_VERIFY, reason="math-verify is not installed (extra `math`)")
@pytest.mark.process  # math-verify scores in a worker process (SafeScorer)
@pytest.mark.parametrize(
    ("completion", "reference"),
    [
        *EQUIVALENT,
        ("\\boxed{\\frac{\\sqrt{3}}{2}}", "\\frac{\\sqrt3}{2}"),
        ("$x = \\boxed{2\\pi}$", "2 \\pi"),
    ],
)
def test_math_verify_accepts_equivalent_answers(gsm8k, completion, reference):
    task = MathTask(gsm8k)  # auto picks math-verify when it is installed
    assert task.verifier is Verifier.MATH_VERIFY
    assert task.reward(completion, reference) == CORRECT_REWARD


@pytest.mark.skipif(not HAS_MATH_VERIFY, reason="math-verify is not installed (extra `math`)")
@pytest.mark.process
@pytest.mark.parametrize(("completion", "reference"), [*WRONG, ("\\boxed{\\sqrt{2}}", "\\frac{\\sqrt3}{2}")])
def test_math_verify_rejects_wrong_answers(gsm8k, completion, reference):
    assert MathTask(gsm8k, verifier="math_verify").reward(completion, reference) == WRONG_REWARD


@pytest.mark.skipif(not HAS_MATH_VERIFY, reason="math-verify is not installed (extra `math`)")
def test_math_verify_works_off_the_main_thread():
    # Its timeout uses SIGALRM, which only the main thread may set: elsewhere it must run without one.
    results = []
    worker = threading.Thread(target=lambda: results.append(math_verify_score("\\boxed{\\frac{1}{2}}", "0.5")))
    worker.start()
    worker.join()
    assert results == [CORRECT_REWARD]


def test_auto_verifier_falls_back_to_numeric_without_math_verify(gsm8k, monkeypatch):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        math_task.importlib.util,
        "find_spec",
        lambda name, *a: None if name == "math_verify" else real_find_spec(name, *a),
    )
    task = MathTask(gsm8k)
    assert task.verifier is Verifier.NUMERIC
    assert task.reward("\\boxed{1,050}", "1050") == CORRECT_REWARD
    with pytest.raises(ImportError, match=r"`MathTask\(verifier='math_verify'\)` needs math-verify: pip install"):
        MathTask(gsm8k, verifier="math_verify")


def test_answer_ids_group_equal_answers_for_majority_votes(gsm8k):
    task = MathTask(gsm8k, verifier="numeric")
    ids = [
        task.answer_id(c)
        for c in [
            "\\boxed{1,000}",
            "#### 1000",
            "so 1000",
            "\\boxed{0.5}",
            "\\frac{1}{2} is it",
            "\\boxed{1001}",
            "no answer here",
        ]
    ]
    assert ids[0] == ids[1] == ids[2] and ids[3] == ids[4] and len({ids[0], ids[3], ids[5]}) == 3
    assert ids[6] == NO_ANSWER and all(0 <= i < 2**56 for i in ids[:6])


# GSM8K reference solutions in the dataset's own style (calculator annotations <<a=b>>, dollar
# signs, percentages, then "#### answer"), and what a model appends after its answer when it goes
# on generating: the next few-shot question, a check of its arithmetic.
GSM8K_SOLUTIONS = [
    (
        "The class has 20 + 40 = <<20+40=60>>60 students.\n20 of them passed, so 20/60 = <<20/60=0.3333>>0.3333 "
        "passed.\nAs a percentage that is 0.3333 * 100 = 33.333...%, which rounds down to 33%\n#### 33",
        "33",
    ),
    (
        "The apples cost 4 * $1 = $<<4*1=4>>4.\nThe pears cost 2 * $1 = $<<2*1=2>>2.\n"
        "In total she spends $4 + $2 = $<<4+2=6.00>>6.00\n#### 6",
        "6",
    ),
    (
        "Weng earns 12/60 = $<<12/60=0.2>>0.2 per minute.\nWorking 50 minutes, she earned 0.2 x 50 = "
        "$<<0.2*50=10>>10.\n#### 10",
        "10",
    ),
    (
        "The discount is 25% of $80 = $<<25*.01*80=20>>20.\nSo the price is 80-20 = $<<80-20=60>>60\n#### 60",
        "60",
    ),
]
CONTINUATIONS = [
    "",
    "\n\nQuestion: A shop sells 5 pens for $2 each. How much do 3 pens cost?\nAnswer:",
    "\nCheck: 4 + 3 = 7.",
]
BOXED_SOLUTIONS = [  # MATH-style LaTeX answers, followed by more text
    ("The height is $\\frac{\\sqrt{3}}{2}$, so the answer is $\\boxed{\\frac{\\sqrt{3}}{2}}$.", "\\frac{\\sqrt3}{2}"),
    ("The circumference is $\\boxed{2\\pi}$ when the radius is 1.", "2\\pi"),
    ("Thus $x = \\boxed{\\dfrac{3}{4}}$.", "0.75"),
]


@pytest.mark.skipif(not HAS_MATH_VERIFY, reason="math-verify is not installed (extra `math`)")
@pytest.mark.parametrize("verifier", [pytest.param("math_verify", marks=pytest.mark.process), "numeric"])
def test_both_verifiers_score_gsm8k_reference_solutions_by_their_final_answer(tmp_path, verifier):
    path = _jsonl(
        tmp_path / "gsm8k.jsonl", [{"question": f"q{i}", "answer": s} for i, (s, _) in enumerate(GSM8K_SOLUTIONS)]
    )
    task = MathTask(path, verifier=verifier)
    references = [s.answer for s in task.samples()]
    assert references == [want for _, want in GSM8K_SOLUTIONS]  # the reference read from each solution
    completions = [solution + tail for solution, _ in GSM8K_SOLUTIONS for tail in CONTINUATIONS]
    answers = [ref for ref in references for _ in CONTINUATIONS]
    assert [s.reward for s in task.score_many(completions, answers)] == [CORRECT_REWARD] * len(completions)
    boxed = [solution + tail for solution, _ in BOXED_SOLUTIONS for tail in CONTINUATIONS]
    boxed_refs = [ref for _, ref in BOXED_SOLUTIONS for _ in CONTINUATIONS]
    rewards = [s.reward for s in task.score_many(boxed, boxed_refs)]
    if verifier == "math_verify":  # the numeric verifier does not read \sqrt or \pi
        assert rewards == [CORRECT_REWARD] * len(boxed)
    # A wrong final answer stays wrong when the right number appears after it.
    wrong = task.score_many(["20 + 12 = <<20+12=32>>32\n#### 32\nQuestion: Sam has 33 apples."], ["33"])
    assert wrong[0].reward == WRONG_REWARD
