"""A real offline W&B run through a real Trainer: config, eval x axis, late rounds, tables, CSV,
and W&B failures (unusable save_dir, no network, a run that dies mid-training) that never stop
training. Everything is read back from the run's own files: W&B's offline log and metrics.csv."""

from __future__ import annotations

import csv
import logging
import math
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
import wandb
from lightning.pytorch.utilities import rank_zero_only
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset
from wandb_reader import (
    branch_point,
    read_wandb_records,
    read_wandb_tables,
    rewound_history,
    run_sessions,
    wandb_alerts,
    wandb_config,
    wandb_history,
    wandb_metric_definitions,
    wandb_step_metric,
)

from areal_lightning.app.builders import build_loggers
from areal_lightning.app.config import Config, load_config, to_dict
from areal_lightning.eval_round import SetResult
from areal_lightning.tracking.loggers import log_eval_results, send_alert
from areal_lightning.tracking.wandb_logger import (
    EVAL_STEP_KEY,
    SafeWandbLogger,
    finish_wandb,
    last_logged_step,
    wandb_failure,
)
from areal_lightning.tracking.wandb_rounds import samples_table

MAX_STEPS = 6
# global step at which the callback logs -> the evaluated steps it logs then. The round for
# step 1 arrives at step 5, after step 4's round and after training rows of steps 2 and 3, as
# an asynchronous round does.
PLAN = {0: [0], 2: [2], 4: [4], 5: [1]}
LOGGED_ORDER = [0, 2, 4, 1]
WANDB_LOGGER = "areal_lightning.tracking.wandb_logger"


class TinyModule(L.LightningModule):
    """One linear layer regressing random data: just enough to drive a Trainer."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 1)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.mse_loss(self.layer(x), y)
        self.log("train/loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self) -> DataLoader:
        g = torch.Generator().manual_seed(0)
        return DataLoader(TensorDataset(torch.randn(64, 4, generator=g), torch.randn(64, 1, generator=g)), batch_size=8)


def make_results(step: int) -> list[SetResult]:
    """Hand-made results whose values encode the evaluated step, so a misplaced row shows."""
    rows = [
        {
            "index": i,
            "prompt": f"{step}+{i}=",
            "completion": f"0{step + i}",
            "answer": f"0{step + i}",
            "reward": float(i % 2),
            "correct": bool(i % 2),
        }
        for i in range(2)
    ]
    easy = SetResult(
        "easy",
        {"accuracy": step / 10, "reward/mean": step / 10 + 0.05, "pass@4": step / 8},
        num_samples=16,
        num_prompts=4,
        eval_secs=0.25,
        table_rows=rows,
    )
    hard = SetResult("hard", {"accuracy": step / 100}, num_samples=16, num_prompts=4, eval_secs=0.5, table_rows=[])
    return [easy, hard]


def expected_metrics(step: int) -> dict[str, float]:
    """What every logger must show for the round of `step`, spelled out independently."""
    return {
        "eval/easy/accuracy": step / 10,
        "eval/easy/reward/mean": step / 10 + 0.05,
        "eval/easy/pass@4": step / 8,
        "eval/easy/eval_secs": 0.25,
        "eval/hard/accuracy": step / 100,
        "eval/hard/eval_secs": 0.5,
    }


class ScriptedEval(L.Callback):
    """Logs the rounds of `plan` like the evaluation callback does, plus an alert, on rank 0."""

    def __init__(self, plan: dict[int, list[int]], kill_run_at: int | None = None) -> None:
        self.plan = plan
        self.kill_run_at = kill_run_at

    def _log(self, trainer: L.Trainer) -> None:
        step = trainer.global_step
        if step == self.kill_run_at:
            # The run ends under the trainer's feet (as when the wandb process dies).
            next(lg for lg in trainer.loggers if isinstance(lg, SafeWandbLogger)).experiment.finish()
        for evaluated in self.plan.get(step, []):
            log_eval_results(trainer.loggers, make_results(evaluated), evaluated)
            send_alert(trainer.loggers, "easy/accuracy below threshold", f"round of step {evaluated}")

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._log(trainer)

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        self._log(trainer)


def fit(cfg: Config, output_dir: Path, callback: L.Callback) -> L.Trainer:
    trainer = L.Trainer(
        max_steps=MAX_STEPS,
        logger=build_loggers(cfg, output_dir),
        callbacks=[callback],
        log_every_n_steps=1,
        accelerator="cpu",
        devices=1,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(output_dir),
    )
    trainer.fit(TinyModule())
    assert trainer.state.finished and trainer.global_step == MAX_STEPS
    return trainer


def config(output_dir: Path, *overrides: str) -> Config:
    return load_config(
        None,
        [
            "eval_sets.easy.size=4",
            "logger.wandb.mode=offline",
            f"output_dir={output_dir}",
            "experiment_name=wb",
            "trial_name=t1",
            *overrides,
        ],
    )


def csv_eval_rows(output_dir: Path) -> list[dict[str, Any]]:
    """Rows of Lightning's metrics.csv that hold eval metrics, numbers parsed."""
    (path,) = (output_dir / "csv").glob("version_*/metrics.csv")
    with path.open() as f:
        rows = [{k: float(v) for k, v in row.items() if v != ""} for row in csv.DictReader(f)]
    return [r for r in rows if "eval/easy/accuracy" in r]


