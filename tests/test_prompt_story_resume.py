"""A run resumed from an older checkpoint keeps its per-prompt outcomes file whole and continuous.

The first session evaluates steps 0, 2, 4, 6, 8 and dies after step 8; the run goes on from its
checkpoint of step 4 (older than its last rounds), as ``fit --ckpt`` does: a ``resume`` event in the
eval history, then the same Trainer arguments. ``prompt_outcomes.jsonl`` is only appended to (the
first session's bytes are still its start), marks the resumption at step 4, and read back holds
each round of the run once, in order, the resumed session's rounds 6 and 8 in place of the dead
session's; the story after the resume (gained and lost at step 6 against step 4, buckets of step 0)
equals an uninterrupted run's."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from callback_helpers import QUIET_WARNINGS, CountingModule, make_trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from story_helpers import BATCH, PROMPTS, expected_story, share, story_evaluate

from areal_lightning.callbacks import EvaluationCallback
from areal_lightning.eval_round import EvalSet
from areal_lightning.tracking.history import EvalHistory, drop_superseded, eval_rows, read_history
from areal_lightning.tracking.prompt_outcomes import OUTCOMES_FILENAME, read_prompt_outcomes
from areal_lightning.tracking.records import event_record

pytestmark = [pytest.mark.filterwarnings(w) for w in QUIET_WARNINGS]

STEPS = [0, 2, 4, 6, 8]
RESUME_STEP = 4


def _fit(run_dir: Path, ckpt_path: str | None = None) -> EvaluationCallback:
    callback = EvaluationCallback(
        [EvalSet("easy", list(range(PROMPTS)), batch_size=BATCH)],
        story_evaluate,
        schedule={"freq_steps": 2, "eval_before_train": True, "eval_at_end": False},
    )
    checkpoints = ModelCheckpoint(dirpath=run_dir / "ckpt", filename="{step}", every_n_train_steps=2, save_top_k=-1)
    trainer = make_trainer(run_dir, [callback, checkpoints], max_steps=STEPS[-1])
    trainer.fit(CountingModule(epoch_len=5), ckpt_path=ckpt_path)
    return callback


def _story(records: list[dict[str, Any]]) -> dict[int, dict[str, float]]:
    rows = eval_rows(drop_superseded(records))
    assert [r["step"] for r in rows] == STEPS  # each round once, in order
    keys = ("accuracy/gained", "accuracy/lost", "accuracy/bucket/hard", "accuracy/bucket/medium", "pass@4/gap")
    return {r["step"]: {k: r["metrics"][k] for k in keys if k in r["metrics"]} for r in rows}


def test_a_resume_from_an_older_checkpoint_keeps_the_outcomes_file_whole_and_continuous(tmp_path: Path) -> None:
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    _fit(straight)
    first = _fit(resumed)  # dies after step 8: its rounds 6 and 8 are on disk, past the checkpoint we resume
    written = (resumed / OUTCOMES_FILENAME).read_bytes()
    assert [r["step"] for r in read_prompt_outcomes(resumed)] == STEPS

    ckpt = resumed / "ckpt" / f"step={RESUME_STEP}.ckpt"
    history = EvalHistory.in_run_dir(resumed)  # what `areal-lightning fit --ckpt` writes before training
    history.append(event_record("resume", RESUME_STEP, run_id=first.run_id, message=f"resumed from {ckpt}"))
    second = _fit(resumed, str(ckpt))
    assert second.run_id == first.run_id

    raw = (resumed / OUTCOMES_FILENAME).read_bytes()
    assert raw.startswith(written)  # appended, never rewritten
    added = read_history(resumed / OUTCOMES_FILENAME)[len(STEPS) * 1 :]
    assert [(r.get("event"), r["step"]) for r in added] == [("resume", RESUME_STEP), (None, 6), (None, 8)]
    assert all(r["run_id"] == first.run_id for r in added)

    lines = read_prompt_outcomes(resumed)
    assert [r["step"] for r in lines] == STEPS
    assert [r["time"] for r in lines[-2:]] == [r["time"] for r in added[1:]]  # the resumed session's rounds
    for line in lines:
        assert line["outcomes"]["accuracy"] == [share(i, line["step"]) for i in range(PROMPTS)]

    story, reference = _story(read_history(resumed)), _story(read_history(straight))
    assert story.keys() == reference.keys()
    for step, metrics in reference.items():
        assert metrics.keys() == story[step].keys(), step
        for name, value in metrics.items():
            same = (value is None and story[step][name] is None) or value == story[step][name]
            assert same, (step, name, story[step][name], value)
    expected = expected_story(STEPS)
    assert story[6]["accuracy/gained"] == expected[6]["accuracy/gained"]
    assert story[6]["accuracy/lost"] == expected[6]["accuracy/lost"] > 0  # against step 4, restored
    assert not math.isnan(expected[6]["accuracy/bucket/hard"])


def test_an_eval_set_whose_content_changed_starts_its_story_anew(tmp_path: Path) -> None:
    def fit(samples: list[int], ckpt_path: str | None, max_steps: int) -> None:
        callback = EvaluationCallback(
            [EvalSet("easy", samples, batch_size=BATCH)],
            story_evaluate,
            schedule={"freq_steps": 2, "eval_before_train": True, "eval_at_end": False},
        )
        checkpoints = ModelCheckpoint(
            dirpath=tmp_path / "ckpt", filename="{step}", every_n_train_steps=2, save_top_k=-1
        )
        trainer = make_trainer(tmp_path, [callback, checkpoints], max_steps=max_steps)
        trainer.fit(CountingModule(epoch_len=5), ckpt_path=ckpt_path)

    fit(list(range(PROMPTS)), None, 4)
    fit([100 + i for i in range(PROMPTS)], str(tmp_path / "ckpt" / "step=4.ckpt"), 6)  # new content, same size
    records = read_history(tmp_path)
    assert [r["dataset"] for r in records if r.get("event") == "drift"] == ["easy"]
    after = eval_rows(records)[-1]
    assert after["step"] == 6
    # Against step 4 five prompts would be lost, and step 0's buckets would all hold prompts; the
    # changed set's story starts at step 6: nothing gained or lost, every prompt at 1/4 is medium.
    assert expected_story([4, 6])[6]["accuracy/lost"] == 5
    assert (after["metrics"]["accuracy/gained"], after["metrics"]["accuracy/lost"]) == (0.0, 0.0)
    assert after["metrics"]["accuracy/bucket/medium"] == 0.25
    assert after["metrics"]["accuracy/bucket/hard"] is None and after["metrics"]["accuracy/bucket/easy"] is None
