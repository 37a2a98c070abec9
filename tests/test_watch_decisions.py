"""What `evaluate --watch` decides, poll by poll, on real checkpoint files and a real eval history:
when a file is ready, which checkpoint comes next, what a restart skips (evaluated or failed),
when it stops, how Ctrl-C and SIGTERM are taken, and which W&B run it logs into."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
import torch

from areal_lightning.app.config import load_config
from areal_lightning.app.watch_checkpoints import (
    MAX_LOAD_FAILURES,
    STOP_FILENAME,
    Decision,
    DirectoryState,
    StopRequest,
    _Watch,
    done_steps,
    read_step,
    wandb_run_id,
)
from areal_lightning.tracking.history import EvalHistory, event_rows, read_history
from areal_lightning.tracking.records import eval_record, event_record


def _ckpt(directory: Path, name: str, step: int, epoch: int | None = 0) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    state: dict[str, int] = {"global_step": step}
    if epoch is not None:
        state["epoch"] = epoch
    torch.save(state, path)
    return path


def _watch_record(step: int, trigger: str = "watch") -> dict:
    return eval_record(
        step,
        0,
        "easy",
        {"accuracy": 0.5},
        trigger=[trigger],
        num_samples=4,
        num_prompts=4,
        eval_secs=0.1,
        mode="sync",
        world_size=1,
        source="standalone" if trigger == "watch" else "training",
    )


def _watch(tmp_path: Path, idle_timeout: float | None = None) -> _Watch:
    cfg = load_config(None, ["eval_sets.easy.size=4", f"output_dir={tmp_path}/run"])
    return _Watch(cfg, tmp_path / "ckpts", tmp_path / "run" / "eval_history.jsonl", 0.01, idle_timeout, False)


def test_a_checkpoint_is_ready_once_its_size_and_time_hold_for_two_polls(tmp_path: Path) -> None:
    state = DirectoryState()
    a = _ckpt(tmp_path, "step2.ckpt", 2)
    (tmp_path / "notes.txt").write_text("not a checkpoint")
    (tmp_path / "empty.ckpt").write_bytes(b"")
    assert state.poll(tmp_path) == ([], [tmp_path / "empty.ckpt", a])  # first sight: not yet
    assert state.poll(tmp_path) == ([a], [tmp_path / "empty.ckpt"])  # unchanged: ready; empty: never
    _ckpt(tmp_path, "step2.ckpt", 2, epoch=1)  # rewritten (another size)
    os.utime(a, ns=(time.time_ns(), time.time_ns() + 10**9))
    assert state.poll(tmp_path)[0] == []


def test_the_step_and_epoch_are_read_from_the_file_and_a_partial_file_is_not_read(tmp_path: Path) -> None:
    assert read_step(_ckpt(tmp_path, "a.ckpt", 6, epoch=2)) == (6, 2)
    assert read_step(_ckpt(tmp_path, "b.ckpt", 7, epoch=None)) == (7, 0)
    partial = tmp_path / "c.ckpt"
    partial.write_bytes(_ckpt(tmp_path, "d.ckpt", 8).read_bytes()[:20])
    assert read_step(partial) is None


def test_a_restart_skips_what_the_watcher_evaluated_or_recorded_as_failed(tmp_path: Path) -> None:
    history_file = tmp_path / "eval_history.jsonl"
    assert done_steps(history_file) == set()
    history = EvalHistory(history_file)
    history.append(_watch_record(4))
    history.append(_watch_record(6, trigger="steps"))  # a training round: not the watcher's
    history.append(event_record("error", 8, message="evaluation failed", source="watch", checkpoint="step8.ckpt"))
    history.append(event_record("error", 10, message="training failed"))
    assert done_steps(history_file) == {4, 8}


def test_stop_requested_stops_before_looking_at_the_directory(tmp_path: Path) -> None:
    watch = _watch(tmp_path)
    _ckpt(watch.directory, "step2.ckpt", 2)
    stop = StopRequest()
    stop.requested = True
    assert watch.decide(stop) == Decision("stop", reason="stop requested")


def test_each_checkpoint_is_evaluated_once_oldest_first_then_the_sentinel_stops(tmp_path: Path) -> None:
    watch = _watch(tmp_path)
    stop = StopRequest()
    assert watch.decide(stop) == Decision("wait")  # no directory yet
    _ckpt(watch.directory, "step4.ckpt", 4, epoch=1)
    _ckpt(watch.directory, "step2.ckpt", 2)
    (watch.directory / STOP_FILENAME).touch()
    assert watch.decide(stop) == Decision("wait")  # first sight: the files may be half written
    assert watch.decide(stop) == Decision("eval", str(watch.directory / "step2.ckpt"), 2, 0)
    EvalHistory(watch.history_file).append(_watch_record(2))
    assert watch.decide(stop) == Decision("eval", str(watch.directory / "step4.ckpt"), 4, 1)
    EvalHistory(watch.history_file).append(_watch_record(4))
    assert watch.decide(stop) == Decision("stop", reason=f"{STOP_FILENAME} found and every checkpoint evaluated")


def test_the_sentinel_waits_for_a_checkpoint_still_being_written(tmp_path: Path) -> None:
    watch = _watch(tmp_path)
    stop = StopRequest()
    (watch.directory).mkdir()
    (watch.directory / STOP_FILENAME).touch()
    _ckpt(watch.directory, "step2.ckpt", 2)
    assert watch.decide(stop) == Decision("wait")


def test_idle_timeout_stops_only_when_nothing_is_left(tmp_path: Path) -> None:
    watch = _watch(tmp_path, idle_timeout=5.0)
    stop = StopRequest()
    watch.directory.mkdir()
    assert watch.decide(stop) == Decision("wait")
    watch.last_progress = time.monotonic() - 6.0
    assert watch.decide(stop) == Decision("stop", reason="no new checkpoint for 5 s")

    watch = _watch(tmp_path / "again", idle_timeout=5.0)
    _ckpt(watch.directory, "step2.ckpt", 2)
    watch.last_progress = time.monotonic() - 6.0
    assert watch.decide(stop) == Decision("wait")  # a file appeared: progress
    assert watch.decide(stop).action == "eval"


def test_a_checkpoint_that_never_loads_is_reported_once_and_left_alone(tmp_path: Path) -> None:
    watch = _watch(tmp_path)
    stop = StopRequest()
    watch.directory.mkdir()
    bad = watch.directory / "step3.ckpt"
    bad.write_bytes(b"not a checkpoint at all")
    for _ in range(MAX_LOAD_FAILURES):  # first sight, then MAX_LOAD_FAILURES - 1 failed loads: retried
        assert watch.decide(stop) == Decision("wait")
    assert not watch.history_file.exists()
    assert watch.decide(stop) == Decision("wait")  # the last allowed failure: reported
    (event,) = event_rows(read_history(watch.history_file), "error")
    assert event["message"] == f"checkpoint {bad} did not load at {MAX_LOAD_FAILURES} polls; left alone"
    assert event["checkpoint"] == str(bad)
    for _ in range(3):
        assert watch.decide(stop) == Decision("wait")
    assert len(event_rows(read_history(watch.history_file), "error")) == 1
    (watch.directory / STOP_FILENAME).touch()
    assert watch.decide(stop).action == "stop"  # a given-up file does not hold the sentinel back


def test_the_first_ctrl_c_or_sigterm_asks_to_stop_and_a_second_ctrl_c_interrupts() -> None:
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    with StopRequest() as stop:
        assert not stop.requested
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.requested
        os.kill(os.getpid(), signal.SIGTERM)  # a second SIGTERM: still a clean stop
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before
    with StopRequest() as stop:
        os.kill(os.getpid(), signal.SIGINT)
        assert stop.requested


def test_the_wandb_run_is_the_checkpoints_then_the_configs_then_the_latest_local_run(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    assert wandb_run_id(None, run_dir) is None
    assert wandb_run_id("fromckpt", run_dir) == "fromckpt"
    (run_dir / "wandb" / "offline-run-20261130_120000-abc123").mkdir(parents=True)
    (run_dir / "wandb" / "latest-run").symlink_to(run_dir / "wandb" / "offline-run-20261130_120000-abc123")
    assert wandb_run_id(None, run_dir) == "abc123"
    (run_dir / "config.yaml").write_text("trial_name: t\n")  # written before run ids
    assert wandb_run_id(None, run_dir) == "abc123"
    (run_dir / "config.yaml").write_text("run_id: fromconfig\n")
    assert wandb_run_id(None, run_dir) == "fromconfig"
    assert wandb_run_id("fromckpt", run_dir) == "fromckpt"


def test_a_latest_run_link_that_is_not_a_wandb_run_names_no_run(tmp_path: Path) -> None:
    (tmp_path / "wandb" / "something-else").mkdir(parents=True)
    (tmp_path / "wandb" / "latest-run").symlink_to(tmp_path / "wandb" / "something-else")
    assert wandb_run_id(None, tmp_path) is None
    (tmp_path / "wandb" / "run-20261130_120000-xyz9").mkdir()
    (tmp_path / "wandb" / "latest-run").unlink()
    (tmp_path / "wandb" / "latest-run").symlink_to(tmp_path / "wandb" / "run-20261130_120000-xyz9")
    assert wandb_run_id(None, tmp_path) == "xyz9"
