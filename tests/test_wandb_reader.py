"""Reading a real offline W&B run back: history, steps, define_metric axes, config, tables."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from wandb_reader import (
    WandbReadError,
    find_wandb_file,
    read_wandb_records,
    read_wandb_run,
    read_wandb_tables,
    wandb_alerts,
    wandb_config,
    wandb_history,
    wandb_metric_definitions,
    wandb_step_metric,
    wandb_summary,
)

# Written by a separate interpreter so wandb's global run state never leaks into other tests.
MAKE_RUNS = textwrap.dedent("""
    import wandb
    run = wandb.init(project="p", name="first", config={"lr": 3e-4, "grpo": {"group_size": 8}})
    run.define_metric("eval/step")
    run.define_metric("eval/*", step_metric="eval/step")
    for i in range(3):
        run.log({"train/loss": 1.0 / (i + 1), "trainer/global_step": i})
    run.log({"eval/step": 100, "eval/easy/accuracy": 0.5, "eval/hard/accuracy": float("nan")})
    table = wandb.Table(columns=["prompt", "completion", "reward"],
                        data=[["1+2=", "03", 1.0], ["4+5=", "08", 0.0]])
    run.log({"eval/step": 200, "eval/easy/accuracy": 0.75, "eval/easy/samples": table})
    run.config.update({"trial": "t0"})
    run.alert(title="accuracy threshold", text="eval/easy/accuracy 0.75 >= 0.7")
    run.finish()
    second = wandb.init(project="p", name="second")
    second.log({"marker": 2.0})
    second.finish()
""")


@pytest.fixture(scope="module")
def output_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run output dir holding ``wandb/offline-run-*`` for two runs, the second one newer."""
    out = tmp_path_factory.mktemp("wandb_out")
    env = {
        **os.environ,
        "WANDB_MODE": "offline",
        "WANDB_SILENT": "true",
        "WANDB_DIR": str(out),
        "WANDB_CONFIG_DIR": str(out / ".config"),
        "WANDB_CACHE_DIR": str(out / ".cache"),
        "WANDB_DATA_DIR": str(out / ".data"),
    }
    subprocess.run([sys.executable, "-c", MAKE_RUNS], env=env, check=True, cwd=out)
    return out


@pytest.fixture(scope="module")
def first_run(output_dir: Path) -> Path:
    """The ``offline-run-*`` directory of the run named "first" (the one that logged a table)."""
    (run_dir,) = [d for d in (output_dir / "wandb").glob("offline-run-*") if (d / "files" / "media").is_dir()]
    return run_dir


@pytest.fixture(scope="module")
def first_records(first_run: Path) -> list[dict]:
    """Its raw records, read once: each read runs the wandb CLI (about a second)."""
    return read_wandb_records(first_run)


@pytest.mark.process
def test_history_rows_come_back_with_values_and_steps(first_run: Path, first_records: list[dict]) -> None:
    rows = read_wandb_run(first_run)
    assert rows == wandb_history(first_records)
    assert [r["_step"] for r in rows] == [0, 1, 2, 3, 4]
    assert [r["train/loss"] for r in rows[:3]] == pytest.approx([1.0, 0.5, 1 / 3])
    assert [r["trainer/global_step"] for r in rows[:3]] == [0, 1, 2]
    assert (rows[3]["eval/step"], rows[3]["eval/easy/accuracy"]) == (100, 0.5)
    assert math.isnan(rows[3]["eval/hard/accuracy"])  # NaN survives the trip
    assert (rows[4]["eval/step"], rows[4]["eval/easy/accuracy"]) == (200, 0.75)
    assert rows[4]["eval/easy/samples"]["_type"] == "table-file"


@pytest.mark.process
def test_the_run_is_found_from_file_run_dir_and_output_dir(output_dir: Path, first_run: Path) -> None:
    log = find_wandb_file(first_run)
    assert log.suffix == ".wandb" and log.parent == first_run
    assert find_wandb_file(log) == log
    # the output dir (and its wandb/ dir) hold two runs: the newest is read
    newest = find_wandb_file(output_dir)
    assert newest != log and find_wandb_file(output_dir / "wandb") == newest
    assert [r["marker"] for r in read_wandb_run(output_dir)] == [2.0]


def test_define_metric_axis_config_summary_and_alerts(first_records: list[dict]) -> None:
    records = first_records
    definitions = wandb_metric_definitions(records)
    assert [(d["name"], d["glob"], d["step_metric"]) for d in definitions] == [
        ("eval/step", False, None),
        ("eval/*", True, "eval/step"),
    ]
    assert wandb_step_metric(definitions, "eval/easy/accuracy") == "eval/step"
    assert wandb_step_metric(definitions, "eval/step") is None
    assert wandb_step_metric(definitions, "train/loss") is None
    assert wandb_config(records) == {"lr": 3e-4, "grpo": {"group_size": 8}, "trial": "t0"}
    summary = wandb_summary(records)
    assert (summary["eval/easy/accuracy"], summary["eval/step"], summary["_step"]) == (0.75, 200, 4)
    assert [(a["title"], a["text"]) for a in wandb_alerts(records)] == [
        ("accuracy threshold", "eval/easy/accuracy 0.75 >= 0.7")
    ]
    assert {r["type"] for r in records} >= {"run", "metric", "history", "config", "alert", "exit"}


@pytest.mark.process
def test_logged_table_comes_back(first_run: Path) -> None:
    (table,) = read_wandb_tables(first_run, key="eval/easy/samples")
    assert (table.key, table.step) == ("eval/easy/samples", 4)
    assert table.columns == ["prompt", "completion", "reward"]
    assert table.data == [["1+2=", "03", 1.0], ["4+5=", "08", 0.0]]
    assert table.rows()[1] == {"prompt": "4+5=", "completion": "08", "reward": 0.0}


@pytest.mark.process
def test_bad_paths_say_what_is_accepted(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"path='.*nowhere'\) does not exist; pass a .wandb file"):
        read_wandb_run(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match=r"no W&B run found under .*; pass a .wandb file"):
        read_wandb_run(tmp_path)
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(FileNotFoundError, match=r"is not a .wandb file; pass"):
        read_wandb_run(tmp_path / "notes.txt")
    (tmp_path / "run-broken.wandb").write_bytes(b"garbage, not a transaction log")
    with pytest.raises(WandbReadError, match=r"failed with exit status 1 .*wandb leet inspect"):
        read_wandb_run(tmp_path)
