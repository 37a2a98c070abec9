"""Each round's console line: the metrics its task names, wrapped to the terminal at metric boundaries;
and the one line the commands print for W&B instead of W&B's banner and summary."""

from __future__ import annotations

import json
import logging
import os
import re
import sys
from pathlib import Path

import lightning as L
import pytest
from hf_models import save_tiny_llama

from areal_lightning.app.builders import build_callback, build_loggers
from areal_lightning.app.config import load_config
from areal_lightning.app.console import task_summary_metrics, wandb_where
from areal_lightning.app.example_configs import example_text
from areal_lightning.eval_round import SetResult
from areal_lightning.tracking.console_log import round_line, terminal_width
from areal_lightning.tracking.recorder import EvalRecorder

HEAD = "evaluation at step 40 (freq_steps):"
CODE_METRICS = {"pass@1": 0.25, "pass@10": 0.5, "pass@1/stderr": 0.04, "code/passed": 41.0, "code/failed": 119.0}
ARITH_METRICS = {"accuracy": 0.5, "reward/mean": 0.5, "completion/entropy": 1.25, "accuracy/ci_low": 0.4}


def test_a_code_round_shows_every_pass_at_k_and_the_programs_that_passed() -> None:
    line = round_line(HEAD, {"humaneval": CODE_METRICS}, ["pass@*", "code/passed"], None)
    assert line == f"{HEAD} humaneval: pass@1=0.250 pass@10=0.500 code/passed=41"


def test_a_count_reads_as_an_integer_and_a_share_or_a_mean_keeps_its_decimals() -> None:
    metrics = {"pass@1": 1.0, "code/passed": 41.0, "code/timeout": 1.0, "turns/mean": 2.0}
    line = round_line(HEAD, {"s": metrics}, ["pass@*", "code/*", "turns/mean"], None)
    assert line == f"{HEAD} s: pass@1=1.000 code/passed=41 code/timeout=1.000 turns/mean=2.000"


def test_an_arithmetic_round_shows_accuracy_and_reward_of_each_set_only() -> None:
    sets = {"easy": ARITH_METRICS, "hard": {**ARITH_METRICS, "accuracy": 0.125}}
    line = round_line(HEAD, sets, task_summary_metrics(load_config(None, ["eval_sets.easy.size=5"])), None)
    assert line == f"{HEAD} easy: accuracy=0.500 reward/mean=0.500 | hard: accuracy=0.125 reward/mean=0.500"


@pytest.mark.parametrize("width", [30, 50, 80])
def test_a_long_line_is_wrapped_to_the_width_at_metric_boundaries(width: int) -> None:
    sets = {name: ARITH_METRICS for name in ("easy", "medium", "hard", "harder")}
    summary = ["accuracy", "reward/mean", "completion/entropy"]
    one_line = round_line(HEAD, sets, summary, None)
    lines = round_line(HEAD, sets, summary, width).splitlines()
    assert len(lines) > 1 and lines[0].startswith(HEAD)
    assert all(len(line) <= width for line in lines[1:]) and len(lines[0]) <= max(width, len(HEAD))
    assert all(line.startswith("  ") and not line.startswith("   ") for line in lines[1:])
    # The same words in the same order: a break falls between metrics, never inside one.
    assert " ".join(line.strip() for line in lines) == one_line
    assert all(re.fullmatch(r"[^=]*(=[0-9.]+)?", line.split()[-1]) for line in lines)
    assert not any(line.rstrip().endswith(":") and line != HEAD for line in lines)  # a set keeps its first metric


def test_the_width_is_the_terminals_and_a_log_file_keeps_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "57")
    leader, follower = os.openpty()
    monkeypatch.setattr(sys, "stderr", os.fdopen(follower, "w"))  # a terminal
    try:
        assert terminal_width() == 57
    finally:
        sys.stderr.close()
        os.close(leader)
    monkeypatch.setattr(sys, "stderr", open(Path(__file__), encoding="utf-8"))  # noqa: SIM115 - a file, no tty
    try:
        assert terminal_width() is None  # COLUMNS set (as make exports it) does not wrap a log file
    finally:
        sys.stderr.close()


def test_each_task_names_its_summary_metrics_and_the_callback_shows_them(tmp_path: Path) -> None:
    mt2 = tmp_path / "mt2.yaml"
    mt2.write_text(example_text("arithmetic_mt2"))
    assert task_summary_metrics(load_config(str(mt2), ["eval_sets.easy.size=4"])) == ("success@*", "turns/mean")
    problems = tmp_path / "mbpp.jsonl"
    problems.write_text(json.dumps({"text": "Add two numbers.", "test_list": ["assert add(1, 2) == 3"]}) + "\n")
    model = ["policy.kind=hf", f"policy.path={save_tiny_llama(tmp_path / 'model')}"]
    code = load_config(None, [*model, "task.name=code", f"task.path={problems}", f"eval_sets.mine.path={problems}"])
    assert task_summary_metrics(code) == ("pass@*", "code/passed")
    cfg = load_config(None, ["eval_sets.easy.size=4"])
    assert build_callback(cfg).recorder.summary_metrics == ("accuracy", "reward/mean")


def test_the_recorder_logs_the_line_of_its_summary_metrics(caplog: pytest.LogCaptureFixture) -> None:
    trainer = L.Trainer(logger=False, enable_progress_bar=False, enable_checkpointing=False)
    recorder = EvalRecorder("run1", "sync", summary_metrics=["pass@*", "code/passed"])
    with caplog.at_level(logging.INFO, logger="areal_lightning"):
        recorder.round(trainer, [SetResult("humaneval", CODE_METRICS, 160, 16, 1.0, [])], 40, 1, ["freq_steps"])
    assert [r.getMessage() for r in caplog.records if r.getMessage().startswith("evaluation")] == [
        f"{HEAD} humaneval: pass@1=0.250 pass@10=0.500 code/passed=41"
    ]


@pytest.mark.parametrize("bad", ["accuracy", ["accuracy", ""], [3]])
def test_summary_metrics_that_are_not_names_are_refused(bad: object) -> None:
    """The recorder speaks for the callback that holds it, as for its run id."""
    with pytest.raises(
        ValueError, match=r"`EvaluationCallback\(summary_metrics=...\)` must be a list of names or None"
    ):
        EvalRecorder("run1", "sync", summary_metrics=bad)  # type: ignore[arg-type]


@pytest.mark.process  # W&B starts its service process
def test_the_wandb_line_says_where_an_offline_run_is_and_how_to_upload_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, sub in (("WANDB_CONFIG_DIR", "wbc"), ("WANDB_CACHE_DIR", "wbk")):
        monkeypatch.setenv(name, str(tmp_path / sub))
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = load_config(None, ["eval_sets.easy.size=4", "logger.wandb.mode=offline"])
    loggers = build_loggers(cfg, tmp_path)
    assert wandb_where(loggers) is None  # no run started: nothing to say
    (wb,) = [lg for lg in loggers if type(lg).__name__ == "SafeWandbLogger"]
    run = wb.experiment
    try:
        where = wandb_where(loggers)
    finally:
        run.finish()
    assert where == f"W&B: offline run in {run.settings.sync_dir}; upload it with: wandb sync {run.settings.sync_dir}"
    assert Path(run.settings.sync_dir).is_dir() and str(tmp_path) in where
