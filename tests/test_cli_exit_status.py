"""A command whose evaluation rounds failed does not exit 0: `fit`, `evaluate` (``--ckpt`` and
``--watch``) end with one line ``N of M rounds failed; see <history>`` and exit 1; `plot` exits 2
when it has nothing to draw.

Rounds are made to fail where a user's code would fail: the evaluation raising at chosen steps
(the first round stays healthy, as a bug that shows only later would).
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from areal_lightning.app.cli import main
from areal_lightning.rl import rollout_eval
from areal_lightning.rl.grpo.module import GRPOModule
from areal_lightning.tracking.history import event_rows, read_history

CONFIG = {
    "seed": 2,
    "policy": {"d_model": 32, "n_layers": 1},
    "grpo": {"warmup_steps": 2, "prompts_per_step": 4, "group_size": 4},
    "trainer": {"max_steps": 4, "checkpoint_every_n_steps": 2},
    "eval_sets": {"easy": {"digits": 1, "size": 8}, "hard": {"digits": 2, "size": 8}},
    "evaluator": {"freq_steps": 2, "freq_epochs": None, "freq_secs": None, "eval_before_train": True},
    "logger": {"csv": False},
}
SUMMARY = re.compile(r"^areal-lightning: (\d+) of (\d+) rounds failed; see (.+)$", re.MULTILINE)


class BrokenScorer(RuntimeError):
    pass


def _fail_from(step: int, original: Any) -> Any:
    def evaluate(module: Any, batches: Any, ctx: Any) -> Any:
        if ctx.global_step >= step:
            raise BrokenScorer(f"the scorer broke at step {ctx.global_step}")
        return original(module, batches, ctx)

    return evaluate


def _config(tmp_path: Path) -> Path:
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump({**CONFIG, "output_dir": str(tmp_path / "run")}))
    return path


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The config of a healthy 4-step run (its checkpoints and history in `output_dir`)."""
    root = tmp_path_factory.mktemp("trained")
    config = _config(root)
    assert main(["fit", "-c", str(config)]) == 0
    return config


def test_fit_exits_1_with_one_line_when_rounds_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(GRPOModule, "evaluate", _fail_from(2, GRPOModule.evaluate))
    status = main(["fit", "-c", str(_config(tmp_path))])
    history = tmp_path / "run" / "eval_history.jsonl"
    errors = event_rows(read_history(history), "error")
    assert status == 1
    found = SUMMARY.findall(capsys.readouterr().err)
    assert found == [("2", "3", str(history))]  # rounds at steps 0, 2, 4: the last two failed
    # One error record per failed eval set, each naming its set.
    assert sorted((e["step"], e["dataset"]) for e in errors) == [(2, "easy"), (2, "hard"), (4, "easy"), (4, "hard")]


