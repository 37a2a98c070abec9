"""What the integrity checks report, as a user reads it in the log and the ``integrity`` events: each
check's status and message in full, with no Trainer (`integrity_findings` on a plain module); then
`check_integrity` on a Trainer that fits nothing: the events, each log line's level, the error of
``fail``. `test_integrity.py` runs the same checks at the start of a fit."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
import pytest
from callback_helpers import make_trainer

from areal_lightning.callbacks.choices import IntegrityAction
from areal_lightning.callbacks.integrity import check_integrity, integrity_findings, sample_prompt
from areal_lightning.callbacks.integrity_checks import (
    DUPLICATES_OPTION,
    IntegrityError,
    find_overlap,
    grade_nulls,
    grade_references,
)
from areal_lightning.eval_round import EvalSet
from areal_lightning.tracking.history import event_rows, read_history
from areal_lightning.tracking.recorder import EvalRecorder


@dataclass(frozen=True)
class Problem:
    prompt: str
    answer: str
    task_id: str


class Offers:
    """A user's module offering every check: `train` its training prompts; its grader takes a
    completion as right when it equals the sample's answer (`refs` are the reference completions,
    `null` the null completion of every sample)."""

    def __init__(self, train: Sequence[str], refs: dict[str, str | None], null: str | None = None) -> None:
        self.train, self.refs, self.null = list(train), refs, null

    def integrity_train_prompts(self) -> list[str]:
        return self.train

    def integrity_prompt(self, sample: Problem) -> str:
        return sample.prompt

    def integrity_reference(self, sample: Problem) -> str | None:
        return self.refs.get(sample.task_id)

    def integrity_null(self, sample: Problem) -> str | None:
        return self.null

    def integrity_grade(self, completions: Sequence[str], samples: Sequence[Problem]) -> list[bool]:
        return [c == s.answer for c, s in zip(completions, samples, strict=True)]


def _by_check(findings: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {f["check"]: f for f in findings}


def test_a_clean_set_is_ok_with_every_message_in_full() -> None:
    problems = [Problem(f"What is {i}+1?", str(i + 1), f"t/{i}") for i in range(3)]
    module = Offers(["What is 9+9?"], {p.task_id: p.answer for p in problems}, null="None")
    found = _by_check(integrity_findings(module, [EvalSet("sums", problems)]))
    assert list(found) == ["overlap", "gold", "vacuous", "duplicates"]
    assert {f["status"] for f in found.values()} == {"ok"} and {f["dataset"] for f in found.values()} == {"sums"}
    assert found["overlap"]["message"] == (
        "eval set 'sums': none of its 3 prompts is among the 1 training prompts (normalised exact match, 13-grams)"
    )
    assert (found["overlap"]["prompts"], found["overlap"]["ngram_n"], found["overlap"]["indices"]) == (3, 13, [])
    assert found["gold"]["message"] == "eval set 'sums': the grader scores all 3 reference answers correct"
    assert (found["gold"]["graded"], found["gold"]["failed"], found["gold"]["no_reference"]) == (3, 0, 0)
    assert found["vacuous"]["message"] == (
        "eval set 'sums': a null program (returning None) fails the tests of all 3 problems"
    )
    assert (found["vacuous"]["graded"], found["vacuous"]["passed"]) == (3, 0)
    assert found["duplicates"]["message"] == "eval set 'sums': its 3 prompts are distinct"
    assert (found["duplicates"]["repeated"], found["duplicates"]["dropped"]) == (0, 0)


def test_each_problem_is_found_and_its_message_names_rows_and_examples() -> None:
    # 12 problems: the first and the last are a training prompt; the references of rows 0..10 are
    # wrong and their null programs pass (their answer is the empty null program); row 11 repeats
    # row 0's prompt and has no reference.
    problems = [Problem(f"What is {i}+1?", "", f"t/{i}") for i in range(11)]
    problems.append(Problem("What is 0+1?", "1", "t/11"))
    module = Offers(["what is 0 + 1"], {p.task_id: "wrong" for p in problems[:11]}, null="")
    found = _by_check(integrity_findings(module, [EvalSet("sums", problems)]))
    assert {f["status"] for f in found.values()} == {"found"}
    assert {f["dataset"] for f in found.values()} == {"sums"}
    assert found["overlap"]["message"] == (
        "eval set 'sums': 2 of its 12 prompts appear in the training prompts (2 exactly after normalising, "
        "0 by a shared 13-word sequence), e.g. prompt #0 'What is 0+1?' ~ training prompt #0 'what is 0 + 1'"
    )
    assert (found["overlap"]["exact"], found["overlap"]["ngram"], found["overlap"]["indices"]) == (2, 0, [0, 11])
    assert found["gold"]["message"] == (
        "eval set 'sums': the task's grader scores 11 of 11 reference answers wrong "
        "(rows [0, 1, 2, 3, 4, 5, 6, 7, 8, 9] ...), e.g. row 0: 'wrong' (answer '')"
    )
    assert (found["gold"]["graded"], found["gold"]["no_reference"], found["gold"]["indices"]) == (
        11,
        1,
        list(range(11)),
    )
    assert found["vacuous"]["message"] == (
        "eval set 'sums': a null program (the function returning None) passes the tests of 11 of 12 problems "
        "(['t/0', 't/1', 't/2', 't/3', 't/4', 't/5', 't/6', 't/7', 't/8', 't/9'] ...): their tests test "
        "nothing, and every program passes them"
    )
    assert found["vacuous"]["task_ids"] == [f"t/{i}" for i in range(11)]
    assert [e["index"] for e in found["gold"]["examples"]] == [0, 1, 2, 3, 4]  # five examples of 11 rows
    assert found["duplicates"]["message"] == (
        "eval set 'sums': 1 of its 12 samples repeat an earlier prompt (#11 (= #0)): each counts once per sample "
        "in num_prompts and the intervals; give each prompt once"
    )


def test_ten_rows_are_named_in_full_and_the_eleventh_is_an_ellipsis() -> None:
    problems = [Problem(f"p{i}", "", f"t/{i}") for i in range(10)]
    module = Offers([], {p.task_id: "wrong" for p in problems}, null="")
    found = _by_check(integrity_findings(module, [EvalSet("ten", problems)]))
    assert "(rows [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]), e.g. row 0: 'wrong' (answer '')" in found["gold"]["message"]
    assert "'t/8', 't/9']): their tests" in found["vacuous"]["message"]


def test_dropped_rows_and_repeats_are_one_message_and_ten_dropped_rows_are_named_in_full() -> None:
    dropped = [(i + 2, 1) for i in range(11)]
    eval_set = EvalSet("file", ["a", "b", "a"], options={DUPLICATES_OPTION: dropped})
    duplicates = _by_check(integrity_findings(object(), [eval_set]))["duplicates"]
    rows = ", ".join(f"row {i + 2} (= row 1)" for i in range(10))
    assert duplicates["message"] == (
        f"eval set 'file': 11 rows of its file repeat an earlier prompt and were dropped at load ({rows} ...): "
        "it counts its 3 distinct prompts; 1 of its 3 samples repeat an earlier prompt (#2 (= #0)): each counts "
        "once per sample in num_prompts and the intervals; give each prompt once"
    )
    assert duplicates["dropped_rows"] == [list(pair) for pair in dropped]
    ten = _by_check(integrity_findings(object(), [EvalSet("file", ["a"], options={DUPLICATES_OPTION: dropped[:10]})]))
    ten = ten["duplicates"]
    assert ten["message"].endswith("row 11 (= row 1)): it counts its 1 distinct prompts")


def test_what_a_module_does_not_offer_is_skipped_with_why() -> None:
    class Plain:
        pass

    found = _by_check(integrity_findings(Plain(), [EvalSet("probe", ["1+1="])]))
    assert (found["overlap"]["status"], found["overlap"]["message"]) == (
        "skipped",
        "eval set 'probe': training prompts not checked: Plain offers no integrity_train_prompts()",
    )
    assert (found["gold"]["status"], found["gold"]["message"]) == (
        "skipped",
        "eval set 'probe': reference answers not graded: Plain offers no integrity_reference() and integrity_grade()",
    )
    assert (found["vacuous"]["status"], found["vacuous"]["message"]) == (
        "skipped",
        "eval set 'probe': tests not tried on a null program: Plain offers no integrity_null() and integrity_grade()",
    )
    assert found["duplicates"]["status"] == "ok"


def test_a_set_without_references_or_null_programs_says_so_or_nothing() -> None:
    module = Offers([], {}, null=None)
    found = _by_check(integrity_findings(module, [EvalSet("probe", [Problem("q", "a", "t/0")])]))
    assert (found["gold"]["status"], found["gold"]["message"]) == (
        "skipped",
        "eval set 'probe': no sample has a reference answer to grade",
    )
    assert (found["gold"]["dataset"], found["gold"]["graded"], found["gold"]["no_reference"]) == ("probe", 0, 1)
    assert "vacuous" not in found  # a task without programs: the check does not apply


def test_a_check_that_raises_and_unreadable_training_prompts_are_findings() -> None:
    class Broken(Offers):
        def integrity_train_prompts(self) -> list[str]:
            raise OSError("no such file")

        def integrity_grade(self, completions: Sequence[str], samples: Sequence[Problem]) -> list[bool]:
            return []  # fewer verdicts than completions

    module = Broken([], {"t/0": "a"}, null="x")
    findings = integrity_findings(module, [EvalSet("one", [Problem("q", "a", "t/0")]), EvalSet("two", ["q"])])
    first = findings[0]
    assert (first["check"], first["dataset"], first["status"]) == ("overlap", None, "found")
    assert first["message"] == "reading the training prompts raised OSError: no such file"
    assert [f["check"] for f in findings].count("overlap") == 1  # once, not once per set
    vacuous = next(f for f in findings if f["check"] == "vacuous")
    assert vacuous["message"] == (
        "eval set 'one': the vacuous check raised ValueError: the grader returned 0 verdicts for 1 null programs"
    )
    gold = next(f for f in findings if f["check"] == "gold")
    assert (gold["dataset"], gold["status"], gold["message"]) == (
        "one",
        "found",
        "eval set 'one': the gold check raised ValueError: the grader returned 0 verdicts for 1 reference completions",
    )


def test_a_samples_prompt_is_the_string_its_prompt_key_or_attribute_or_its_text() -> None:
    assert sample_prompt("1+1=") == "1+1="
    assert sample_prompt({"prompt": 7, "answer": "x"}) == "7"
    assert sample_prompt({"question": "q"}) == "{'question': 'q'}"
    assert sample_prompt(Problem("p", "a", "t")) == "p"
    assert sample_prompt(2.5) == "2.5"


def test_the_overlap_check_takes_its_n_for_both_sides() -> None:
    overlap = find_overlap(["the cat sat on the mat"], ["a cat sat on a chair", "the cat ran"], n=3)
    assert (overlap.exact, overlap.ngram) == ([], [0])
    assert (overlap.examples[0]["match"], overlap.examples[0]["ngram"]) == ("3-gram", "cat sat on")
    assert find_overlap(["the cat sat on the mat"], ["a cat sat on a chair"]).found == 0  # 13 words by default


def test_long_prompts_are_clipped_in_examples_and_five_examples_are_shown() -> None:
    long = "word " * 80  # 400 characters
    overlap = find_overlap([long, *[f"p{i}" for i in range(7)]], [long, *[f"p{i}" for i in range(7)]])
    assert overlap.found == 8 and len(overlap.examples) == 5  # every match counted, five shown
    assert overlap.examples[0]["prompt"] == long[:300] + "..." == overlap.examples[0]["train_prompt"]
    exactly = "x" * 300
    assert find_overlap([exactly], [exactly]).examples[0]["prompt"] == exactly  # 300 characters: whole


def test_the_grader_is_not_asked_when_no_sample_has_a_completion_to_grade() -> None:
    def grader(completions: Sequence[str], samples: Sequence[Any]) -> list[bool]:
        raise AssertionError("called with nothing to grade")

    assert grade_nulls(["a", "b"], lambda s: None, grader).graded == 0
    assert grade_references(["a", "b"], lambda s: None, grader).no_reference == 2


class ByQuestion(Offers):
    """Samples are dicts whose prompt is under ``question`` (no ``prompt`` key): only the module's
    own `integrity_prompt` reads it; the default would take the dict's text."""

    def integrity_prompt(self, sample: Any) -> str:
        return sample["question"]

    def integrity_reference(self, sample: Any) -> str | None:
        return self.refs.get(sample["id"])

    def integrity_grade(self, completions: Sequence[str], samples: Sequence[Any]) -> list[bool]:
        return [c == s["answer"] for c, s in zip(completions, samples, strict=True)]


