"""Run directories and run identity, read the way `fit` reads them: what marks a used directory,
the message that stops a second run, the trial `--new-run` moves to (also from an already numbered
trial), and what a resume reads back (run id, step, CSV version, last eval step sent to W&B)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from areal_lightning.app.config import load_config
from areal_lightning.app.runs import (
    RUN_ENV,
    CheckpointRun,
    RunDirError,
    checkpoint_run,
    last_logged_eval_step,
    latest_csv_version,
    next_free_trial,
    resume_command,
    run_files,
    run_id_in_dir,
    start_run,
    used_dir_message,
)
from areal_lightning.tracking.history import EvalHistory
from areal_lightning.tracking.records import eval_record, event_record


def _loader(tmp_path: Path, trial: str, output_dir: str = "${trial_name}"):
    base = ["eval_sets.easy.size=4", f"trial_name={trial}", f"output_dir={tmp_path}/{output_dir}"]
    return load_config(None, base), lambda extra: load_config(None, base + extra)


def _use(run_dir: Path, what: str = "config.yaml") -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    if "." in what:
        (run_dir / what).write_text("x")
    else:
        (run_dir / what).mkdir()


def test_each_thing_a_run_writes_marks_the_directory_as_used(tmp_path: Path) -> None:
    assert run_files(tmp_path) == []
    for what in ("wandb", "csv", "eval_history.jsonl", "checkpoints", "config.yaml"):
        _use(tmp_path, what)
        assert what in run_files(tmp_path)
    assert run_files(tmp_path) == ["config.yaml", "eval_history.jsonl", "checkpoints", "csv", "wandb"]
    _use(tmp_path / "plots")  # anything else is not a run
    assert len(run_files(tmp_path)) == 5


def test_the_used_directory_message_names_what_was_found_and_the_three_ways_on(tmp_path: Path) -> None:
    out = tmp_path / "trial-2"
    _use(out / "checkpoints")
    (out / "checkpoints" / "step2.ckpt").write_text("x")
    assert used_dir_message(out, ["config.yaml", "checkpoints"], "trial-2") == (
        f"output_dir {str(out)!r} already holds a run (config.yaml, checkpoints); nothing was written. Either "
        "start a new run with another trial_name=... (or output_dir=...), or resume this one with "
        f"--ckpt {out / 'checkpoints' / 'last.ckpt'}, or pass --new-run to start the new run in the "
        "next free trial directory beside it (trial-3, ...)"
    )
    assert used_dir_message(out, ["csv"], "trial").endswith("beside it (trial-1, ...)")


def test_a_run_that_stopped_before_its_first_checkpoint_is_not_offered_as_a_resume(tmp_path: Path) -> None:
    out = tmp_path / "trial0"
    _use(out / "checkpoints")  # Lightning made the folder; the run died before it saved anything
    assert used_dir_message(out, ["config.yaml", "checkpoints"], "trial0") == (
        f"output_dir {str(out)!r} holds a run that stopped before its first checkpoint (config.yaml, checkpoints), "
        "so there is nothing to resume; nothing was written. Either pass --new-run to start the run in the next "
        "free trial directory beside it (trial0-1), or give another trial_name=... (or output_dir=...), or delete "
        f"the directory (rm -r {out}) and run the same command again"
    )


def test_new_run_keeps_a_free_directory(tmp_path: Path) -> None:
    cfg, load = _loader(tmp_path, "trial0")
    assert next_free_trial(cfg, load) is cfg


def test_new_run_moves_to_the_first_free_numbered_trial(tmp_path: Path) -> None:
    cfg, load = _loader(tmp_path, "base")
    _use(tmp_path / "base")
    _use(tmp_path / "base-1", "csv")
    moved = next_free_trial(cfg, load)
    assert (moved.trial_name, Path(moved.output_dir)) == ("base-2", tmp_path / "base-2")


def test_new_run_from_an_already_numbered_trial_counts_on_from_its_number(tmp_path: Path) -> None:
    cfg, load = _loader(tmp_path, "trial-7")
    _use(tmp_path / "trial-7")
    _use(tmp_path / "trial-8", "wandb")
    moved = next_free_trial(cfg, load)
    assert (moved.trial_name, Path(moved.output_dir)) == ("trial-9", tmp_path / "trial-9")


def test_new_run_refuses_an_output_dir_without_the_trial_name(tmp_path: Path) -> None:
    cfg, load = _loader(tmp_path, "trial0", output_dir="fixed")
    _use(tmp_path / "fixed")
    with pytest.raises(RunDirError) as info:
        next_free_trial(cfg, load)
    assert str(info.value) == (
        f"--new-run picks the next free trial_name, but output_dir={str(tmp_path / 'fixed')!r} does not "
        "contain ${trial_name}; give a new output_dir=... instead"
    )


def test_the_run_id_is_read_from_config_yaml_when_it_has_one(tmp_path: Path) -> None:
    assert run_id_in_dir(tmp_path) is None  # no file
    (tmp_path / "config.yaml").mkdir()
    assert run_id_in_dir(tmp_path) is None  # not a file
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.yaml").write_text(yaml.safe_dump(["not", "a", "mapping"]))
    assert run_id_in_dir(other) is None
    (other / "config.yaml").write_text(yaml.safe_dump({"trial_name": "t"}))  # written before run ids
    assert run_id_in_dir(other) is None
    (other / "config.yaml").write_text(yaml.safe_dump({"run_id": "k3j9x2a1", "trial_name": "t"}))
    assert run_id_in_dir(other) == "k3j9x2a1"


def test_a_checkpoint_gives_its_run_id_and_step() -> None:
    assert checkpoint_run({"global_step": 12, "run_id": "abc"}) == CheckpointRun("abc", 12)
    assert checkpoint_run({"global_step": 3.0}) == CheckpointRun(None, 3)
    assert isinstance(checkpoint_run({"global_step": 3.0}).step, int)


def test_a_checkpoint_gives_the_w_and_b_row_a_resume_rewinds_to() -> None:
    run = checkpoint_run({"global_step": 12, "run_id": "abc", "wandb_step": 30.0})
    assert run == CheckpointRun("abc", 12, wandb_step=30) and isinstance(run.wandb_step, int)
    assert checkpoint_run({"global_step": 12, "run_id": "abc"}).wandb_step is None  # an older checkpoint


def test_the_resume_command_keeps_the_users_words_and_pins_a_moved_trial() -> None:
    overrides = ["trainer.max_steps=50", "trial_name=t", "seed=2"]
    assert resume_command("grpo.yaml", overrides, "c.ckpt") == (
        "areal-lightning fit -c grpo.yaml trainer.max_steps=50 trial_name=t seed=2 --ckpt c.ckpt"
    )
    # --new-run moved the run to t-1: the command names it, once, in place of the user's trial_name.
    assert resume_command("grpo.yaml", overrides, "c.ckpt", trial_name="t-1") == (
        "areal-lightning fit -c grpo.yaml trainer.max_steps=50 seed=2 trial_name=t-1 --ckpt c.ckpt"
    )
    assert resume_command(None, [], Path("runs/x/last.ckpt")) == "areal-lightning fit --ckpt runs/x/last.ckpt"


def test_a_started_run_gets_a_new_id_and_hands_it_to_the_device_processes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(RUN_ENV, "")  # restored after the test; start_run sets it
    monkeypatch.delenv(RUN_ENV)  # the process the user started: nothing handed to it
    cfg, _ = _loader(tmp_path, "t")
    started = start_run(cfg)
    assert started.run_id and len(started.run_id) == 8
    assert json.loads(os.environ[RUN_ENV]) == {"run_id": started.run_id, "trial_name": "t"}

    # A process Lightning starts for another device runs the script again, with the environment:
    # it takes the handed id, even though the launching process has written into the directory.
    _use(tmp_path / "t")
    again, _ = _loader(tmp_path, "t")
    assert start_run(again).run_id == started.run_id

    # The process the user started, before a used directory: stopped with the message of `fit`.
    monkeypatch.delenv(RUN_ENV)
    used, _ = _loader(tmp_path, "t")
    with pytest.raises(RunDirError) as err:
        start_run(used)
    assert str(err.value) == used_dir_message(tmp_path / "t", ["config.yaml"], "t")
    assert RUN_ENV not in os.environ and used.run_id is None


def test_the_csv_version_of_a_run_is_its_highest_version_directory(tmp_path: Path) -> None:
    assert latest_csv_version(tmp_path) is None
    for name in ("version_0", "version_2", "version_10", "version_x", "old_version_99"):
        (tmp_path / "csv" / name).mkdir(parents=True)
    (tmp_path / "csv" / "version_50").write_text("a file, not a version")
    assert latest_csv_version(tmp_path) == 10


def _round(step: int, run_id: str, source: str = "training") -> dict:
    return eval_record(
        step,
        0,
        "easy",
        {"accuracy": 0.5},
        trigger=["steps"],
        num_samples=4,
        num_prompts=4,
        eval_secs=0.1,
        mode="sync",
        world_size=1,
        run_id=run_id,
        source=source,
    )


def test_the_last_eval_step_sent_is_the_runs_highest_training_round(tmp_path: Path) -> None:
    assert last_logged_eval_step(tmp_path, "run-a") is None  # no history yet
    history = EvalHistory.in_run_dir(tmp_path)
    for record in (
        _round(5, "run-a"),
        _round(10, "run-a"),
        _round(40, "run-b"),  # another run in the same file
        _round(60, "run-a", source="standalone"),  # a later `evaluate` of a checkpoint: not sent by training
        event_record("drift", 70, dataset="easy", message="changed"),
    ):
        history.append(record)
    assert last_logged_eval_step(tmp_path, "run-a") == 10
    assert last_logged_eval_step(tmp_path, "run-b") == 40
    assert last_logged_eval_step(tmp_path, "run-c") is None


def test_new_run_takes_the_very_next_trial_when_it_is_free(tmp_path: Path) -> None:
    cfg, load = _loader(tmp_path, "trial-7")
    _use(tmp_path / "trial-7")
    assert next_free_trial(cfg, load).trial_name == "trial-8"
    cfg, load = _loader(tmp_path, "base")
    _use(tmp_path / "base")
    assert next_free_trial(cfg, load).trial_name == "base-1"


def test_rounds_written_before_record_sources_count_as_training(tmp_path: Path) -> None:
    old = _round(12, "run-a")
    del old["source"]
    (tmp_path / "eval_history.jsonl").write_text(json.dumps(old) + "\n")
    assert last_logged_eval_step(tmp_path, "run-a") == 12