def test_a_fit_whose_first_round_fails_stops_there_and_exits_1_without_a_traceback(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(GRPOModule, "evaluate", _fail_from(0, GRPOModule.evaluate))
    with caplog.at_level(logging.ERROR, logger="areal_lightning"):
        status = main(["fit", "-c", str(_config(tmp_path))])
    history = tmp_path / "run" / "eval_history.jsonl"
    assert status == 1  # an exit status, not an exception's traceback
    assert SUMMARY.findall(capsys.readouterr().err) == [("1", "1", str(history))]  # step 0 stopped training
    for dataset in ("easy", "hard"):
        assert f"evaluation of eval set '{dataset}' at step 0 failed; training stops (the sanity pass runs" in (
            caplog.text
        )
    assert "BrokenScorer: the scorer broke at step 0" in caplog.text
    errors = event_rows(read_history(history), "error")
    assert [(e["step"], e["dataset"]) for e in errors] == [(0, "easy"), (0, "hard")]


def test_a_healthy_fit_exits_0(trained: Path) -> None:
    records = read_history(Path(yaml.safe_load(trained.read_text())["output_dir"]))  # `trained` checked the 0
    assert event_rows(records, "error") == [] and len({r["step"] for r in records}) == 3


def test_evaluate_exits_1_and_records_the_failed_round(
    trained: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(rollout_eval, "rollout_evaluate", _fail_from(0, rollout_eval.rollout_evaluate))
    ckpt = Path(yaml.safe_load(trained.read_text())["output_dir"]) / "checkpoints" / "last.ckpt"
    history = tmp_path / "evaluate.jsonl"
    status = main(["evaluate", "-c", str(trained), "--ckpt", str(ckpt), "--history", str(history)])
    assert status == 1
    assert SUMMARY.findall(capsys.readouterr().err) == [("1", "1", str(history))]
    (error,) = read_history(history)
    assert error["event"] == "error" and error["step"] == 4 and "the scorer broke" in error["message"]
    assert error["source"] == "standalone"


def test_watch_exits_1_when_a_checkpoint_failed(
    trained: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(rollout_eval, "rollout_evaluate", _fail_from(4, rollout_eval.rollout_evaluate))
    checkpoints = Path(yaml.safe_load(trained.read_text())["output_dir"]) / "checkpoints"
    watched = tmp_path / "checkpoints"
    watched.mkdir()
    for name in ("step2.ckpt", "step4.ckpt"):
        (watched / name).write_bytes((checkpoints / name).read_bytes())
    (watched / "STOP_WATCH").touch()
    history = tmp_path / "watch.jsonl"
    args = ["--watch", str(watched), "--history", str(history), "--poll-secs", "0.2"]
    status = main(["evaluate", "-c", str(trained), *args])
    out = capsys.readouterr()
    assert status == 1
    assert "1 checkpoint(s) evaluated" in out.out
    assert SUMMARY.findall(out.err) == [("1", "2", str(history))]


def _write(path: Path, records: list[dict[str, Any]]) -> Path:
    path.mkdir(parents=True)
    (path / "eval_history.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_plot_exits_2_when_there_is_nothing_to_draw(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    errors_only = _write(tmp_path / "errors", [{"event": "error", "step": s, "message": "boom"} for s in (0, 2)])
    assert main(["plot", str(errors_only)]) == 2
    assert "has no eval records" in capsys.readouterr().err
    all_null = _write(
        tmp_path / "nan",
        [{"step": s, "dataset": "easy", "metrics": {"accuracy": None, "reward/mean": 0.5}} for s in (0, 2)],
    )
    assert main(["plot", str(all_null)]) == 2
    assert "metric 'accuracy' has no finite value in any eval record" in capsys.readouterr().err
    assert not (all_null / "eval_accuracy.png").exists()
    assert main(["plot", str(all_null), "--metric", "reward/mean"]) == 0


# ---- the second command a user runs: evaluate after fit ------------------------------------------


def test_evaluate_records_the_epoch_that_training_recorded_for_the_same_weights(tmp_path: Path) -> None:
    """Lightning's checkpoint ``epoch`` counts the epochs begun: ``last.ckpt``, written when training
    ends mid-epoch, says 1 for weights trained in epoch 0."""
    config = _config(tmp_path)
    settings = yaml.safe_load(config.read_text())
    settings["trainer"]["checkpoint_every_n_steps"] = 5  # never reached: last.ckpt alone, written at the end
    config.write_text(yaml.safe_dump(settings))
    assert main(["fit", "-c", str(config)]) == 0
    run_dir = tmp_path / "run"
    training = {r["step"]: r["epoch"] for r in read_history(run_dir) if "metrics" in r}
    ckpt = run_dir / "checkpoints" / "last.ckpt"
    assert torch.load(ckpt, weights_only=True)["epoch"] == 1  # Lightning's count (the run never left epoch 0)
    history = tmp_path / "evaluate.jsonl"
    assert main(["evaluate", "-c", str(config), "--ckpt", str(ckpt), "--history", str(history)]) == 0
    assert {(r["step"], r["epoch"]) for r in read_history(history)} == {(4, training[4])} == {(4, 0)}


def test_evaluate_twice_with_the_cache_on_answers_the_second_from_the_cache(
    trained: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from areal_lightning.eval_round import round as round_module

    calls: list[str] = []
    original = round_module.evaluate_local

    def counting(module: Any, eval_set: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(eval_set.name)  # the evaluation of one eval set (the cache keys evaluate_fn, not this)
        return original(module, eval_set, *args, **kwargs)

    monkeypatch.setattr(round_module, "evaluate_local", counting)
    ckpt = Path(yaml.safe_load(trained.read_text())["output_dir"]) / "checkpoints" / "last.ckpt"
    history = tmp_path / "h.jsonl"
    args = ["evaluate", "-c", str(trained), "--ckpt", str(ckpt), "--history", str(history)]
    args += [f"output_dir={tmp_path / 'out'}", "evaluator.cache=true"]
    assert main(args) == 0 and calls == ["easy", "hard"]
    assert main(args) == 0 and calls == ["easy", "hard"]  # nothing evaluated the second time
    first, second = read_history(history)[:2], read_history(history)[2:]
    assert [r.get("cached") for r in first] == [None, None] and [r["cached"] for r in second] == [True, True]
    assert [r["metrics"] for r in second] == [r["metrics"] for r in first]
    assert [r["sampling"] for r in second] == [r["sampling"] for r in first]
    first_table = capsys.readouterr().out.split("\nappended to ")[0].splitlines()[1:]
    assert first_table[0].split() == ["metric", "easy", "hard"]
    easy = {row.split()[0]: row.split()[1] for row in first_table[1:]}  # the easy set's column
    assert re.fullmatch(r"\d+", easy["scoring/timeouts"]) and re.fullmatch(r"0\.\d{4}", easy["accuracy/ci_high"])


def test_evaluate_without_a_config_names_the_runs_own(trained: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = Path(yaml.safe_load(trained.read_text())["output_dir"])
    ckpt = run_dir / "checkpoints" / "last.ckpt"
    assert main(["evaluate", "--ckpt", str(ckpt)]) == 2
    assert capsys.readouterr().err.strip() == (
        f"areal-lightning: error: evaluate needs the config of the run (-c): fit saved it as {run_dir}/config.yaml; "
        f"run areal-lightning evaluate -c {run_dir}/config.yaml --ckpt {ckpt}"
    )
    watched = run_dir / "checkpoints"
    assert main(["evaluate", "--watch", str(watched)]) == 2  # the same for the watched directory
    assert capsys.readouterr().err.strip() == (
        f"areal-lightning: error: evaluate needs the config of the run (-c): fit saved it as {run_dir}/config.yaml; "
        f"run areal-lightning evaluate -c {run_dir}/config.yaml --watch {watched}"
    )
