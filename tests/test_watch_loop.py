"""`areal-lightning evaluate --watch` through its command, in this process, on one CPU device:
each checkpoint evaluated once, oldest first, recorded with its file, step, epoch and run id; a
restart evaluates nothing again; the sentinel, the idle timeout and SIGTERM stop it; an
evaluation that fails is recorded and sets the exit status; a checkpoint of another model is
reported and left alone; bad options are refused before any work.

The checkpoints hold the weights of the config's model, as built (no training): the watcher's
decisions do not depend on what the model has learnt.
"""

from __future__ import annotations

import logging
import os
import queue
import re
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from areal_lightning.app.cli import main
from areal_lightning.app.watch_directory import MAX_LOAD_FAILURES, STOP_FILENAME
from areal_lightning.tracking.history import EvalHistory, eval_rows, event_rows, read_history

# A watch that never stops is a failure, and one noticed quickly (a normal test takes 1-3 s here).
pytestmark = pytest.mark.timeout(30)

SIZE = 4
CONFIG = {
    "seed": 2,
    "policy": {"d_model": 16, "n_layers": 1},
    "trainer": {"enable_progress_bar": False, "accelerator": "cpu", "devices": 1},
    "eval_sets": {"w": {"digits": 1, "size": SIZE, "n_samples": 1, "batch_size": SIZE}},
    "logger": {"csv": False, "wandb": {"mode": "disabled"}},
}
POLL = "0.02"
IDLE = "0.4"


@pytest.fixture(scope="module")
def weights(tmp_path_factory: pytest.TempPathFactory) -> dict[str, torch.Tensor]:
    from areal_lightning.app.builders import build_module
    from areal_lightning.app.config import load_config

    config = tmp_path_factory.mktemp("weights") / "cfg.yaml"
    config.write_text(yaml.safe_dump(CONFIG))
    return build_module(load_config(config)).state_dict()


def _config(tmp_path: Path, **changes: Any) -> Path:
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump({**CONFIG, "output_dir": str(tmp_path / "run"), **changes}))
    return path


def _save(directory: Path, name: str, step: int, state: dict[str, torch.Tensor], epoch: int = 0) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    torch.save({"global_step": step, "epoch": epoch, "state_dict": state, "run_id": "run-a"}, path)
    return path


def _watch(config: Path, directory: Path, *extra: str) -> int:
    return main(["evaluate", "-c", str(config), "--watch", str(directory), "--poll-secs", POLL, *extra])


def _history(tmp_path: Path) -> list[dict[str, Any]]:
    path = tmp_path / "run" / "eval_history.jsonl"
    return read_history(path) if path.exists() else []


def test_each_checkpoint_once_oldest_first_with_its_file_then_idle_stops_and_a_restart_adds_nothing(
    tmp_path: Path, weights: dict[str, torch.Tensor], capsys: pytest.CaptureFixture[str]
) -> None:
    config, ckpts = _config(tmp_path), tmp_path / "ckpts"
    _save(ckpts, "step4.ckpt", 4, weights, epoch=1)
    _save(ckpts, "last.ckpt", 4, weights, epoch=1)  # the same step again: evaluated once
    _save(ckpts, "step2.ckpt", 2, weights)
    assert _watch(config, ckpts, "--idle-timeout", IDLE) == 0
    out = capsys.readouterr().out
    rows = eval_rows(_history(tmp_path))
    assert [(r["step"], r["epoch"], r["checkpoint"]) for r in rows] == [
        (2, 0, str(ckpts / "step2.ckpt")),
        (4, 1, str(ckpts / "step4.ckpt")),
    ]
    # How far behind the watcher was: step 4 was already there when step 2 was evaluated.
    assert [(r["step"], r["lag_steps"]) for r in rows] == [(2, 2), (4, 0)]
    for row in rows:
        assert row["trigger"] == ["watch"] and row["source"] == "standalone" and row["run_id"] == "run-a"
        assert (row["num_prompts"], row["num_samples"], row["world_size"], row["mode"]) == (SIZE, SIZE, 1, "sync")
        assert row["dataset"] == "w" and 0.0 <= row["metrics"]["accuracy"] <= 1.0 and row["eval_secs"] > 0
    assert out.startswith(
        f"watching {ckpts} for checkpoints; stop with Ctrl-C, --idle-timeout or {ckpts / STOP_FILENAME}\n"
    )
    table = out.split(f"checkpoint {ckpts / 'step2.ckpt'} (step 2, epoch 0):\n")[1].split("checkpoint ")[0]
    assert table.split()[:2] == ["metric", "w"] and "\naccuracy " in table and "\nsecs " in table  # the round's table
    assert out.index("(step 2, epoch 0)") < out.index(f"checkpoint {ckpts / 'step4.ckpt'} (step 4, epoch 1):")
    assert out.rstrip().endswith(f"watch stopped: no new checkpoint for {float(IDLE):g} s; 2 checkpoint(s) evaluated")

    assert _watch(config, ckpts, "--idle-timeout", IDLE) == 0  # a restart: everything is done
    assert len(eval_rows(_history(tmp_path))) == 2
    assert "0 checkpoint(s) evaluated" in capsys.readouterr().out


