"""Integrity checks when fit starts: training prompts found in an eval set (normalised exact match,
shared 13-grams), reference answers the task's own grader fails (reported with the failing rows),
each recorded as an ``integrity`` event; ``fail`` stops the fit before its first step, ``off``
checks nothing; a user's own LightningModule offers the checks through the same methods."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
import yaml
from callback_helpers import QUIET_WARNINGS, CountingModule, make_trainer

from areal_lightning.app.builders import build_policy
from areal_lightning.app.cli import main
from areal_lightning.app.config import load_config
from areal_lightning.callbacks import EvaluationCallback
from areal_lightning.callbacks.integrity_checks import IntegrityError, find_overlap, grade_references, normalize
from areal_lightning.eval_round import EvalSet
from areal_lightning.rl.grpo.module import GRPOModule
from areal_lightning.tasks.arithmetic import ArithmeticTask, Sample
from areal_lightning.tasks.math import MathTask
from areal_lightning.tracking.history import eval_rows, event_rows, read_history

pytestmark = [pytest.mark.filterwarnings(w) for w in QUIET_WARNINGS]

LONG_TRAIN = "A farmer has 17 cows and 5 pigs in a red barn near the river and sells all of the pigs on Monday"
# Shares the 13 words "has 17 cows and 5 pigs in a red barn near the river" with LONG_TRAIN.
LONG_EVAL = "Question: Mary has 17 cows and 5 pigs in a red barn near the river. How many legs are there?"
# Shares only 12 words with it: no 13-gram.
SHORT_SHARE = "Question: Mary has 17 cows and 5 pigs in a red barn near the lake. How many legs?"


def test_normalising_drops_case_punctuation_and_spacing_but_keeps_numbers_apart() -> None:
    assert normalize("What is 3+4?") == normalize("what  is 3 + 4") == "what is 3 4"
    assert normalize("1+23=") != normalize("12+3=")
    assert normalize("ＡＢＣ") == "abc"  # NFKC: full-width letters


def test_a_constructed_overlap_is_found_with_counts_and_examples() -> None:
    train = ["What is 3+4?", LONG_TRAIN, "12+3="]
    evals = ["what is 3 + 4", LONG_EVAL, SHORT_SHARE, "1+23=", "Something else entirely"]
    overlap = find_overlap(train, evals)
    assert (overlap.prompts, overlap.exact, overlap.ngram, overlap.found) == (5, [0], [1], 2)
    exact, shared = overlap.examples
    assert exact == {
        "index": 0,
        "prompt": "what is 3 + 4",
        "match": "exact",
        "train_index": 0,
        "train_prompt": train[0],
    }
    assert shared["match"] == "13-gram" and shared["train_index"] == 1
    assert shared["ngram"] == "has 17 cows and 5 pigs in a red barn near the river"


def test_a_deliberately_wrong_grader_is_reported_with_its_failing_rows() -> None:
    samples = [Sample(i, f"{i}+{i}=", f"{2 * i:02d}") for i in range(8)]
    # The bug: the answer's zero padding is stripped on one side only, so every sum below 10 fails.
    wrong = lambda completions, ss: [c.lstrip("0") == s.answer for c, s in zip(completions, ss, strict=True)]  # noqa: E731
    graded = grade_references(samples, ArithmeticTask().reference_completion, wrong, lambda s: s.prompt)
    assert (graded.graded, graded.no_reference, graded.failed) == (8, 0, [0, 1, 2, 3, 4])
    assert graded.examples[1] == {"index": 1, "reference": "02", "prompt": "1+1=", "answer": "02"}


class PaddingBlindTask(ArithmeticTask):
    """The arithmetic task with a grader bug: it strips the completion's zero padding before comparing."""

    def reward(self, completion: str, answer: str) -> float:
        return float(completion.lstrip("0") == answer)

    def score_many(self, completions: list[str], answers: list[str]) -> list[Any]:
        from areal_lightning.scoring import Score

        return [Score(self.reward(c, a)) for c, a in zip(completions, answers, strict=True)]


def _grpo(task: ArithmeticTask) -> GRPOModule:
    cfg = load_config(None, ["eval_sets.easy.size=4", "grpo.warmup_steps=0", "policy.d_model=16", "policy.n_layers=1"])
    return GRPOModule(build_policy(cfg, task), task, cfg.grpo, seed=0)