def test_every_check_reads_the_modules_own_prompt_and_a_found_problem_names_its_set() -> None:
    samples = [
        {"question": "What is 1+1?", "answer": "2", "id": "a"},
        {"question": "What is 1+1?", "answer": "3", "id": "b"},
    ]
    module = ByQuestion(["what is 1 + 1"], {"a": "2", "b": "4"}, null="")
    found = _by_check(integrity_findings(module, [EvalSet("dicts", samples)]))
    assert {f["dataset"] for f in found.values()} == {"dicts"}
    assert (found["overlap"]["status"], found["overlap"]["indices"]) == ("found", [0, 1])
    assert found["overlap"]["examples"][0] == {
        "index": 0,
        "prompt": "What is 1+1?",
        "match": "exact",
        "train_index": 0,
        "train_prompt": "what is 1 + 1",
    }
    assert found["gold"]["examples"] == [{"index": 1, "reference": "4", "prompt": "What is 1+1?"}]
    # a sample without an ``answer`` attribute: the message names the reference only
    assert found["gold"]["message"] == (
        "eval set 'dicts': the task's grader scores 1 of 2 reference answers wrong (rows [1]), e.g. row 1: '4'"
    )
    assert (found["duplicates"]["status"], found["duplicates"]["indices"]) == ("found", [1])