def test_the_sentinel_stops_once_every_checkpoint_is_evaluated(
    tmp_path: Path, weights: dict[str, torch.Tensor], capsys: pytest.CaptureFixture[str]
) -> None:
    config, ckpts = _config(tmp_path), tmp_path / "ckpts"
    _save(ckpts, "step3.ckpt", 3, weights)
    (ckpts / STOP_FILENAME).touch()
    assert _watch(config, ckpts) == 0  # no idle timeout: only the sentinel ends it
    assert [r["step"] for r in eval_rows(_history(tmp_path))] == [3]
    assert (
        capsys.readouterr()
        .out.rstrip()
        .endswith(f"watch stopped: {STOP_FILENAME} found and every checkpoint evaluated; 1 checkpoint(s) evaluated")
    )


def test_sigterm_finishes_the_checkpoint_at_hand_and_stops(
    tmp_path: Path, weights: dict[str, torch.Tensor], capsys: pytest.CaptureFixture[str], monkeypatch: Any
) -> None:
    config, ckpts = _config(tmp_path), tmp_path / "ckpts"
    for step in (2, 4, 6):
        _save(ckpts, f"step{step}.ckpt", step, weights)
    append_many = EvalHistory.append_many

    def append_then_sigterm(self: EvalHistory, records: Any) -> None:
        append_many(self, records)
        os.kill(os.getpid(), signal.SIGTERM)  # as `kill` would, once the first checkpoint is recorded

    monkeypatch.setattr(EvalHistory, "append_many", append_then_sigterm)
    before = signal.getsignal(signal.SIGTERM)
    assert _watch(config, ckpts) == 0
    assert signal.getsignal(signal.SIGTERM) == before  # the handler is put back
    assert [r["step"] for r in eval_rows(_history(tmp_path))] == [2]
    out = capsys.readouterr().out
    assert out.rstrip().endswith("watch stopped: stop requested; 1 checkpoint(s) evaluated")


def test_a_failed_evaluation_is_recorded_not_retried_and_sets_the_exit_status(
    tmp_path: Path,
    weights: dict[str, torch.Tensor],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: Any,
    watch_log: list[logging.LogRecord],
) -> None:
    from areal_lightning.rl import rollout_eval

    config, ckpts = _config(tmp_path), tmp_path / "ckpts"
    _save(ckpts, "step2.ckpt", 2, weights)
    _save(ckpts, "step4.ckpt", 4, weights, epoch=1)
    _save(ckpts, "step6.ckpt", 6, weights, epoch=1)
    evaluate = rollout_eval.rollout_evaluate
    rounds: list[tuple[int, int]] = []

    def out_of_memory_at_steps_2_and_6(module: Any, batches: Any, ctx: Any) -> Any:
        rounds.append((ctx.global_step, ctx.epoch))  # what evaluate_fn is told about the checkpoint
        if ctx.global_step in (2, 6):  # what a real round can hit; the model here is too small to
            raise RuntimeError("CUDA out of memory")
        return evaluate(module, batches, ctx)

    monkeypatch.setattr(rollout_eval, "rollout_evaluate", out_of_memory_at_steps_2_and_6)
    assert _watch(config, ckpts, "--idle-timeout", IDLE) == 1
    history = _history(tmp_path)
    error, later = event_rows(history, "error")
    assert (error["step"], error["source"], error["checkpoint"]) == (2, "watch", str(ckpts / "step2.ckpt"))
    assert (later["step"], later["checkpoint"]) == (6, str(ckpts / "step6.ckpt"))
    assert error["message"].startswith("evaluation of eval set 'w' failed") and "CUDA out of memory" in error["message"]
    assert [r["step"] for r in eval_rows(history)] == [4]
    assert sorted(set(rounds)) == [(2, 0), (4, 1), (6, 1)]
    assert f"evaluation of {ckpts / 'step2.ckpt'} failed: {error['message']}" in [r.getMessage() for r in watch_log]
    captured = capsys.readouterr()
    assert "watch stopped: no new checkpoint" in captured.out and "1 checkpoint(s) evaluated" in captured.out
    assert f"2 of 3 rounds failed; see {tmp_path / 'run' / 'eval_history.jsonl'}" in captured.err
    assert _watch(config, ckpts, "--idle-timeout", IDLE) == 0  # a restart does not try them again
    assert len(event_rows(_history(tmp_path), "error")) == 2


