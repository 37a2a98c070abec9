"""What `evaluate --watch` decides, poll by poll, on real checkpoint files and a real eval history:
when a file is ready, which checkpoint comes next, what a restart skips (evaluated or failed),
when it stops, how Ctrl-C and SIGTERM are taken, and which W&B run it logs into."""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from areal_lightning.app.config import load_config
from areal_lightning.app.watch_checkpoints import _Watch, wandb_run_id
from areal_lightning.app.watch_directory import (
    MAX_LOAD_FAILURES,
    STOP_FILENAME,
    Decision,
    DirectoryState,
    StopRequest,
    done_steps,
    read_step,
)
from areal_lightning.tracking.history import EvalHistory, event_rows, read_history
from areal_lightning.tracking.records import eval_record, event_record


def _ckpt(directory: Path, name: str, step: int, epoch: int | None = 0) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    # As Lightning's: the step and epoch beside the weights (tensors, whose loading is what
    # `map_location` decides).
    state: dict[str, object] = {"global_step": step, "state_dict": {"policy.weight": torch.ones(2, 2)}}
    if epoch is not None:
        state["epoch"] = epoch
    torch.save(state, path)
    return path


def _save_as_on_a_gpu(state: dict[str, object], path: Path) -> None:
    """`torch.save` as on a GPU: every tensor's storage tagged ``cuda:0`` (as `torch.save` of a CUDA
    tensor tags it), its bytes the CPU tensor's; loading it back needs a `map_location` without a GPU."""
    tagger = lambda storage: "cuda:0"  # noqa: E731
    torch.serialization.register_package(-1, tagger, lambda storage, location: None)
    try:
        torch.save(state, path)
    finally:
        registry = torch.serialization._package_registry
        registry.remove(next(entry for entry in registry if entry[1] is tagger))


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


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU loads a GPU checkpoint without map_location")
def test_the_step_of_a_checkpoint_saved_on_a_gpu_is_read_on_a_machine_without_one(tmp_path: Path) -> None:
    # Training on a GPU machine, the watch on a CPU one: its checkpoints must not wait forever.
    path = tmp_path / "step5.ckpt"
    _save_as_on_a_gpu({"global_step": 5, "epoch": 1, "state_dict": {"policy.weight": torch.ones(2, 2)}}, path)
    with pytest.raises(RuntimeError, match="CUDA"):  # what the file asks for without a map_location
        torch.load(path, mmap=True, weights_only=True)
    assert read_step(path) == (5, 1)


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


def test_a_checkpoint_that_never_loads_is_reported_once_and_left_alone(
    tmp_path: Path, watch_log: list[logging.LogRecord]
) -> None:
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
    assert event["checkpoint"] == str(bad) and event["step"] == 0  # its step is unknown
    assert [r.getMessage() for r in watch_log if r.levelname == "ERROR"] == [event["message"]]
    for _ in range(3):
        assert watch.decide(stop) == Decision("wait")
    assert len(event_rows(read_history(watch.history_file), "error")) == 1
    (watch.directory / STOP_FILENAME).touch()
    assert watch.decide(stop).action == "stop"  # a given-up file does not hold the sentinel back