def _weight(module: Any, batches: Any, ctx: Any) -> dict[str, float]:
    return {"w": float(module.w)}


def _integrity(root: Path, module: Any, eval_sets: list[EvalSet], action: str = "warn") -> list[dict]:
    evaluate_fn = None if isinstance(module, GRPOModule) else _weight
    callback = EvaluationCallback(eval_sets, evaluate_fn, decisions={"integrity": action})
    make_trainer(root, [callback], max_steps=1).fit(module)
    return event_rows(read_history(root), "integrity")


def test_grpo_modules_grader_that_fails_its_own_gold_is_an_event_with_the_rows(tmp_path: Path) -> None:
    task = PaddingBlindTask(train_digits=2, train_size=8, seed=0)
    eval_set = EvalSet("sums", [Sample(i, f"{i}+{i + 1}=", f"{2 * i + 1:02d}") for i in range(7)])
    events = _integrity(tmp_path, _grpo(task), [eval_set])
    overlap, gold, duplicates = events  # the null-program check: skipped (arithmetic has no null program)
    assert (duplicates["check"], duplicates["status"], duplicates["prompts"]) == ("duplicates", "ok", 7)
    assert (overlap["check"], overlap["status"], overlap["exact"], overlap["prompts"]) == ("overlap", "ok", 0, 7)
    assert (gold["check"], gold["dataset"], gold["status"], gold["action"]) == ("gold", "sums", "found", "warn")
    assert (gold["graded"], gold["failed"], gold["indices"]) == (7, 5, [0, 1, 2, 3, 4])  # sums 01 .. 09
    assert gold["message"].startswith("eval set 'sums': the task's grader scores 5 of 7 reference answers wrong (rows")
    assert gold["examples"][0] == {"index": 0, "reference": "01", "prompt": "0+1=", "answer": "01"}
    assert gold["run_id"] == read_history(tmp_path)[-1]["run_id"]


def test_fail_stops_the_fit_before_its_first_step(tmp_path: Path) -> None:
    module = CountingModule()
    module.integrity_train_prompts = lambda: ["3+4=", "5+5="]  # type: ignore[attr-defined]
    with pytest.raises(
        IntegrityError,
        match=r"(?s)found 1 problem\(s\) before training \(integrity: fail\):\n"
        r"- eval set 'probe': 1 of its 3 prompts appear in the training prompts .*integrity: warn",
    ):
        _integrity(tmp_path, module, [EvalSet("probe", ["1+1=", "3 + 4 =", "9+9="])], "fail")
    assert float(module.w) == 0.0  # no optimizer step ran
    records = read_history(tmp_path)
    assert eval_rows(records) == []
    assert [(e["check"], e["status"]) for e in event_rows(records, "integrity")] == [
        ("overlap", "found"),
        ("duplicates", "ok"),
    ]


def test_a_users_own_module_offers_what_it_can_and_the_rest_is_skipped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    module = CountingModule()
    with caplog.at_level(logging.INFO, logger="areal_lightning.callbacks.integrity"):
        plain = _integrity(tmp_path / "plain", module, [EvalSet("probe", [1.0, 2.0])])
    # Only the duplicates check needs nothing of the module (a sample's text is its prompt).
    assert [(e["check"], e["status"], e["prompts"]) for e in plain] == [("duplicates", "ok", 2)]
    assert "integrity check skipped: eval set 'probe': training prompts not checked: CountingModule offers no " in (
        caplog.text
    )
    assert "offers no integrity_reference() and integrity_grade()" in caplog.text
    module = CountingModule()
    module.integrity_train_prompts = lambda: ["1.0"]  # type: ignore[attr-defined]
    module.integrity_reference = lambda s: str(s)  # type: ignore[attr-defined]
    module.integrity_grade = lambda cs, ss: [c == str(s) for c, s in zip(cs, ss, strict=True)]  # type: ignore[attr-defined]
    events = _integrity(tmp_path / "offers", module, [EvalSet("probe", [1.0, 2.0])])
    assert [(e["check"], e["status"]) for e in events] == [("overlap", "found"), ("gold", "ok"), ("duplicates", "ok")]
    assert events[0]["indices"] == [0] and events[1]["graded"] == 2