def test_a_checkpoint_of_another_model_is_reported_and_left_alone(
    tmp_path: Path, weights: dict[str, torch.Tensor], watch_log: list[logging.LogRecord]
) -> None:
    config, ckpts = _config(tmp_path), tmp_path / "ckpts"
    other = dict(weights)
    other["extra.weight"] = torch.zeros(2)
    _save(ckpts, "step2.ckpt", 2, other)
    _save(ckpts, "step4.ckpt", 4, weights)
    assert _watch(config, ckpts, "--idle-timeout", IDLE) == 0
    history = _history(tmp_path)
    assert [r["step"] for r in eval_rows(history)] == [4]  # the next one is not held up
    (error,) = event_rows(history, "error")
    assert (error["step"], error["checkpoint"]) == (2, str(ckpts / "step2.ckpt"))
    assert error["message"].startswith(f"checkpoint {ckpts / 'step2.ckpt'} did not load at {MAX_LOAD_FAILURES} tries")
    assert "Unexpected key(s)" in error["message"] and "extra.weight" in error["message"]
    skipped = [r.getMessage() for r in watch_log if r.getMessage().startswith(f"skipping {ckpts / 'step2.ckpt'}")]
    assert len(skipped) == MAX_LOAD_FAILURES
    assert f"checkpoint {str(ckpts / 'step2.ckpt')!r} does not match the model of the config" in skipped[0]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--idle-timeout", "0"], "--idle-timeout must be a positive number of seconds, got 0.0"),
        (["--poll-secs", "-1"], "--poll-secs must be a positive number of seconds, got -1.0"),
        (["--poll-secs", "nan"], "--poll-secs must be a positive number of seconds, got nan"),
    ],
)
def test_bad_timings_are_refused_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    assert _watch(_config(tmp_path), tmp_path / "ckpts", *args) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_a_file_for_the_directory_or_an_unwritable_history_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    afile = tmp_path / "step2.ckpt"
    afile.write_bytes(b"x")
    assert _watch(_config(tmp_path), afile) == 2
    assert (
        f"--watch {str(afile)!r} is a file; pass the directory the checkpoints are written to, "
        "e.g. <output_dir>/checkpoints" in capsys.readouterr().err
    )
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    assert _watch(_config(tmp_path, output_dir=str(blocker / "run")), tmp_path / "ckpts") == 2
    assert "output_dir" in capsys.readouterr().err
    assert (
        main(["evaluate", "-c", str(_config(tmp_path)), "--watch", str(tmp_path), "--history", str(blocker / "h")]) == 2
    )
    assert "--history" in capsys.readouterr().err


def test_the_watchers_record_is_what_evaluate_gives_for_the_same_checkpoint(
    tmp_path: Path, weights: dict[str, torch.Tensor]
) -> None:
    """The same seed, step and epoch as `evaluate --ckpt`: the same sampled answers, the same metrics."""
    config, ckpts = _config(tmp_path), tmp_path / "ckpts"
    ckpt = _save(ckpts, "step6.ckpt", 6, weights, epoch=2)
    (ckpts / STOP_FILENAME).touch()
    assert _watch(config, ckpts) == 0
    assert main(["evaluate", "-c", str(config), "--ckpt", str(ckpt), "--history", str(tmp_path / "once.jsonl")]) == 0
    (watched,) = eval_rows(_history(tmp_path))
    (once,) = eval_rows(read_history(tmp_path / "once.jsonl"))
    assert (watched["step"], watched["epoch"]) == (once["step"], once["epoch"]) == (6, 2)
    assert watched["metrics"] == once["metrics"] and watched["sampling"] == once["sampling"]