@pytest.fixture
def seen_signals() -> Iterator[list[int]]:
    """SIGINT and SIGTERM handlers for the test that record the signals they get, the process's own
    put back after it: a signal the watch does not take shows in the list instead of ending pytest."""
    seen: list[int] = []
    before = {sig: signal.signal(sig, lambda s, f: seen.append(s)) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield seen
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def test_the_first_ctrl_c_or_sigterm_asks_to_stop_and_a_second_ctrl_c_interrupts(seen_signals: list[int]) -> None:
    previous = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    with StopRequest() as stop:
        assert stop.requested is False
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.requested and seen_signals == []
        os.kill(os.getpid(), signal.SIGTERM)  # a second SIGTERM: still a clean stop
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == previous
    with StopRequest() as stop:
        os.kill(os.getpid(), signal.SIGINT)
        assert stop.requested and seen_signals == []
    os.kill(os.getpid(), signal.SIGTERM)  # after the watch: the process's own handler again
    assert seen_signals == [signal.SIGTERM]


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


def test_a_file_is_ready_only_when_both_its_size_and_its_time_held(tmp_path: Path) -> None:
    state = DirectoryState()
    a = _ckpt(tmp_path, "step2.ckpt", 2)
    state.poll(tmp_path)
    assert state.poll(tmp_path) == ([a], [])
    stat = a.stat()
    os.utime(a, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # rewritten at the same size
    assert state.poll(tmp_path) == ([], [a])
    assert state.poll(tmp_path) == ([a], [])
    mtime = a.stat().st_mtime_ns
    with open(a, "ab") as f:
        f.write(b"0")  # grown, its time set back
    os.utime(a, ns=(mtime, mtime))
    assert state.poll(tmp_path) == ([], [a])


def test_a_file_gone_between_listing_and_reading_is_skipped_and_one_byte_is_a_file(tmp_path: Path) -> None:
    state = DirectoryState()
    (tmp_path / "a_gone.ckpt").symlink_to(tmp_path / "nowhere")  # listed, but stat() finds nothing
    one_byte = tmp_path / "b.ckpt"
    one_byte.write_bytes(b"x")
    c = _ckpt(tmp_path, "step2.ckpt", 2)
    state.poll(tmp_path)
    assert state.poll(tmp_path) == ([one_byte, c], [])


def test_a_given_up_file_does_not_hold_up_the_others(tmp_path: Path) -> None:
    watch = _watch(tmp_path)
    stop = StopRequest()
    watch.directory.mkdir()
    (watch.directory / "a_broken.ckpt").write_bytes(b"not a checkpoint")
    for _ in range(MAX_LOAD_FAILURES + 1):
        assert watch.decide(stop) == Decision("wait")
    _ckpt(watch.directory, "step2.ckpt", 2)
    assert watch.decide(stop) == Decision("wait")
    assert watch.decide(stop) == Decision("eval", str(watch.directory / "step2.ckpt"), 2, 0)


def test_a_file_that_does_not_load_yet_does_not_hold_up_the_checkpoints_after_it(tmp_path: Path) -> None:
    watch = _watch(tmp_path)
    stop = StopRequest()
    watch.directory.mkdir()
    (watch.directory / "a_broken.ckpt").write_bytes(b"not a checkpoint")  # listed first, retried at each poll
    _ckpt(watch.directory, "step2.ckpt", 2)
    assert watch.decide(stop) == Decision("wait")  # first sight of both
    assert watch.decide(stop) == Decision("eval", str(watch.directory / "step2.ckpt"), 2, 0)
    assert not watch.history_file.exists()  # the broken file is not given up yet


def test_a_checkpoint_whose_weights_do_not_load_is_retried_then_left_alone(
    tmp_path: Path, watch_log: list[logging.LogRecord]
) -> None:
    watch = _watch(tmp_path)
    stop = StopRequest()
    path = _ckpt(watch.directory, "step2.ckpt", 2)
    _ckpt(watch.directory, "step4.ckpt", 4)
    watch.decide(stop)
    decision = watch.decide(stop)
    assert decision == Decision("eval", str(path), 2, 0)
    for _ in range(MAX_LOAD_FAILURES - 1):
        watch.load_failed(decision, "another model")
        assert watch.decide(stop) == decision  # tried again
    assert not watch.history_file.exists()
    watch.load_failed(decision, "another model")
    (event,) = event_rows(read_history(watch.history_file), "error")
    assert event["message"] == f"checkpoint {path} did not load at {MAX_LOAD_FAILURES} tries; left alone: another model"
    assert [r.getMessage() for r in watch_log if r.levelname == "ERROR"] == [event["message"]]  # on stderr too
    assert (event["step"], event["checkpoint"]) == (2, str(path))
    assert watch.decide(stop) == Decision("eval", str(watch.directory / "step4.ckpt"), 4, 0)


def test_a_checkpoint_written_after_another_was_read_is_found_and_only_its_first_read_is_progress(
    tmp_path: Path,
) -> None:
    watch = _watch(tmp_path, idle_timeout=5.0)
    stop = StopRequest()
    _ckpt(watch.directory, "step2.ckpt", 2)
    assert watch.decide(stop) == Decision("wait")  # first sight
    assert watch.decide(stop) == Decision("eval", str(watch.directory / "step2.ckpt"), 2, 0)
    EvalHistory(watch.history_file).append(_watch_record(2))
    # Listed after step2.ckpt, which is read already: it is read all the same.
    _ckpt(watch.directory, "step3.ckpt", 3)
    assert watch.decide(stop) == Decision("wait")  # first sight
    watch.last_progress = time.monotonic() - 6.0
    # Its first read is progress: no idle stop, and it is evaluated.
    assert watch.decide(stop) == Decision("eval", str(watch.directory / "step3.ckpt"), 3, 0)
    EvalHistory(watch.history_file).append(_watch_record(3))
    _ckpt(watch.directory, "last.ckpt", 3)  # training goes on writing: a step already evaluated
    assert watch.decide(stop) == Decision("wait")  # first sight
    watch.last_progress = time.monotonic() - 6.0
    assert watch.decide(stop) == Decision("wait")  # read for the first time: progress, nothing to evaluate
    watch.last_progress = time.monotonic() - 6.0
    # Nothing new (the files already read are not progress): the idle timeout stops the watch.
    assert watch.decide(stop) == Decision("stop", reason="no new checkpoint for 5 s")


def test_a_file_being_written_counts_as_progress_for_the_idle_timeout(tmp_path: Path) -> None:
    watch = _watch(tmp_path, idle_timeout=5.0)
    stop = StopRequest()
    watch.directory.mkdir()
    watch.last_progress = time.monotonic() - 6.0
    partial = watch.directory / "step2.ckpt.tmp.ckpt"
    partial.write_bytes(b"half")
    assert watch.decide(stop) == Decision("wait")  # being written
    partial.unlink()  # moved away under another name
    assert watch.decide(stop) == Decision("wait")  # the write was progress: not idle yet


class _Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def monotonic(self) -> float:
        return self.now


def test_idle_means_more_than_idle_timeout_seconds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from areal_lightning.app import watch_checkpoints as watch_module

    clock = _Clock(1000.0)
    monkeypatch.setattr(watch_module, "time", clock)
    watch = _watch(tmp_path, idle_timeout=5.0)
    watch.directory.mkdir()
    watch.last_progress = 995.0
    assert watch.decide(StopRequest()) == Decision("wait")  # exactly 5 s
    clock.now = 1000.5
    assert watch.decide(StopRequest()) == Decision("stop", reason="no new checkpoint for 5 s")


def test_a_stop_request_is_logged_with_the_signal(watch_log: list[logging.LogRecord], seen_signals: list[int]) -> None:
    with StopRequest():
        os.kill(os.getpid(), signal.SIGTERM)
    assert seen_signals == []
    assert "stop requested (SIGTERM): finishing the checkpoint at hand" in [r.getMessage() for r in watch_log]


class Odd:
    """An object the safe loader (``weights_only=True``) refuses to unpickle."""


def test_a_checkpoint_holding_other_objects_is_not_unpickled_by_the_watcher(tmp_path: Path) -> None:
    odd = tmp_path / "odd.ckpt"
    torch.save({"global_step": 2, "epoch": 0, "extra": Odd()}, odd)
    assert read_step(odd) is None
    assert read_step(odd, trust=True) == (2, 0)  # --trust-checkpoint
    plain = tmp_path / "plain.ckpt"
    torch.save({"global_step": 3}, plain)
    assert read_step(plain) == (3, 0)