def test_a_module_with_a_reference_but_no_grader_is_skipped_and_the_skips_name_their_set() -> None:
    class OnlyReference:
        def integrity_reference(self, sample: Any) -> str:
            return "2"

        def integrity_null(self, sample: Any) -> str:
            return ""

    found = _by_check(integrity_findings(OnlyReference(), [EvalSet("probe", ["1+1="])]))
    assert (found["gold"]["status"], found["gold"]["message"]) == (
        "skipped",
        "eval set 'probe': reference answers not graded: OnlyReference offers no integrity_reference() and "
        "integrity_grade()",
    )
    assert found["vacuous"]["status"] == "skipped"
    assert {f["dataset"] for f in found.values()} == {"probe"}


def test_a_prompt_reader_that_raises_is_a_finding_of_each_check_that_reads_prompts() -> None:
    class BadPrompt(Offers):
        def integrity_prompt(self, sample: Problem) -> str:
            raise KeyError("question")

    module = BadPrompt(["q"], {"t/0": "wrong"}, null="x")  # a failing row: the gold check names its prompt
    found = _by_check(integrity_findings(module, [EvalSet("one", [Problem("q", "a", "t/0")])]))
    for check in ("overlap", "gold", "duplicates"):
        assert (found[check]["status"], found[check]["message"]) == (
            "found",
            f"eval set 'one': the {check} check raised KeyError: 'question'",
        )
    assert found["vacuous"]["status"] == "ok"  # it reads no prompt


