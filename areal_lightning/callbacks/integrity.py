"""`check_integrity` (the `IntegrityChecks` follow-up runs it): at the start of every fit, before the
first training step, look for training prompts in the eval sets, reference answers the task's own
grader fails, tests that a null program passes and prompts an eval set holds twice (the checks of
`callbacks.integrity_checks`), and record each finding as an ``integrity`` event of the eval history.

``warn`` (the default) records and warns; ``fail`` also stops the fit with `IntegrityError` when a
check finds a problem; ``off`` checks nothing. The module being fit offers what the checks read
(`IntegritySource`: its training prompts, an eval sample's prompt, its reference and null
completions, and the grader); a check it offers nothing for is skipped (a log line, no event).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import lightning as L

from areal_lightning.callbacks.choices import IntegrityAction
from areal_lightning.callbacks.integrity_checks import (
    DUPLICATES_OPTION,
    NGRAM,
    IntegrityError,
    find_duplicates,
    find_overlap,
    grade_nulls,
    grade_references,
)
from areal_lightning.eval_round import EvalSet
from areal_lightning.tracking.recorder import EvalRecorder

log = logging.getLogger(__name__)

OK, FOUND, SKIPPED = "ok", "found", "skipped"
"""A finding's ``status``: nothing found, a problem found (or the check itself failed), not checked
(logged only: events hold ``ok`` and ``found``)."""
OVERLAP, GOLD, VACUOUS, DUPLICATES = "overlap", "gold", "vacuous", "duplicates"
"""An integrity event's ``check``: training prompts in the eval set, reference answers the grader fails,
tests a null program passes, prompts the eval set holds more than once."""
MAX_ROWS_NAMED = 10
"""Failing rows a message names (the event's ``indices`` hold them all)."""


def sample_prompt(sample: Any) -> str:
    """An eval sample's prompt when the module offers no ``integrity_prompt``: the sample itself if it
    is a string, else its ``prompt`` attribute or key, else its text."""
    if isinstance(sample, str):
        return sample
    if isinstance(sample, Mapping) and "prompt" in sample:
        return str(sample["prompt"])
    return str(getattr(sample, "prompt", sample))


def _finding(check: str, name: str | None, status: str, message: str, **fields: Any) -> dict[str, Any]:
    return dict(check=check, dataset=name, status=status, message=message, **fields)


def _overlap(eval_set: EvalSet, train: Sequence[str] | None, module: Any) -> dict[str, Any]:
    where = f"eval set {eval_set.name!r}"
    if train is None:
        why = f"{type(module).__name__} offers no integrity_train_prompts()"
        return _finding(OVERLAP, eval_set.name, SKIPPED, f"{where}: training prompts not checked: {why}")
    prompt = getattr(module, "integrity_prompt", None) or sample_prompt
    o = find_overlap(train, [prompt(x) for x in eval_set.samples])
    fields: dict[str, Any] = dict(prompts=o.prompts, exact=len(o.exact), ngram=len(o.ngram), ngram_n=NGRAM)
    fields.update(indices=sorted(o.exact + o.ngram), examples=o.examples)
    if not o.found:
        text = f"{where}: none of its {o.prompts} prompts is among the {len(train)} training prompts"
        return _finding(OVERLAP, eval_set.name, OK, f"{text} (normalised exact match, {NGRAM}-grams)", **fields)
    first = o.examples[0]
    message = (
        f"{where}: {o.found} of its {o.prompts} prompts appear in the training prompts ({len(o.exact)} exactly after "
        f"normalising, {len(o.ngram)} by a shared {NGRAM}-word sequence), e.g. prompt #{first['index']} "
        f"{first['prompt']!r} ~ training prompt #{first['train_index']} {first['train_prompt']!r}"
    )
    return _finding(OVERLAP, eval_set.name, FOUND, message, **fields)


def _gold(eval_set: EvalSet, module: Any) -> dict[str, Any]:
    where = f"eval set {eval_set.name!r}"
    reference, grade = getattr(module, "integrity_reference", None), getattr(module, "integrity_grade", None)
    if not (callable(reference) and callable(grade)):
        why = f"{type(module).__name__} offers no integrity_reference() and integrity_grade()"
        return _finding(GOLD, eval_set.name, SKIPPED, f"{where}: reference answers not graded: {why}")
    prompt = getattr(module, "integrity_prompt", None) or sample_prompt
    g = grade_references(eval_set.samples, reference, grade, prompt)
    fields: dict[str, Any] = dict(graded=g.graded, failed=len(g.failed), no_reference=g.no_reference)
    fields.update(indices=g.failed, examples=g.examples)
    if not g.graded:
        return _finding(GOLD, eval_set.name, SKIPPED, f"{where}: no sample has a reference answer to grade", **fields)
    if not g.failed:
        message = f"{where}: the grader scores all {g.graded} reference answers correct"
        return _finding(GOLD, eval_set.name, OK, message, **fields)
    first = g.examples[0]
    answer = f" (answer {first['answer']!r})" if "answer" in first else ""
    rows = f"{g.failed[:MAX_ROWS_NAMED]}{' ...' if len(g.failed) > MAX_ROWS_NAMED else ''}"
    message = (
        f"{where}: the task's grader scores {len(g.failed)} of {g.graded} reference answers wrong (rows {rows}), "
        f"e.g. row {first['index']}: {first['reference']!r}{answer}"
    )
    return _finding(GOLD, eval_set.name, FOUND, message, **fields)


def _vacuous(eval_set: EvalSet, module: Any) -> dict[str, Any] | None:
    where = f"eval set {eval_set.name!r}"
    null, grade = getattr(module, "integrity_null", None), getattr(module, "integrity_grade", None)
    if not (callable(null) and callable(grade)):
        why = f"{type(module).__name__} offers no integrity_null() and integrity_grade()"
        return _finding(VACUOUS, eval_set.name, SKIPPED, f"{where}: tests not tried on a null program: {why}")
    g = grade_nulls(eval_set.samples, null, grade)
    fields: dict[str, Any] = dict(graded=g.graded, passed=len(g.passed), indices=g.passed, task_ids=g.task_ids)
    if not g.graded:  # a task without programs (arithmetic, math): the check does not apply, and says nothing
        return None
    if not g.passed:
        message = f"{where}: a null program (returning None) fails the tests of all {g.graded} problems"
        return _finding(VACUOUS, eval_set.name, OK, message, **fields)
    ids = f"{g.task_ids[:MAX_ROWS_NAMED]}{' ...' if len(g.passed) > MAX_ROWS_NAMED else ''}"
    message = (
        f"{where}: a null program (the function returning None) passes the tests of {len(g.passed)} of {g.graded} "
        f"problems ({ids}): their tests test nothing, and every program passes them"
    )
    return _finding(VACUOUS, eval_set.name, FOUND, message, **fields)


def _duplicates(eval_set: EvalSet, module: Any) -> dict[str, Any]:
    where = f"eval set {eval_set.name!r}"
    prompt = getattr(module, "integrity_prompt", None) or sample_prompt
    repeats = find_duplicates([prompt(x) for x in eval_set.samples])
    dropped = [list(pair) for pair in eval_set.options.get(DUPLICATES_OPTION, ())]
    fields: dict[str, Any] = dict(prompts=len(eval_set.samples), repeated=len(repeats), dropped=len(dropped))
    fields.update(indices=sorted(repeats), dropped_rows=dropped)
    if not repeats and not dropped:
        message = f"{where}: its {len(eval_set.samples)} prompts are distinct"
        return _finding(DUPLICATES, eval_set.name, OK, message, **fields)
    parts = []
    if dropped:
        rows = ", ".join(f"row {row} (= row {first})" for row, first in dropped[:MAX_ROWS_NAMED])
        parts.append(
            f"{len(dropped)} rows of its file repeat an earlier prompt and were dropped at load ({rows}"
            f"{' ...' if len(dropped) > MAX_ROWS_NAMED else ''}): it counts its {len(eval_set.samples)} "
            "distinct prompts"
        )
    if repeats:
        pairs = ", ".join(f"#{i} (= #{first})" for i, first in list(repeats.items())[:MAX_ROWS_NAMED])
        parts.append(
            f"{len(repeats)} of its {len(eval_set.samples)} samples repeat an earlier prompt ({pairs}): each counts "
            "once per sample in num_prompts and the intervals; give each prompt once"
        )
    return _finding(DUPLICATES, eval_set.name, FOUND, f"{where}: " + "; ".join(parts), **fields)


def _guarded(
    check: str, eval_set: EvalSet, run: Callable[..., dict[str, Any] | None], *args: Any
) -> dict[str, Any] | None:
    """A check's finding; a check that raises is a finding too (a grader that cannot grade its own gold)."""
    try:
        return run(eval_set, *args)
    except Exception as err:  # noqa: BLE001 - rank 0 must reach the broadcast: the others wait in it
        why = f"{type(err).__name__}: {err}"
        return _finding(check, eval_set.name, FOUND, f"eval set {eval_set.name!r}: the {check} check raised {why}")


def integrity_findings(module: Any, eval_sets: Sequence[EvalSet]) -> list[dict[str, Any]]:
    """Every check of every eval set, as event fields (``check``, ``dataset``, ``status``, ``message``, ...)."""
    findings = []
    train: Sequence[str] | None = None
    read_train = getattr(module, "integrity_train_prompts", None)
    try:
        train = [str(p) for p in read_train()] if callable(read_train) else None
        unreadable = False
    except Exception as err:  # noqa: BLE001 - one finding for every set
        findings.append(
            _finding(OVERLAP, None, FOUND, f"reading the training prompts raised {type(err).__name__}: {err}")
        )
        unreadable = True
    for eval_set in eval_sets:
        runs = [] if unreadable else [_guarded(OVERLAP, eval_set, _overlap, train, module)]
        for check, run in ((GOLD, _gold), (VACUOUS, _vacuous), (DUPLICATES, _duplicates)):
            runs.append(_guarded(check, eval_set, run, module))
        findings += [finding for finding in runs if finding is not None]
    return findings


def check_integrity(
    trainer: L.Trainer, eval_sets: Sequence[EvalSet], recorder: EvalRecorder, action: IntegrityAction
) -> None:
    """Runs the checks on rank 0 and records each finding as an ``integrity`` event, on every rank alike.

    Raises:
        IntegrityError: on every rank, when a check found a problem and `action` is ``fail``.
    """
    if action is IntegrityAction.OFF:
        return
    found = integrity_findings(trainer.lightning_module, eval_sets) if trainer.is_global_zero else None
    # Rank 0 reads the training prompts and grades once; every rank acts on its findings: a fail
    # decided on one rank alone would leave the others waiting in the first step's collectives.
    findings: list[dict[str, Any]] = trainer.strategy.broadcast(found or [], src=0)
    problems = [f for f in findings if f["status"] == FOUND]
    for f in findings:
        if f["status"] == SKIPPED:  # nothing checked: a log line, not a record in every plain module's history
            if trainer.is_global_zero:
                log.info("integrity check skipped: %s", f["message"])
            continue
        level = logging.INFO if f["status"] != FOUND else logging.WARNING
        if f["status"] == FOUND and action is IntegrityAction.FAIL:
            level = logging.ERROR
        fields = {k: v for k, v in f.items() if k != "message"}
        fields.update(action=action.value)
        recorder.event(trainer, "integrity", trainer.global_step, f["message"], level=level, **fields)
    if problems and action is IntegrityAction.FAIL:
        listed = "\n".join(f"- {p['message']}" for p in problems)
        raise IntegrityError(
            f"the integrity checks found {len(problems)} problem(s) before training (integrity: fail):\n"
            f"{listed}\neach is an 'integrity' event in the eval history; fix them, or set integrity: warn "
            "to train anyway"
        )