def test_off_checks_nothing(tmp_path: Path) -> None:
    module = CountingModule()
    module.integrity_train_prompts = lambda: ["1.0"]  # type: ignore[attr-defined]
    assert _integrity(tmp_path, module, [EvalSet("probe", [1.0])], "off") == []


def test_a_grader_that_raises_on_its_gold_is_a_finding_not_a_crash(tmp_path: Path) -> None:
    module = CountingModule()
    module.integrity_reference = lambda s: str(s)  # type: ignore[attr-defined]
    module.integrity_grade = lambda cs, ss: 1 / 0  # type: ignore[attr-defined]
    gold, _ = _integrity(tmp_path, module, [EvalSet("probe", [1.0])])  # the overlap check: skipped
    assert gold["status"] == "found" and "the gold check raised ZeroDivisionError: division by zero" in gold["message"]


@pytest.mark.parametrize("verifier", ["numeric", "math_verify"])
def test_gsm8k_and_math_reference_solutions_pass_the_math_tasks_graders(tmp_path: Path, verifier: str) -> None:
    gsm8k = tmp_path / "gsm8k.jsonl"
    gsm8k.write_text(
        "\n".join(
            json.dumps(r)
            for r in [
                {"question": "Tom has 3 apples and buys 5. How many?", "answer": "3 + 5 = <<3+5=8>>8\n#### 8"},
                {"question": "$1,000 and $50?", "answer": "1000 + 50 = 1050\n#### 1,050"},
            ]
        )
    )
    math = tmp_path / "math.jsonl"
    math.write_text(json.dumps({"problem": "Simplify 2/4.", "solution": "It is $\\boxed{\\frac{1}{2}}$."}))
    for path, options in ((gsm8k, {}), (math, {"question_field": "problem", "answer_field": "solution"})):
        fmt = "boxed" if path == math else "gsm8k"
        task = MathTask(path, answer_format=fmt, verifier=verifier, score_timeout_s=None, **options)
        for sample in task.samples():
            reference = task.reference_completion(sample)
            assert reference is not None and reference.endswith(("#### 8", "#### 1,050", "$."))
            assert task.reward(reference, sample.answer) == 1.0, (verifier, reference)
    plain = MathTask(gsm8k, answer_format="plain", answer_field="question", verifier=verifier, score_timeout_s=None)
    assert plain.reference_completion(plain.samples()[0]) == "\\boxed{Tom has 3 apples and buys 5. How many?}"


def test_fit_with_integrity_fail_exits_2_naming_the_overlap(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = {
        "output_dir": str(tmp_path / "run"),
        "grpo": {"warmup_steps": 0, "prompts_per_step": 4, "group_size": 2},
        "policy": {"d_model": 16, "n_layers": 1},
        "trainer": {"max_steps": 2},
        # Training drawn from every one-digit sum (not held out): most eval prompts are training prompts too.
        "task": {"hold_out_eval": False},
        "eval_sets": {"easy": {"digits": 1, "size": 30}},
        "evaluator": {"integrity": "fail", "eval_before_train": True},
        "logger": {"csv": False},
    }
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(config))
    assert main(["fit", "-c", str(path)]) == 2
    err = capsys.readouterr().err
    assert "areal-lightning: error: the integrity checks found 1 problem(s) before training (integrity: fail)" in err
    assert "- eval set 'easy': " in err and "prompts appear in the training prompts" in err
    records = read_history(tmp_path / "run")
    assert eval_rows(records) == []  # not even the round before training
    assert [(e["check"], e["status"]) for e in event_rows(records, "integrity")] == [
        ("overlap", "found"),
        ("gold", "ok"),
        ("duplicates", "ok"),
    ]