class LitOffers(L.LightningModule):
    """A user's LightningModule offering the checks of `Offers` (a Trainer holds it; nothing fits)."""

    def __init__(self, offers: Offers) -> None:
        super().__init__()
        self.offers = offers
        self.integrity_train_prompts, self.integrity_prompt = offers.integrity_train_prompts, offers.integrity_prompt
        self.integrity_reference, self.integrity_grade = offers.integrity_reference, offers.integrity_grade


WRONG = (
    "eval set 'sums': the task's grader scores 1 of 2 reference answers wrong (rows [1]), e.g. row 1: '5' (answer '4')"
)
"""The found problem of `_check`'s set, as its event and the log say it."""


def _check(
    tmp_path: Path, action: IntegrityAction, caplog: pytest.LogCaptureFixture, train: Sequence[str] = ()
) -> list[dict[str, Any]]:
    """`check_integrity` as a fit starts it, on a Trainer holding the module: one set whose prompts
    are distinct (ok), one of whose two references is wrong (found), no null program (skipped); its
    overlap with `train` (none: ok)."""
    problems = [Problem("What is 1+1?", "2", "t/0"), Problem("What is 2+2?", "4", "t/1")]
    trainer = make_trainer(tmp_path, [], max_steps=1)
    trainer.strategy.connect(LitOffers(Offers(train, {"t/0": "2", "t/1": "5"})))
    recorder = EvalRecorder(None, "sync")
    recorder.open(trainer, tmp_path, once_per_step=())
    caplog.set_level(logging.INFO, logger="areal_lightning")
    check_integrity(trainer, [EvalSet("sums", problems)], recorder, action)
    return event_rows(read_history(tmp_path), "integrity")


