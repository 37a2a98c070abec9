"""The logger fan-out without a W&B run: metric names, CSV and other loggers, building loggers
from the config, argument errors, and the report-once W&B guard."""

from __future__ import annotations

import csv
import logging
from argparse import Namespace
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import wandb
from lightning.pytorch.loggers import CSVLogger, Logger

from areal_lightning.app.builders import build_loggers, build_wandb_logger
from areal_lightning.app.config import ConfigError, load_config, to_dict
from areal_lightning.eval_round import SetResult
from areal_lightning.tracking.loggers import eval_metric_dict, log_eval_results, send_alert
from areal_lightning.tracking.wandb_logger import (
    EVAL_STEP_KEY,
    SafeWandbLogger,
    call_wandb,
    finish_wandb,
    wandb_failure,
)


def result(dataset: str, eval_secs: float = 0.5, **metrics: float) -> SetResult:
    return SetResult(dataset, dict(metrics), num_samples=8, num_prompts=2, eval_secs=eval_secs, table_rows=[])


class RecordingLogger(Logger):
    """A real (minimal) Lightning logger that keeps what it was given."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[dict[str, float], int | None]] = []

    @property
    def name(self) -> str:
        return "recording"

    @property
    def version(self) -> int:
        return 0

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        self.calls.append((dict(metrics), step))

    def log_hyperparams(self, params: dict[str, Any] | Namespace, *args: Any, **kwargs: Any) -> None:
        pass


def test_eval_metric_dict_flattens_per_dataset_and_adds_eval_secs() -> None:
    results = [
        result("easy", 1.5, **{"accuracy": 0.5, "reward/mean": 0.25, "pass@4": 0.75}),
        result("hard", 2.0, accuracy=0.125),
    ]
    assert eval_metric_dict(results) == {
        "eval/easy/accuracy": 0.5,
        "eval/easy/reward/mean": 0.25,
        "eval/easy/pass@4": 0.75,
        "eval/easy/eval_secs": 1.5,
        "eval/hard/accuracy": 0.125,
        "eval/hard/eval_secs": 2.0,
    }
    assert EVAL_STEP_KEY == "eval/step"


def test_eval_metric_dict_rejects_an_eval_set_twice() -> None:
    with pytest.raises(ValueError, match=r"eval_metric_dict\(results=...\) holds two results for eval set 'easy'"):
        eval_metric_dict([result("easy", accuracy=0.5), result("easy", accuracy=0.6)])


def test_every_other_logger_gets_the_metrics_at_the_evaluated_step(tmp_path: Path) -> None:
    csv_logger, recorder = CSVLogger(tmp_path, name="csv"), RecordingLogger()
    log_eval_results([csv_logger, recorder], [result("easy", accuracy=0.5)], step=20)
    # A late round for an earlier step (async mode) goes to the step it evaluated.
    log_eval_results([csv_logger, recorder], [result("easy", accuracy=0.25)], step=10)
    log_eval_results([csv_logger, recorder], [], step=30)  # nothing to log: nothing logged
    csv_logger.save()
    expected = [
        ({"eval/easy/accuracy": 0.5, "eval/easy/eval_secs": 0.5}, 20),
        ({"eval/easy/accuracy": 0.25, "eval/easy/eval_secs": 0.5}, 10),
    ]
    assert recorder.calls == expected
    with open(Path(csv_logger.log_dir) / "metrics.csv") as f:
        rows = [(float(r["eval/easy/accuracy"]), int(r["step"])) for r in csv.DictReader(f)]
    assert rows == [(0.5, 20), (0.25, 10)]


def test_build_loggers_follows_the_logger_section(tmp_path: Path) -> None:
    cfg = load_config(None, ["eval_sets.easy.size=4"])
    (csv_logger,) = build_loggers(cfg, tmp_path)
    assert isinstance(csv_logger, CSVLogger) and Path(csv_logger.log_dir) == tmp_path / "csv" / "version_0"
    assert build_loggers(load_config(None, ["eval_sets.easy.size=4", "logger.csv=false"]), tmp_path) == []
    assert build_wandb_logger(cfg, tmp_path) is None  # mode: disabled is the default


def test_wandb_logger_from_config_defaults_to_output_dir_and_run_name(tmp_path: Path) -> None:
    cfg = load_config(
        None,
        [
            "eval_sets.easy.size=4",
            "logger.wandb.mode=offline",
            "experiment_name=exp",
            "trial_name=t7",
            "logger.wandb.tags=[a]",
        ],
    )
    csv_logger, wb = build_loggers(cfg, tmp_path)
    assert isinstance(csv_logger, CSVLogger) and isinstance(wb, SafeWandbLogger)
    assert (wb.name, wb.save_dir) == ("areal-lightning", str(tmp_path))
    # What wandb.init will receive (the run itself is checked in test_wandb_logging.py).
    init = wb._wandb_init
    assert (init["name"], init["tags"], init["mode"], init["config"]) == ("exp/t7", ["a"], "offline", to_dict(cfg))
    assert "anonymous" not in init  # Lightning's anonymous=None only earns a wandb deprecation warning
    assert wb._experiment is None  # building starts no run


def test_wandb_logger_honours_explicit_name_and_save_dir(tmp_path: Path) -> None:
    cfg = load_config(
        None,
        [
            "eval_sets.easy.size=4",
            "logger.wandb.mode=online",
            "logger.wandb.name=mine",
            f"logger.wandb.save_dir={tmp_path / 'wb'}",
            "logger.wandb.entity=team",
        ],
    )
    wb = build_wandb_logger(cfg, tmp_path / "out")
    assert wb is not None and wb.save_dir == str(tmp_path / "wb")
    assert (wb._wandb_init["name"], wb._wandb_init["entity"], wb._offline) == ("mine", "team", False)
    assert "mode" not in wb._wandb_init  # online is not forced over WANDB_MODE in the environment


def test_a_bad_wandb_mode_is_refused_when_the_config_loads() -> None:
    with pytest.raises(
        ConfigError, match=r"logger.wandb.mode must be one of online, offline, disabled; got 'sometimes'"
    ):
        load_config(None, ["eval_sets.easy.size=4", "logger.wandb.mode=sometimes"])


def test_send_alert_checks_the_level_and_skips_other_loggers() -> None:
    with pytest.raises(ValueError, match=r"send_alert\(level=...\) must be one of INFO, WARN, ERROR, got 'LOUD'"):
        send_alert([], "t", "x", level="LOUD")
    recorder = RecordingLogger()
    send_alert([recorder], "accuracy fell", "0.6 < 0.7", level="error")
    send_alert([recorder], "accuracy fell", "0.6 < 0.7", level=wandb.AlertLevel.INFO)
    finish_wandb([recorder])
    assert recorder.calls == []


def test_a_wandb_failure_is_reported_once_then_wandb_is_left_alone(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    wb = SafeWandbLogger(offline=True, save_dir=str(tmp_path), history_file=tmp_path / "eval_history.jsonl")
    calls: list[int] = []

    def disk_full(n: int) -> int:
        calls.append(n)
        raise OSError(28, "No space left on device")

    assert call_wandb(wb, "logging metrics", lambda a, b: a + b, 1, 2) == 3
    assert call_wandb(wb, "logging metrics", disk_full, 1) is None
    assert call_wandb(wb, "logging metrics", disk_full, 2) is None
    wb.log_metrics({"train/loss": 1.0}, step=3)
    assert calls == [1]  # nothing reaches W&B after the failure
    messages = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert messages == [
        "W&B failed while logging metrics (OSError: [Errno 28] No space left on device). W&B logging is off for "
        f"the rest of this run; training goes on and {tmp_path / 'eval_history.jsonl'} remains complete."
    ]
    assert wb.failure == wandb_failure(wb) == "OSError: [Errno 28] No space left on device"
    assert type(wb.experiment).__name__ == "_DummyExperiment"  # user code calling it does not crash
    finish_wandb([wb])
    wb.finalize("success")
