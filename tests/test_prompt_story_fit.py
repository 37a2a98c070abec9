"""Each prompt's story through a real Trainer: gained, lost, difficulty buckets and the pass@k gap
reach the eval history, the CSV logger and W&B (offline) at every round; each round's per-prompt
outcomes are in ``prompt_outcomes.jsonl``; `plot` draws the buckets; every name the story adds is
one `story_metric_names` predicts from the set's own names."""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any

import pytest
from callback_helpers import QUIET_WARNINGS, CountingModule, make_trainer
from lightning.pytorch.loggers import CSVLogger
from story_helpers import BATCH, PROMPTS, expected_story, share, story_evaluate
from wandb_reader import read_wandb_records, wandb_history

from areal_lightning.callbacks import EvaluationCallback
from areal_lightning.callbacks.prompt_story import PromptStorySettings, story_metric_names
from areal_lightning.eval_round import EvalSet
from areal_lightning.tracking.history import eval_rows, read_history
from areal_lightning.tracking.prompt_outcomes import OUTCOMES_FILENAME, read_prompt_outcomes
from areal_lightning.tracking.wandb_logger import SafeWandbLogger
from areal_lightning.viz.plot import build_figure, load_runs

pytestmark = [pytest.mark.filterwarnings(w) for w in QUIET_WARNINGS]

STEPS = [0, 2, 4, 6]
STORY = ("accuracy/gained", "accuracy/lost", "accuracy/bucket/hard", "accuracy/bucket/medium", "pass@4/gap")


def _callback(**decisions: Any) -> EvaluationCallback:
    eval_set = EvalSet("easy", list(range(PROMPTS)), batch_size=BATCH)
    schedule = {"freq_steps": 2, "eval_before_train": True}
    return EvaluationCallback([eval_set], story_evaluate, schedule=schedule, decisions=decisions)


def _same(a: float | None, b: float) -> bool:
    return (a is None and math.isnan(b)) or a == pytest.approx(b, abs=1e-12)


@pytest.mark.process  # the W&B logger starts W&B's service process
def test_the_story_reaches_the_history_every_logger_and_the_outcomes_file(tmp_path: Path) -> None:
    wandb_logger = SafeWandbLogger(project="story", mode="offline", save_dir=str(tmp_path))
    loggers = [CSVLogger(str(tmp_path), name="csv"), wandb_logger]
    trainer = make_trainer(tmp_path, [_callback()], max_steps=6, logger=loggers)
    trainer.fit(CountingModule(epoch_len=6))
    wandb_logger.experiment.finish()

    expected = expected_story(STEPS)
    assert any(v["accuracy/gained"] and v["accuracy/lost"] for v in expected.values())
    rows = {r["step"]: r["metrics"] for r in eval_rows(read_history(tmp_path))}
    assert sorted(rows) == STEPS
    for step in STEPS:
        for name, value in expected[step].items():
            assert _same(rows[step][name], value), (step, name)
    assert rows[0]["accuracy/gained"] == rows[0]["accuracy/lost"] == 0  # the first round has no previous one

    with open(next(tmp_path.glob("csv/version_*/metrics.csv"))) as f:
        csv_rows = [r for r in csv.DictReader(f) if r.get("eval/easy/accuracy/gained")]
    assert [float(r["eval/easy/accuracy/gained"]) for r in csv_rows] == [expected[s]["accuracy/gained"] for s in STEPS]
    logged = [r for r in wandb_history(read_wandb_records(tmp_path)) if "eval/easy/pass@4/gap" in r]
    assert [r["eval/easy/pass@4/gap"] for r in logged] == pytest.approx([expected[s]["pass@4/gap"] for s in STEPS])
    assert [r["eval/easy/accuracy/lost"] for r in logged] == [expected[s]["accuracy/lost"] for s in STEPS]

    lines = read_prompt_outcomes(tmp_path)
    assert [(r["step"], r["dataset"], r["num_prompts"]) for r in lines] == [(s, "easy", PROMPTS) for s in STEPS]
    for line in lines:
        assert line["outcomes"]["accuracy"] == [share(i, line["step"]) for i in range(PROMPTS)]


def test_every_name_the_story_adds_is_predicted_from_the_base_names(tmp_path: Path) -> None:
    callback = _callback()
    make_trainer(tmp_path, [callback], max_steps=4).fit(CountingModule(epoch_len=6))
    rows = eval_rows(read_history(tmp_path))
    base = {"accuracy", "pass@1", "pass@4"}
    added = {name for r in rows for name in r["metrics"]} - base
    added = {n for n in added if not n.endswith(("/best", "/best_step")) and "/delta" not in n}
    assert added == set(story_metric_names(base, PromptStorySettings()))
    assert added >= set(STORY)