def _levels(caplog: pytest.LogCaptureFixture) -> dict[str, str]:
    """Each line of the checks and of their events in the log, with its level."""
    names = ("areal_lightning.callbacks.integrity", "areal_lightning.tracking.recorder")
    return {r.getMessage(): r.levelname for r in caplog.records if r.name in names}


def test_warn_records_each_finding_at_its_level_and_logs_a_skip(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    events = _check(tmp_path, IntegrityAction.WARN, caplog)
    assert [(e["check"], e["status"], e["action"]) for e in events] == [
        ("overlap", "ok", "warn"),
        ("gold", "found", "warn"),
        ("duplicates", "ok", "warn"),
    ]
    assert _levels(caplog) == {
        "eval set 'sums': none of its 2 prompts is among the 0 training prompts "
        "(normalised exact match, 13-grams)": "INFO",
        WRONG: "WARNING",
        "integrity check skipped: eval set 'sums': tests not tried on a null program: LitOffers offers no "
        "integrity_null() and integrity_grade()": "INFO",
        "eval set 'sums': its 2 prompts are distinct": "INFO",
    }


def test_fail_logs_the_problem_as_an_error_and_raises_naming_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with pytest.raises(IntegrityError) as raised:
        _check(tmp_path, IntegrityAction.FAIL, caplog, train=["what is 1 + 1"])
    overlap = (
        "eval set 'sums': 1 of its 2 prompts appear in the training prompts (1 exactly after normalising, 0 by a "
        "shared 13-word sequence), e.g. prompt #0 'What is 1+1?' ~ training prompt #0 'what is 1 + 1'"
    )
    assert str(raised.value) == (
        f"the integrity checks found 2 problem(s) before training (integrity: fail):\n- {overlap}\n- {WRONG}\n"
        "each is an 'integrity' event in the eval history; fix them, or set integrity: warn to train anyway"
    )
    levels = _levels(caplog)
    assert levels[WRONG] == levels[overlap] == "ERROR"
    assert levels["eval set 'sums': its 2 prompts are distinct"] == "INFO"
    assert [e["action"] for e in event_rows(read_history(tmp_path), "integrity")] == ["fail"] * 3
