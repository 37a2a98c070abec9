"""The eval history file: append-only, durable, NaN-safe, and readable after a crash."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from areal_lightning.tracking.history import (
    HISTORY_FILENAME,
    DuplicateRoundWarning,
    EvalHistory,
    TruncatedHistoryWarning,
    drop_superseded,
    eval_rows,
    event_rows,
    read_history,
    split_runs,
)
from areal_lightning.tracking.records import eval_record, event_record

# The example line of docs/eval_history.md (the public format), kept equal to the doc below.
DOC_EXAMPLE = (
    '{"step": 120, "epoch": 1, "time": 1764460800.5, "trigger": ["steps"], "dataset": "easy",'
    ' "metrics": {"accuracy": 0.81, "reward/mean": 0.81, "pass@4": 0.93},'
    ' "num_samples": 200, "num_prompts": 50, "eval_secs": 1.9, "mode": "sync", "world_size": 2,'
    ' "run_id": "k3j9x2a1", "source": "training"}'
)
DOC = Path(__file__).resolve().parents[1] / "docs" / "eval_history.md"


def _record(step: int = 120, dataset: str = "easy", run_id: str | None = "k3j9x2a1", **metrics: float) -> dict:
    return eval_record(
        step,
        1,
        dataset,
        metrics or {"accuracy": 0.81},
        trigger=["steps"],
        num_samples=200,
        num_prompts=50,
        eval_secs=1.9,
        mode="sync",
        world_size=2,
        run_id=run_id,
        time=1764460800.5,
    )


def test_eval_record_matches_the_documented_example_field_by_field_and_in_order() -> None:
    record = _record(**{"accuracy": 0.81, "reward/mean": 0.81, "pass@4": 0.93})
    assert json.dumps(record) == DOC_EXAMPLE
    assert list(record) == list(json.loads(DOC_EXAMPLE))
    doc = DOC.read_text()
    assert " ".join(DOC_EXAMPLE.split()) in " ".join(doc.split())  # the doc shows this very record
    for field in record:
        assert f"`{field}`" in doc, field  # and documents every field


def test_append_keeps_earlier_lines_byte_identical(tmp_path: Path) -> None:
    history = EvalHistory.in_run_dir(tmp_path / "run" / "nested")  # parent dirs get created
    history.append(_record(0))
    first = history.path.read_bytes()
    history.append(_record(10))
    history.append_many([_record(20, "easy"), _record(20, "hard")])
    content = history.path.read_bytes()
    assert content.startswith(first)
    assert content.count(b"\n") == 4 and content.endswith(b"\n")
    assert [(r["step"], r["dataset"]) for r in read_history(history.path.parent)] == [
        (0, "easy"),
        (10, "easy"),
        (20, "easy"),
        (20, "hard"),
    ]


@pytest.mark.process
def test_append_is_fsynced_and_visible_to_another_process_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[int] = []
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        synced.append(fd)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    history = EvalHistory(tmp_path / HISTORY_FILENAME)
    history.append(_record(5))
    assert len(synced) == 1
    # A plot run by the user while training goes on is another process.
    out = subprocess.run(
        [sys.executable, "-c", f"print(open({str(history.path)!r}).read())"], capture_output=True, text=True, check=True
    ).stdout
    assert json.loads(out.strip())["step"] == 5


def test_nan_tensors_and_numpy_scalars_are_written_as_plain_json(tmp_path: Path) -> None:
    history = EvalHistory(tmp_path / HISTORY_FILENAME)
    metrics = {
        "accuracy": torch.tensor(0.25),
        "pass@4": np.float32(0.5),
        "reward/mean": float("nan"),
        "inf": np.float64(np.inf),
        "zero_std": torch.tensor([0.125]),
    }
    history.append(_record(**metrics))
    history.append(
        event_record(
            "alert",
            3,
            message="m",
            time=0.0,
            value=torch.tensor(float("nan")),
            count=np.int64(7),
            flags=np.array([True, False]),
        )
    )
    line_one, _ = history.path.read_text().splitlines()
    assert "NaN" not in line_one and '"reward/mean": null' in line_one and '"inf": null' in line_one
    round_, alert = read_history(history.path)
    assert round_["metrics"] == {"accuracy": 0.25, "pass@4": 0.5, "reward/mean": None, "inf": None, "zero_std": 0.125}
    assert (alert["value"], alert["count"], alert["flags"]) == (None, 7, [True, False])


def test_truncated_last_line_is_skipped_with_one_warning(tmp_path: Path) -> None:
    history = EvalHistory(tmp_path / HISTORY_FILENAME)
    history.append_many([_record(0), _record(10)])
    with open(history.path, "a") as f:
        f.write(json.dumps(_record(20))[:40])  # the writer died mid-line
    with pytest.warns(TruncatedHistoryWarning, match=r"unfinished last line 3") as caught:
        records = read_history(tmp_path)
    assert len(caught) == 1
    assert [r["step"] for r in records] == [0, 10]


def test_malformed_middle_line_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / HISTORY_FILENAME
    path.write_text(json.dumps(_record(0)) + "\n{oops\n" + json.dumps(_record(10)) + "\n")
    with pytest.raises(ValueError, match=rf"{HISTORY_FILENAME}: line 2 is not valid JSON"):
        read_history(path)
    path.write_text("[1, 2]\n" + json.dumps(_record(0)) + "\n")
    with pytest.raises(ValueError, match="line 1 is a JSON list, expected an object"):
        read_history(path)


def test_missing_history_says_what_is_accepted(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"no eval history at .*pass an eval_history\.jsonl"):
        read_history(tmp_path)
    with pytest.raises(FileNotFoundError, match="no eval history at"):
        read_history(tmp_path / "missing.jsonl")


def test_writer_after_a_crash_starts_a_fresh_line(tmp_path: Path) -> None:
    path = tmp_path / HISTORY_FILENAME
    path.write_text(json.dumps(_record(0)) + "\n" + json.dumps(_record(10))[:30])
    history = EvalHistory(path)
    with pytest.warns(TruncatedHistoryWarning, match="ends with an unfinished line"):
        history.append(_record(20))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once per writer, not on every append
        history.append(_record(30))
    lines = path.read_text().splitlines()
    assert [json.loads(lines[i])["step"] for i in (0, 2, 3)] == [0, 20, 30]
    with pytest.warns(TruncatedHistoryWarning, match=r"skipped the unfinished line 2") as caught:
        assert [r["step"] for r in read_history(path)] == [0, 20, 30]  # the torn line, now in the middle
    assert len(caught) == 1


def test_resumed_writer_appends_no_second_round_for_a_recorded_step(tmp_path: Path) -> None:
    path = tmp_path / HISTORY_FILENAME
    EvalHistory(path, once_per_step=["steps"]).append_many([_record(0), _record(10)])
    resumed = EvalHistory(path, once_per_step=["steps"])  # a new process after a crash
    with pytest.warns(DuplicateRoundWarning, match=r"already holds a round of eval set 'easy' at step 10"):
        resumed.append_many([_record(10), _record(20)])
    resumed.append(event_record("error", 10, message="events are never deduplicated"))
    again = eval_record(
        10,
        1,
        "easy",
        {"accuracy": 0.5},
        trigger=["evaluate"],
        num_samples=4,
        num_prompts=1,
        eval_secs=0.1,
        mode="sync",
        world_size=1,
    )
    resumed.append(again)  # a standalone evaluation of that step is another kind of round
    EvalHistory(path).append(_record(10))  # a writer without once_per_step appends everything
    steps = [(r["step"], "event" in r, r.get("trigger")) for r in read_history(path)]
    assert steps == [
        (0, False, ["steps"]),
        (10, False, ["steps"]),
        (20, False, ["steps"]),
        (10, True, None),
        (10, False, ["evaluate"]),
        (10, False, ["steps"]),
    ]


def test_event_records_and_filters(tmp_path: Path) -> None:
    history = EvalHistory(tmp_path / HISTORY_FILENAME)
    alert = event_record(
        "alert",
        40,
        dataset="easy",
        message="accuracy 0.81 >= 0.7",
        time=1.0,
        metric="accuracy",
        value=0.81,
        threshold=0.7,
    )
    error = event_record("error", 50, message="eval round failed: OOM", time=2.0)
    history.append_many([_record(40), alert, error, _record(60)])
    records = read_history(history.path)
    assert [r["step"] for r in eval_rows(records)] == [40, 60]
    assert event_rows(records, "alert") == [alert]
    assert event_rows(records) == [alert, error]
    assert list(alert)[:6] == ["event", "step", "time", "dataset", "run_id", "message"]
    assert error["dataset"] is None
    doc = DOC.read_text()
    for field in (*alert, "threshold"):
        assert f"`{field}`" in doc, field


def test_record_builders_reject_bad_arguments_naming_them() -> None:
    kwargs = dict(trigger=["steps"], num_samples=8, num_prompts=2, eval_secs=0.1, world_size=1)
    with pytest.raises(
        ValueError,
        match=r"eval_record\(mode=...\) must be one of "
        r"\('sync', 'async'\), got 'fast'",
    ):
        eval_record(1, 0, "easy", {}, mode="fast", **kwargs)
    with pytest.raises(ValueError, match=r"\(step=...\) must be an integer >= 0, got -1"):
        eval_record(-1, 0, "easy", {}, mode="sync", **kwargs)
    with pytest.raises(ValueError, match=r"\(world_size=...\) must be an integer >= 1, got 0"):
        eval_record(1, 0, "easy", {}, mode="sync", **{**kwargs, "world_size": 0})
    with pytest.raises(ValueError, match=r"eval_record\(trigger=...\) must be a string or strings"):
        eval_record(1, 0, "easy", {}, mode="sync", **{**kwargs, "trigger": [3]})
    with pytest.raises(ValueError, match=r"\{'acc': ...\}\) must be a scalar, got 2 values"):
        eval_record(1, 0, "easy", {"acc": torch.tensor([0.1, 0.2])}, mode="sync", **kwargs)
    with pytest.raises(
        ValueError,
        match=r"event_record\(event=...\) must be one of "
        r"\('alert', 'error', 'resume', 'adaptive', 'drift', 'skipped', 'interrupted', 'integrity', "
        r"'prompt_outcomes'\), got 'info'",
    ):
        event_record("info", 1, message="x")
    with pytest.raises(
        ValueError,
        match=r"eval_record\(source=...\) must be one of "
        r"\('training', 'standalone'\), got 'fit'",
    ):
        eval_record(1, 0, "easy", {}, mode="sync", source="fit", **kwargs)


def test_writer_rejects_unstorable_values_and_directories(tmp_path: Path) -> None:
    history = EvalHistory(tmp_path / HISTORY_FILENAME)
    with pytest.raises(TypeError, match=r"cannot store record.model=<object .*> of type object"):
        history.append({"model": object()})
    with pytest.raises(TypeError, match="must be a mapping, got list"):
        history.append([1, 2])  # type: ignore[arg-type]
    assert not history.path.exists()  # nothing half-written
    with pytest.raises(IsADirectoryError, match=r"is a directory; pass the .jsonl file"):
        EvalHistory(tmp_path)


def test_default_time_is_now_and_metrics_become_floats() -> None:
    before = __import__("time").time()
    record = eval_record(
        3,
        0,
        "hard",
        {"accuracy": 1},
        trigger="epochs",
        num_samples=4,
        num_prompts=1,
        eval_secs=0.5,
        mode="async",
        world_size=1,
    )
    assert record["time"] >= before and record["trigger"] == ["epochs"]
    assert isinstance(record["metrics"]["accuracy"], float)
    assert math.isnan(
        eval_record(
            3,
            0,
            "hard",
            {"x": None},
            trigger="epochs",
            num_samples=4,
            num_prompts=1,
            eval_secs=0.5,
            mode="async",
            world_size=1,
        )["metrics"]["x"]
    )


def test_runs_are_told_apart_by_run_id_and_old_runs_where_a_step_repeats(tmp_path: Path) -> None:
    history = EvalHistory(tmp_path / HISTORY_FILENAME)
    # Written before run ids: two runs appended to one file (steps 0, 5, 0, 5), then two with ids.
    history.append_many(
        [
            _record(0, run_id=None),
            _record(0, "hard", run_id=None),
            _record(5, run_id=None),
            event_record("alert", 5, message="m", time=0.0),
            _record(0, run_id=None),
            _record(5, run_id=None),
            _record(0, run_id="aaaa1111"),
            _record(0, run_id="bbbb2222"),
            _record(5, run_id="aaaa1111"),
        ]
    )
    runs = split_runs(read_history(tmp_path))
    assert {name: [(r.get("event", r["dataset"]), r["step"]) for r in rs] for name, rs in runs.items()} == {
        "legacy-1": [("easy", 0), ("hard", 0), ("easy", 5), ("alert", 5)],
        "legacy-2": [("easy", 0), ("easy", 5)],
        "aaaa1111": [("easy", 0), ("easy", 5)],
        "bbbb2222": [("easy", 0)],
    }
    assert [r["step"] for r in read_history(tmp_path, run_id="aaaa1111")] == [0, 5]
    assert [r["step"] for r in read_history(tmp_path, run_id="legacy-2")] == [0, 5]
    assert read_history(tmp_path, run_id="nope") == []


def test_a_resume_supersedes_the_dead_sessions_records_of_later_steps() -> None:
    # Killed after evaluating step 15; resumed from its checkpoint of step 10, evaluated 15 again.
    records = [
        _record(5),
        _record(10),
        _record(15, accuracy=0.1),
        event_record("error", 16, message="x"),
        event_record("resume", 10, message="resumed", run_id="k3j9x2a1"),
        _record(15, accuracy=0.9),
    ]
    kept = drop_superseded(records)
    assert [(r.get("event"), r["step"]) for r in kept] == [(None, 5), (None, 10), ("resume", 10), (None, 15)]
    assert kept[-1]["metrics"]["accuracy"] == 0.9
