"""Config mistakes found when the config loads, before any work, in the words of the YAML keys: a
noise-aware best_rule on a metric without per-prompt outcomes, a single k for `ks`, a metric whose
k no eval set computes, a directory as a data file; and a run directory whose run died before its
first checkpoint, which `fit` does not offer to resume but says how to start again."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_server import run_cli, start_cli
from small_run import SMALL_FIT

from areal_lightning.app.config import ConfigError, load_config

EXAMPLE = Path(__file__).resolve().parents[1] / "areal_lightning" / "app" / "configs" / "arithmetic_grpo.yaml"
RUN_TIMEOUT_S = 300
NO_OUTCOMES = (
    r"evaluator.best_rule: {rule} ranks rounds by per-prompt outcomes, and the evaluation records them only for "
    r"accuracy and reward/mean; evaluator.best_metrics.{metric} has none. Name accuracy or reward/mean in "
    r"best_metrics, or use best_rule: point"
)


def _yaml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("rule", ["lcb", "paired"])
def test_a_noise_aware_best_rule_needs_a_metric_with_per_prompt_outcomes(tmp_path: Path, rule: str) -> None:
    text = f"eval_sets:\n  easy: {{digits: 1, size: 4}}\nevaluator:\n  best_rule: {rule}\n"
    text += "  best_metrics: {pass@4: max}\n"
    with pytest.raises(ConfigError, match="^" + NO_OUTCOMES.format(rule=rule, metric="pass@4") + "$"):
        load_config(_yaml(tmp_path, text))
    fine = load_config(_yaml(tmp_path, text.replace("pass@4", "accuracy")))  # outcomes recorded: accepted
    assert fine.evaluator.decisions.best_rule.value == rule
    assert load_config(_yaml(tmp_path, text.replace("pass@4: max", "reward/mean: max")))  # the other one


def test_a_single_k_is_the_list_of_one(tmp_path: Path) -> None:
    cfg = load_config(_yaml(tmp_path, "eval_sets:\n  easy: {digits: 1, size: 4, n_samples: 4, ks: 2}\n"))
    assert cfg.eval_sets["easy"].ks == [2]
    assert load_config(None, ["eval_sets.easy.size=4", "eval_sets.easy.ks=4"]).eval_sets["easy"].ks == [4]
    assert load_config(None, ["eval_sets.easy.size=4", "eval_sets.easy.ks=[1,4]"]).eval_sets["easy"].ks == [1, 4]


def test_a_metric_whose_k_no_eval_set_computes_says_which_ks_there_are(tmp_path: Path) -> None:
    text = (
        "eval_sets:\n  easy: {digits: 1, size: 4, n_samples: 8, ks: [1, 2, 8]}\n"
        "evaluator:\n  metric_thresholds: {pass@16: 0.5}\n"
    )
    with pytest.raises(ConfigError) as info:
        load_config(_yaml(tmp_path, text))
    message = str(info.value)
    assert message.startswith(
        "evaluator.metric_thresholds.pass@16 names a metric the evaluation does not log. k=16 is not among the eval "
        "sets' ks (eval_sets.easy: ks [1, 2, 8], n_samples 8), which give pass@1, pass@2, pass@8; add 16 to an eval "
        "set's ks (with n_samples >= 16)."
    )
    assert "Did you mean" not in message
    # k computed, the rest of the name wrong: the closest name, not the ks
    with pytest.raises(ConfigError, match=r"pass@8/stder names a metric .* Did you mean `pass@8/stderr`\?"):
        load_config(_yaml(tmp_path, text.replace("pass@16", "pass@8/stder")))


def test_a_directory_given_as_a_data_file_is_called_a_directory(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=rf"^eval_sets.easy.path '{tmp_path}' is a directory; give a local .jsonl"):
        load_config(None, ["eval_sets.easy.size=4", f"eval_sets.easy.path={tmp_path}"])


def _env(tmp_path: Path) -> dict[str, str]:
    return dict(os.environ, WANDB_SILENT="true", WANDB_CONFIG_DIR=str(tmp_path / "wb"), WANDB_DATA_DIR=str(tmp_path))


def _fit(tmp_path: Path, *args: str) -> list[str]:
    """`fit` of the main job, made small, into out/t (``output_dir: out/${trial_name}``, trial t)."""
    where = ["trial_name=t", "output_dir=out/${trial_name}"]
    return [sys.executable, "-m", "areal_lightning", "fit", "-c", str(EXAMPLE), *SMALL_FIT, *where, *args]


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """`_fit`'s command run to its end, forked from the fork server (tests/cli_server.py), as the
    run that is killed is (`start_cli`)."""
    return run_cli(_fit(tmp_path, *args)[3:], RUN_TIMEOUT_S, tmp_path, _env(tmp_path))


@pytest.mark.process
def test_the_cli_refuses_a_best_rule_without_outcomes_before_writing_anything(tmp_path: Path) -> None:
    done = _run(tmp_path, "evaluator.best_rule=lcb", "evaluator.best_metrics={pass@2: max}")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert NO_OUTCOMES.format(rule="lcb", metric="pass@2").replace("\\", "") in done.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.process
@pytest.mark.slow
def test_a_run_killed_before_its_first_checkpoint_says_how_to_start_again_and_that_works(tmp_path: Path) -> None:
    long = ["trainer.max_steps=1000", "trainer.checkpoint_every_n_steps=500"]
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    with start_cli(_fit(tmp_path, *long)[3:], tmp_path, _env(tmp_path), **quiet) as proc:
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while not (tmp_path / "out" / "t" / "config.yaml").is_file() and time.monotonic() < deadline:
            time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGKILL)  # as the OOM killer ends a run: no checkpoint written
        proc.wait(RUN_TIMEOUT_S)
    assert not any((tmp_path / "out" / "t").rglob("*.ckpt"))
    again = _run(tmp_path, *long)
    assert again.returncode == 2 and "Traceback" not in again.stderr
    assert "holds a run that stopped before its first checkpoint" in again.stderr and "--ckpt" not in again.stderr
    assert "pass --new-run to start the run in the next free trial directory beside it (t-1)" in again.stderr
    moved = _run(tmp_path, *long, "trainer.max_steps=2", "--new-run")  # what the message proposes
    assert moved.returncode == 0, moved.stderr[-3000:]
    assert (tmp_path / "out" / "t-1" / "checkpoints" / "last.ckpt").is_file()