def test_what_a_round_notes_is_in_the_watchers_record(
    tmp_path: Path, weights: dict[str, torch.Tensor], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A round's notes (through servers: the weight version they held) stay in the watch's record."""
    from areal_lightning.app import evaluate

    choose = evaluate.default_evaluate_fn

    def noting(module: Any) -> Any:
        inner = choose(module)

        def evaluate_fn(module: Any, batches: Any, ctx: Any) -> Any:
            ctx.note("engine/weight_version", f"step-{ctx.global_step}")
            return inner(module, batches, ctx)

        return evaluate_fn

    monkeypatch.setattr(evaluate, "default_evaluate_fn", noting)
    config, ckpts = _config(tmp_path), tmp_path / "ckpts"
    _save(ckpts, "step3.ckpt", 3, weights)
    (ckpts / STOP_FILENAME).touch()
    assert _watch(config, ckpts) == 0
    assert [r["notes"] for r in eval_rows(_history(tmp_path))] == [{"engine/weight_version": "step-3"}]


class Odd:
    """An object the safe loader refuses: only `--trust-checkpoint` reads a checkpoint holding it."""


def test_trust_checkpoint_evaluates_a_checkpoint_the_safe_loader_refuses(
    tmp_path: Path, weights: dict[str, torch.Tensor]
) -> None:
    config, ckpts = _config(tmp_path), tmp_path / "ckpts"
    ckpts.mkdir()
    torch.save({"global_step": 2, "epoch": 0, "state_dict": weights, "extra": Odd()}, ckpts / "step2.ckpt")
    (ckpts / STOP_FILENAME).touch()
    history = tmp_path / "elsewhere.jsonl"
    assert _watch(config, ckpts, "--history", str(history)) == 0  # reported and left alone
    assert eval_rows(read_history(history)) == [] and len(event_rows(read_history(history), "error")) == 1
    assert _watch(config, ckpts, "--history", str(history), "--trust-checkpoint") == 0
    assert [r["step"] for r in eval_rows(read_history(history))] == [2]
    assert not (tmp_path / "run" / "eval_history.jsonl").exists()  # --history chose the file


def test_the_options_say_what_they_do_and_default_to_no_timeout_and_2_s_polls(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from areal_lightning.app.cli import build_parser

    args = build_parser().parse_args(["evaluate", "-c", "cfg.yaml", "--watch", "ckpts"])
    assert (args.watch, args.idle_timeout, args.poll_secs) == ("ckpts", None, 2.0)
    with pytest.raises(SystemExit):
        main(["evaluate", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert (
        "--watch CHECKPOINT_DIR evaluate each new checkpoint of this directory as it appears, oldest first, "
        f"once each; stops on Ctrl-C, --idle-timeout or a file {STOP_FILENAME} in the directory" in text
    )
    assert "--idle-timeout SECS with --watch: stop after SECS without a new checkpoint (default: never)" in text
    assert "--poll-secs SECS with --watch: seconds between looks at the directory (default 2)" in text
    with pytest.raises(SystemExit):
        main(["evaluate", "-c", "cfg.yaml", "--watch", "ckpts", "--poll-secs", "often"])
    assert "--poll-secs: invalid float value: 'often'" in capsys.readouterr().err


def test_a_config_error_or_an_unwritable_wandb_dir_is_refused_before_any_work_unless_wandb_is_off(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _watch(_config(tmp_path), tmp_path / "ckpts", "no_such_key=1") == 2
    assert "no_such_key" in capsys.readouterr().err
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    wandb = {"csv": False, "wandb": {"mode": "offline", "save_dir": str(blocker / "wandb")}}
    assert _watch(_config(tmp_path, logger=wandb), tmp_path / "ckpts") == 2
    assert f"logger.wandb.save_dir {str(blocker / 'wandb')!r} cannot be written" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
    # With W&B off its directory is never written: no reason to refuse.
    (tmp_path / "ckpts").mkdir()
    (tmp_path / "ckpts" / STOP_FILENAME).touch()
    wandb_off = {"csv": False, "wandb": {"mode": "disabled", "save_dir": str(blocker / "wandb")}}
    assert _watch(_config(tmp_path, logger=wandb_off), tmp_path / "ckpts") == 0


def test_a_checkpoint_rewritten_since_its_step_was_read_is_not_evaluated_as_that_step(
    tmp_path: Path, weights: dict[str, torch.Tensor], watch_log: list[logging.LogRecord]
) -> None:
    """last.ckpt rewritten between the poll and the load: every rank sees another step and skips it."""
    from lightning.fabric import Fabric

    from areal_lightning.app.builders import build_module
    from areal_lightning.app.config import load_config
    from areal_lightning.app.watch_checkpoints import _load_on_every_rank

    module = build_module(load_config(_config(tmp_path)))
    fabric = Fabric(accelerator="cpu", devices=1)
    last = _save(tmp_path / "ckpts", "last.ckpt", 4, weights)
    assert _load_on_every_rank(fabric, module, str(last), 4, False) == (None, "run-a")
    error, _ = _load_on_every_rank(fabric, module, str(last), 2, False)
    assert error == f"{last} now holds step 4, not 2"
    assert f"skipping {last} for now: {last} now holds step 4, not 2" in [r.getMessage() for r in watch_log]
    torch.save({"global_step": 4, "state_dict": weights, "extra": Odd()}, last)
    assert _load_on_every_rank(fabric, module, str(last), 4, False)[0] is not None  # the safe loader refuses
    assert _load_on_every_rank(fabric, module, str(last), 4, True) == (None, None)  # trusted; no run id kept


@pytest.mark.process  # W&B's service
def test_with_wandb_on_each_checkpoint_goes_to_the_checkpoints_wandb_run_on_the_eval_axis(
    tmp_path: Path,
    weights: dict[str, torch.Tensor],
    recwarn: pytest.WarningsRecorder,
    watch_log: list[logging.LogRecord],
) -> None:
    from wandb_reader import read_wandb_records, wandb_history, wandb_metric_definitions, wandb_step_metric

    config = _config(tmp_path, logger={"csv": False, "wandb": {"mode": "offline"}})
    ckpts = tmp_path / "ckpts"
    _save(ckpts, "step2.ckpt", 2, weights)
    _save(ckpts, "step5.ckpt", 5, weights, epoch=1)
    assert _watch(config, ckpts, "--idle-timeout", IDLE) == 0
    records = read_wandb_records(tmp_path / "run")
    assert [r["run"]["run_id"] for r in records if r["type"] == "run"][:1] == ["run-a"]  # the checkpoint's run
    assert wandb_step_metric(wandb_metric_definitions(records), "eval/w/accuracy") == "eval/step"
    logged = [(row["eval/step"], row["eval/w/accuracy"]) for row in wandb_history(records) if "eval/w/accuracy" in row]
    history = eval_rows(_history(tmp_path))
    assert logged == [(r["step"], pytest.approx(r["metrics"]["accuracy"])) for r in history]
    assert [step for step, _ in logged] == [2, 5]
    assert [r["exit"].get("exit_code", 0) for r in records if r["type"] == "exit"] == [0]  # the run was finished
    # Where the run is, said once at the end of the watch: W&B itself is silent in the commands.
    (where,) = [r.getMessage() for r in watch_log if r.getMessage().startswith("W&B")]
    run_dir = re.fullmatch(r"W&B: offline run in (\S+); upload it with: wandb sync \1", where)
    assert run_dir is not None and Path(run_dir[1]).is_relative_to(tmp_path / "run") and Path(run_dir[1]).is_dir()
    # One logger for the watch: a logger made per checkpoint would warn that it reuses the run in progress.
    assert not [str(w.message) for w in recwarn if "already in progress" in str(w.message)]


def _next_line(lines: queue.Queue[str], deadline: float, wanted: str) -> str:
    while (left := deadline - time.monotonic()) > 0:
        try:
            line = lines.get(timeout=left)
        except queue.Empty:
            break
        if line.startswith(wanted):
            return line
    raise AssertionError(f"no line starting {wanted!r} on the watch's stdout while it runs")


@pytest.mark.process
@pytest.mark.timeout(180)
def test_a_reader_of_the_pipe_sees_each_round_while_the_watch_waits_for_the_next(
    tmp_path: Path, weights: dict[str, torch.Tensor]
) -> None:
    """Output to a pipe (a log collector, `| tee`) is block-buffered: without a flush the round's
    report would sit in the buffer while the watch waits, possibly for hours."""
    from cli_server import start_cli

    config, ckpts = _config(tmp_path), tmp_path / "ckpts"
    ckpts.mkdir()
    argv = ["evaluate", "-c", str(config), "--watch", str(ckpts), "--poll-secs", "0.05"]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # a pipe is block-buffered
    with (
        (tmp_path / "stderr.txt").open("w") as err,
        start_cli(argv, tmp_path, env, stdout=subprocess.PIPE, stderr=err) as proc,
    ):
        lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout or []], daemon=True).start()
        deadline = time.monotonic() + 90.0
        assert _next_line(lines, deadline, "watching ").startswith(f"watching {ckpts} for checkpoints")
        _save(ckpts, "step2.ckpt", 2, weights)  # only now: the line above came while the watch waited
        _next_line(lines, deadline, f"checkpoint {ckpts / 'step2.ckpt'} (step 2, epoch 0):")
        assert _next_line(lines, deadline, "metric").split()[:2] == ["metric", "w"]
        _next_line(lines, deadline, "secs ")  # the table's last row, while the watch polls on
        assert proc.poll() is None
        (ckpts / STOP_FILENAME).touch()
        assert proc.wait(timeout=60) == 0