VACUOUS_ROWS = [
    {
        "task_id": "real/0",
        "prompt": "def inc(x):\n    'x plus one.'\n",
        "test": "def check(f):\n    assert f(1) == 2\n",
        "entry_point": "inc",
        "canonical_solution": "    return x + 1\n",
    },
    # The bug: its check asserts nothing about the candidate; a function returning None passes.
    {
        "task_id": "hollow/1",
        "prompt": "def dec(x):\n    'x minus one.'\n",
        "test": "def check(f):\n    assert f\n",
        "entry_point": "dec",
        "canonical_solution": "    return x - 1\n",
    },
    {
        "task_id": "mbpp/2",
        "text": "Triple a number.",
        "test_list": ["assert triple(2) == 6"],
        "code": "def triple(x):\n    return 3 * x\n",
    },
]


@pytest.mark.process
@pytest.mark.parametrize("style", ["completion", "instruction"])
def test_a_vacuous_test_is_found_by_grading_a_null_program_in_the_sandbox(tmp_path: Path, style: str) -> None:
    from areal_lightning.tasks.code import CodeTask

    path = tmp_path / "vacuous.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in VACUOUS_ROWS) + "\n")
    task = CodeTask(path, prompt_style=style)
    module = CountingModule()
    module.integrity_null = task.null_completion  # type: ignore[attr-defined]
    module.integrity_reference = task.reference_completion  # type: ignore[attr-defined]
    module.integrity_grade = lambda cs, ss: [  # type: ignore[attr-defined]  # GRPOModule's, over the task's sandbox
        s.reward == 1.0 for s in task.score_many(list(cs), [x.answer for x in ss])
    ]
    try:
        events = _integrity(tmp_path / "run", module, [EvalSet("code", task.samples())])
    finally:
        task.sandbox.close()
    by_check = {e["check"]: e for e in events}
    assert by_check["gold"]["status"] == "ok" and by_check["gold"]["graded"] == 3  # every reference passes
    vacuous = by_check["vacuous"]
    assert (vacuous["status"], vacuous["action"], vacuous["graded"], vacuous["passed"]) == ("found", "warn", 3, 1)
    assert (vacuous["task_ids"], vacuous["indices"]) == (["hollow/1"], [1])
    assert vacuous["message"] == (
        "eval set 'code': a null program (the function returning None) passes the tests of 1 of 3 problems "
        "(['hollow/1']): their tests test nothing, and every program passes them"
    )


def test_grpo_modules_null_program_is_the_tasks_and_arithmetic_has_none(tmp_path: Path) -> None:
    task = ArithmeticTask(train_digits=2, train_size=8, seed=0)
    events = _integrity(tmp_path, _grpo(task), [EvalSet("sums", list(task.make_samples("sums", 1, 5)))])
    assert [(e["check"], e["status"]) for e in events] == [("overlap", "ok"), ("gold", "ok"), ("duplicates", "ok")]


def test_duplicate_prompts_are_reported_and_a_file_sets_are_dropped_at_load(tmp_path: Path) -> None:
    from areal_lightning.app.eval_prompts import distinct_prompts
    from areal_lightning.callbacks.integrity_checks import DUPLICATES_OPTION

    rows = [Sample(i, p, "02") for i, p in enumerate(["1+1=", "0+2=", "1+1=", "2+0=", "0+2="])]
    kept, dropped = distinct_prompts(rows, None)
    assert [s.prompt for s in kept] == ["1+1=", "0+2=", "2+0="] and dropped == [(3, 1), (5, 2)]
    module = CountingModule()
    loaded = EvalSet("file", kept, options={DUPLICATES_OPTION: dropped})  # as build_eval_sets makes it
    own = EvalSet("own", rows)  # a user's own set, duplicates kept
    events = {e["dataset"]: e for e in _integrity(tmp_path, module, [loaded, own]) if e["check"] == "duplicates"}
    assert (events["file"]["status"], events["file"]["dropped_rows"], events["file"]["prompts"]) == (
        "found",
        [[3, 1], [5, 2]],
        3,
    )
    assert events["file"]["message"] == (
        "eval set 'file': 2 rows of its file repeat an earlier prompt and were dropped at load (row 3 (= row 1), "
        "row 5 (= row 2)): it counts its 3 distinct prompts"
    )
    assert (events["own"]["status"], events["own"]["indices"], events["own"]["repeated"]) == ("found", [2, 4], 2)
    assert "2 of its 5 samples repeat an earlier prompt (#2 (= #0), #4 (= #1))" in events["own"]["message"]