class ListHandler(logging.Handler):
    """Keeps every record it is given (caplog is per test; the shared run is per module)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def wandb_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == WANDB_LOGGER and r.levelno == logging.WARNING]


@pytest.fixture(scope="module", autouse=True)
def wandb_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Offline, silent, and every wandb directory under tmp, for every test of this file."""
    home = tmp_path_factory.mktemp("wandb_home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("WANDB_MODE", "offline")
        mp.setenv("WANDB_SILENT", "true")
        for name in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR"):
            mp.setenv(name, str(home / name.lower()))
        yield home


@pytest.fixture(scope="module")
def offline_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One offline run, shared: fit with CSV + W&B, rounds at PLAN, then finish and read back."""
    out = tmp_path_factory.mktemp("offline_run")
    cfg = config(out, "logger.wandb.group=grp", "logger.wandb.tags=[smoke,tiny]")
    fanout_log, debug = logging.getLogger(WANDB_LOGGER), ListHandler()
    fanout_log.addHandler(debug)
    level, fanout_log.level = fanout_log.level, logging.DEBUG
    try:
        trainer = fit(cfg, out, ScriptedEval(PLAN))
    finally:
        fanout_log.removeHandler(debug)
        fanout_log.setLevel(level)
    wandb_mode_after_fit = os.environ.get("WANDB_MODE")
    finish_wandb(trainer.loggers)
    records = read_wandb_records(out)
    return {
        "out": out,
        "cfg": cfg,
        "trainer": trainer,
        "records": records,
        "rows": wandb_history(records),
        "wandb_mode_after_fit": wandb_mode_after_fit,
        "debug": [r.getMessage() for r in debug.records],
    }


@pytest.mark.process
def test_the_resolved_config_is_the_run_config_with_name_group_and_tags(offline_run: dict[str, Any]) -> None:
    cfg, records = offline_run["cfg"], offline_run["records"]
    assert wandb_config(records) == to_dict(cfg)
    assert wandb_config(records)["output_dir"] == str(offline_run["out"])  # resolved, no ${...}
    (run,) = [r["run"] for r in records if r["type"] == "run"]
    assert run["project"] == "areal-lightning"
    assert run["display_name"] == "wb/t1"
    assert run["run_group"] == "grp"
    assert run["tags"] == ["smoke", "tiny"]
    # The run lives under output_dir (the default save_dir), nowhere else.
    assert list((offline_run["out"] / "wandb").glob("offline-run-*/*.wandb"))


def test_every_eval_metric_is_plotted_against_eval_step(offline_run: dict[str, Any]) -> None:
    definitions = wandb_metric_definitions(offline_run["records"])
    assert {"name": "eval/*", "glob": True, "step_metric": EVAL_STEP_KEY} in [
        {k: d[k] for k in ("name", "glob", "step_metric")} for d in definitions
    ]
    assert any(d["name"] == EVAL_STEP_KEY and not d["glob"] for d in definitions)
    for key in expected_metrics(0):
        assert wandb_step_metric(definitions, key) == EVAL_STEP_KEY, key
        # Exact definitions, because Lightning's own glob "*" competes with "eval/*".
        assert any(d["name"] == key and not d["glob"] and d["step_metric"] == EVAL_STEP_KEY for d in definitions)
    # Training metrics keep Lightning's axis.
    assert wandb_step_metric(definitions, "train/loss") == "trainer/global_step"


def test_every_round_lands_at_its_evaluated_step_even_when_late(offline_run: dict[str, Any]) -> None:
    rows = offline_run["rows"]
    eval_rows = [r for r in rows if EVAL_STEP_KEY in r]
    assert [r[EVAL_STEP_KEY] for r in eval_rows] == LOGGED_ORDER  # nothing dropped, nothing doubled
    for row in eval_rows:
        step = row[EVAL_STEP_KEY]
        for key, value in expected_metrics(step).items():
            assert row[key] == pytest.approx(value), (step, key)
        assert row["trainer/global_step"] == step  # kept, not the latest training step
    # The late round came after training rows of later steps and was still kept.
    late = rows.index(eval_rows[-1])
    assert max(r["trainer/global_step"] for r in rows[:late] if "train/loss" in r) > eval_rows[-1][EVAL_STEP_KEY]
    assert [r["_step"] for r in rows] == list(range(len(rows)))


@pytest.mark.process
def test_each_round_logs_a_sample_table_per_eval_set_with_rows(offline_run: dict[str, Any]) -> None:
    rows = offline_run["rows"]
    tables = read_wandb_tables(offline_run["out"])
    assert {t.key for t in tables} == {"eval/easy/samples"}  # "hard" has no rows, so no table
    by_step = {r["_step"]: r[EVAL_STEP_KEY] for r in rows if EVAL_STEP_KEY in r}
    assert [by_step[t.step] for t in tables] == LOGGED_ORDER
    for table in tables:
        step = by_step[table.step]
        # Columns are the rows' keys, in the order the rows first name them.
        assert table.columns == ["index", "prompt", "completion", "answer", "reward", "correct"]
        assert table.rows() == [
            {
                "index": 0,
                "prompt": f"{step}+0=",
                "completion": f"0{step}",
                "answer": f"0{step}",
                "reward": 0.0,
                "correct": False,
            },
            {
                "index": 1,
                "prompt": f"{step}+1=",
                "completion": f"0{step + 1}",
                "answer": f"0{step + 1}",
                "reward": 1.0,
                "correct": True,
            },
        ]


def test_csv_logger_in_the_same_trainer_gets_the_same_eval_metrics(offline_run: dict[str, Any]) -> None:
    rows = csv_eval_rows(offline_run["out"])
    assert [int(r["step"]) for r in rows] == LOGGED_ORDER
    for row in rows:
        for key, value in expected_metrics(int(row["step"])).items():
            assert row[key] == pytest.approx(value)
    assert all(not k.startswith("eval/") or k in expected_metrics(0) for r in rows for k in r)


def test_offline_run_records_no_alert_and_keeps_the_users_wandb_mode(offline_run: dict[str, Any]) -> None:
    assert wandb_alerts(offline_run["records"]) == []  # offline runs cannot alert
    skipped = [m for m in offline_run["debug"] if "not sent" in m and "offline" in m]
    assert len(skipped) == len(LOGGED_ORDER) and "easy/accuracy below threshold" in skipped[0]
    assert offline_run["wandb_mode_after_fit"] == "offline"  # not Lightning's leftover "dryrun"


def test_samples_table_takes_its_columns_from_the_rows_and_accepts_tensors() -> None:
    table = samples_table(
        [
            {"index": 0, "prompt": "1+1=", "reward": torch.tensor(0.5)},
            {"index": 1, "prompt": "2+2=", "completion": "04", "reward": 1, "image_id": "g7"},
        ]
    )
    assert table.columns == ["index", "prompt", "reward", "completion", "image_id"]
    assert table.data == [[0, "1+1=", 0.5, None, None], [1, "2+2=", 1, "04", "g7"]]


def test_unusable_save_dir_is_reported_once_and_training_finishes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    out = tmp_path / "out"
    cfg = config(out, f"logger.wandb.save_dir={blocker / 'wandb'}")
    trainer = fit(cfg, out, ScriptedEval({0: [0], 2: [2]}))
    finish_wandb(trainer.loggers)
    (message,) = wandb_warnings(caplog)
    assert str(blocker / "wandb") in message and "cannot be created" in message
    assert str(out / "eval_history.jsonl") in message and "training goes on" in message
    assert str(blocker / "wandb") in str(wandb_failure(trainer.loggers[1]))
    assert [int(r["step"]) for r in csv_eval_rows(out)] == [0, 2]
    # wandb's fallback to the temp dir never happened: no run anywhere under tmp.
    assert not list(tmp_path.rglob("*.wandb"))


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture()
def no_network(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Online mode against a closed local port, with a 2 s init timeout."""
    monkeypatch.delenv("WANDB_MODE")
    monkeypatch.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{_closed_port()}")
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    monkeypatch.setenv("WANDB_INIT_TIMEOUT", "2")
    # wandb reads its environment once per process (the wandb.setup singleton): start afresh,
    # and again afterwards so later tests do not inherit these settings.
    wandb.teardown()
    yield
    wandb.teardown()


@pytest.mark.process
@pytest.mark.usefixtures("no_network")
def test_online_run_without_network_is_reported_once_and_training_finishes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    out = tmp_path / "out"
    trainer = fit(config(out, "logger.wandb.mode=online"), out, ScriptedEval({0: [0], 4: [4]}))
    finish_wandb(trainer.loggers)
    (message,) = wandb_warnings(caplog)
    assert "starting the run (wandb.init)" in message and "eval_history.jsonl" in message
    assert [int(r["step"]) for r in csv_eval_rows(out)] == [0, 4]


@pytest.mark.process
def test_run_that_dies_mid_training_is_reported_once_and_csv_stays_complete(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    out = tmp_path / "out"
    trainer = fit(config(out), out, ScriptedEval({0: [0], 2: [2], 4: [4]}, kill_run_at=3))
    finish_wandb(trainer.loggers)
    (message,) = wandb_warnings(caplog)
    assert "UsageError" in message and "is finished" in message
    assert [int(r["step"]) for r in csv_eval_rows(out)] == [0, 2, 4]
    rows = wandb_history(read_wandb_records(out))
    assert [r[EVAL_STEP_KEY] for r in rows if EVAL_STEP_KEY in r] == [0, 2]  # all it got before dying
    assert all(math.isfinite(r["_step"]) for r in rows)


def test_a_rank_other_than_0_never_talks_to_wandb(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # What Lightning's DDP strategy does in each process (`rank_zero_only.rank = self.global_rank`);
    # every call below, even those meant for rank 0 only, must stay away from W&B and the disk.
    monkeypatch.setattr(rank_zero_only, "rank", 1)
    loggers = build_loggers(config(tmp_path), tmp_path)
    wb = loggers[1]
    wb.log_metrics({"train/loss": 1.0}, step=0)
    wb.log_hyperparams({"lr": 0.1})
    log_eval_results(loggers, make_results(2), 2)
    send_alert(loggers, "easy/accuracy below threshold", "rank 1")
    finish_wandb(loggers)
    assert type(wb.experiment).__name__ == "_DummyExperiment"
    assert wb._experiment is None and wandb.run is None
    assert not list(tmp_path.rglob("*"))  # no W&B run, no CSV file


@pytest.mark.process
def test_a_resumed_logger_rewinds_the_run_to_the_checkpoints_row(tmp_path: Path) -> None:
    """A session logs 4 rows, a checkpoint takes the rewind point, the session logs 3 more and dies;
    the resumed session (rewind_to=the point) numbers its rows on from the point, and the run as W&B
    holds it after syncing both files has one row per step, none of the dead session's later ones."""
    # Each session in its own directory: wandb names a session's directory by the second it started.
    options: dict[str, Any] = dict(project="p", offline=True, mode="offline", id="rw1")
    first = SafeWandbLogger(**options, save_dir=str(tmp_path / "first"))
    for i in range(4):
        first.log_metrics({"m": float(i)}, step=i)
    point = last_logged_step([first])  # what RunIdentity writes into a checkpoint now
    for i in range(4, 7):
        first.log_metrics({"m": float(i)}, step=i)  # logged after the checkpoint, then the session dies
    finish_wandb([first], exit_code=1)

    second = SafeWandbLogger(**options, save_dir=str(tmp_path / "second"), rewind_to=point, logged_eval_through=6)
    assert second.logged_eval_through is None  # rewound: every step after the point is logged afresh
    assert second.experiment.id == "rw1"  # started, no row yet: a checkpoint now would rewind to the same point
    assert last_logged_step([second]) == point == 3
    for i in range(4, 8):
        second.log_metrics({"m": 100.0 + i}, step=i)
    assert last_logged_step([second]) == 7
    finish_wandb([second])

    sessions = [read_wandb_records(log) for d in ("first", "second") for log in run_sessions(tmp_path / d, "rw1")]
    assert [branch_point(s) for s in sessions] == [None, {"run": "rw1", "metric": "_step", "value": 3}]
    assert [(r["_step"], r["m"]) for r in rewound_history(sessions)] == [
        (0, 0.0),
        (1, 1.0),
        (2, 2.0),
        (3, 3.0),
        (4, 104.0),
        (5, 105.0),
        (6, 106.0),
        (7, 107.0),
    ]


@pytest.mark.process
def test_a_refused_rewind_continues_the_run_and_skips_the_logged_rounds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """W&B's rewind is in preview on its servers; one that refuses it (stood in for here: no server
    is reachable) leaves the resumed session appending to the run, with one warning, and the eval
    rounds the run already holds are not logged again."""
    real_init = wandb.init

    def refusing_init(**kwargs: Any) -> Any:
        if "resume_from" in kwargs:
            raise wandb.errors.CommError("rewinding runs is not enabled for this entity")
        return real_init(**kwargs)

    monkeypatch.setattr(wandb, "init", refusing_init)
    logger = SafeWandbLogger(
        project="p", save_dir=str(tmp_path), offline=True, mode="offline", id="rw2", rewind_to=3, logged_eval_through=4
    )
    with caplog.at_level(logging.WARNING, logger=WANDB_LOGGER):
        log_eval_results([logger], make_results(4), step=4)  # the earlier session logged it
        log_eval_results([logger], make_results(6), step=6)
    finish_wandb([logger])
    assert wandb_failure(logger) is None
    (warning,) = wandb_warnings(caplog)
    assert "refused to rewind run rw2 to _step 3" in warning and "up to step 4" in warning
    (session,) = [read_wandb_records(log) for log in run_sessions(tmp_path, "rw2")]
    assert branch_point(session) is None
    assert [row[EVAL_STEP_KEY] for row in wandb_history(session) if EVAL_STEP_KEY in row] == [6]