def test_buckets_from_a_stratum_field(tmp_path: Path) -> None:
    samples = [{"q": i, "level": "low" if i < 5 else "high"} for i in range(PROMPTS)]
    callback = EvaluationCallback(
        [EvalSet("easy", samples, batch_size=BATCH)],
        story_evaluate,
        schedule={"freq_steps": 2},
        decisions={"prompt_story": {"buckets": "stratum", "stratum_field": "level"}},
    )
    make_trainer(tmp_path, [callback], max_steps=2).fit(CountingModule(epoch_len=6))
    (row,) = eval_rows(read_history(tmp_path))
    low = [share(i, 2) for i in range(5)]
    high = [share(i, 2) for i in range(5, PROMPTS)]
    assert row["metrics"]["accuracy/bucket/low"] == pytest.approx(sum(low) / len(low), abs=1e-15)
    assert row["metrics"]["accuracy/bucket/high"] == pytest.approx(sum(high) / len(high), abs=1e-15)
    assert "accuracy/bucket/hard" not in row["metrics"]


def test_the_story_off_adds_nothing_and_writes_no_file(tmp_path: Path) -> None:
    callback = _callback(prompt_story=None)
    make_trainer(tmp_path, [callback], max_steps=2).fit(CountingModule(epoch_len=6))
    names = {n for r in eval_rows(read_history(tmp_path)) for n in r["metrics"]}
    assert "accuracy/delta" in names and not any("/bucket/" in n or n.endswith(("/gained", "/gap")) for n in names)
    assert not (tmp_path / OUTCOMES_FILENAME).exists()


def test_a_bounded_file_stops_growing_and_says_so(tmp_path: Path) -> None:
    callback = _callback(prompt_story={"max_file_mib": 600 / 2**20})  # room for two rounds' lines
    make_trainer(tmp_path, [callback], max_steps=6).fit(CountingModule(epoch_len=6))
    assert [r["step"] for r in read_prompt_outcomes(tmp_path)] == [0, 2]
    assert (tmp_path / OUTCOMES_FILENAME).stat().st_size <= 600
    records = read_history(tmp_path)
    (event,) = [r for r in records if r.get("event") == "prompt_outcomes"]
    assert event["step"] == 4 and "reached its bound" in event["message"] and "max_file_mib" in event["message"]
    assert "accuracy/gained" in eval_rows(records)[-1]["metrics"]  # the story goes on


def test_plot_draws_the_buckets_as_a_group(tmp_path: Path) -> None:
    make_trainer(tmp_path, [_callback()], max_steps=4).fit(CountingModule(epoch_len=6))
    fig = build_figure(load_runs([tmp_path]), "accuracy/bucket")
    assert [line.get_label() for line in fig.axes[0].get_lines()] == ["easy: hard", "easy: medium", "easy: easy"]
    gap = build_figure(load_runs([tmp_path]), "pass@4/gap")
    assert [line.get_label() for line in gap.axes[0].get_lines()] == ["easy"]


def test_monitors_and_best_metrics_may_name_the_story_before_any_round(tmp_path: Path) -> None:
    from lightning.pytorch.callbacks import EarlyStopping

    from areal_lightning.callbacks.sanity import MetricNameError

    callback = _callback(best_metrics={"accuracy/bucket/hard": "max"}, prompt_story={"solved_at": 0.75})
    stop = EarlyStopping(monitor="eval/easy/accuracy/gained", mode="max", patience=10)
    make_trainer(tmp_path / "ok", [callback, stop], max_steps=2).fit(CountingModule(epoch_len=6))
    rows = eval_rows(read_history(tmp_path / "ok"))
    assert rows[-1]["metrics"]["accuracy/bucket/hard/best_step"] in (0.0, 2.0)
    assert rows[-1]["metrics"]["accuracy/gained"] == expected_story([0, 2], solved_at=0.75)[2]["accuracy/gained"]
    typo = EarlyStopping(monitor="eval/easy/accuracy/bucket/hardd", mode="max")
    with pytest.raises(
        MetricNameError, match=r"names eval/easy/accuracy/bucket/hardd, .*did you mean eval/easy/accuracy/bucket/hard\?"
    ):
        make_trainer(tmp_path / "typo", [_callback(), typo], max_steps=2).fit(CountingModule(epoch_len=6))
