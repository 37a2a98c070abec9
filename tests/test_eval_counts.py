"""Prompts counted once, and eval prompts held out of training: built-in arithmetic eval sets are
drawn without replacement (a size above the distinct problems is refused at load, with that number),
`num_prompts` counts distinct prompts, and training never draws a prompt of an eval set."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from callback_helpers import QUIET_WARNINGS

from areal_lightning.app.builders import build_eval_sets, build_task
from areal_lightning.app.cli import main
from areal_lightning.app.config import ConfigError, load_config
from areal_lightning.tasks.arithmetic import ArithmeticTask
from areal_lightning.tracking.history import eval_rows, event_rows, read_history

pytestmark = [pytest.mark.filterwarnings(w) for w in QUIET_WARNINGS]


def test_an_eval_set_of_every_one_digit_sum_holds_each_once_and_a_larger_one_is_refused() -> None:
    task = ArithmeticTask(seed=3)
    every = task.make_samples("all", digits=1, size=100)
    assert len({s.prompt for s in every}) == 100  # with replacement, 100 draws hold about 63
    with pytest.raises(ValueError, match=r"only 100 distinct problems \(operands 0-9\); give a size from 1 to 100"):
        task.make_samples("all", digits=1, size=101)
    with pytest.raises(
        ConfigError,
        match=r"eval_sets.easy.size is 200, but there are only 100 distinct 1-digit additions, and an eval set "
        r"counts each prompt once; give a size from 1 to 100",
    ):
        load_config(None, ["eval_sets.easy.size=200", "eval_sets.easy.digits=1"])
    load_config(None, ["eval_sets.hard.size=200", "eval_sets.hard.digits=2", "eval_sets.easy.size=20"])  # 8100


def test_training_never_draws_an_eval_prompt_and_every_set_is_distinct() -> None:
    cfg = load_config(None, ["eval_sets.easy.size=20", "eval_sets.more.size=30", "eval_sets.hard.digits=2"])
    sets = {s.name: s for s in build_eval_sets(cfg)}
    assert {n: len({x.prompt for x in s.samples}) for n, s in sets.items()} == {"easy": 20, "more": 30, "hard": 200}
    held = {x.prompt for n in ("easy", "more") for x in sets[n].samples}
    train = [s.prompt for s in build_task(cfg).train_samples()]
    assert len(train) == cfg.task.train_size and not held & set(train)
    assert len(set(train)) == 100 - len(held)  # 256 draws reach every problem left for training
    shared = load_config(None, ["eval_sets.easy.size=20", "task.hold_out_eval=false"])
    assert held & {s.prompt for s in build_task(shared).train_samples()}  # not held out: the eval prompts recur
    # A null size: a fifth of the one-digit problems, the rest left for training.
    assert len(build_eval_sets(load_config(None, ["eval_sets.easy.n_samples=2"]))[0].samples) == 20


def test_eval_sets_that_hold_every_problem_out_of_training_are_refused_at_load() -> None:
    with pytest.raises(
        ConfigError,
        match=r"the eval sets of 1-digit additions \(eval_sets.easy.size=100\) hold every one of the 100 problems "
        r"out of training \(task.hold_out_eval: true\): give them smaller sizes, or set task.hold_out_eval: false",
    ):
        load_config(None, ["eval_sets.easy.size=100"])
    assert load_config(None, ["eval_sets.easy.size=100", "task.hold_out_eval=false"]).task.hold_out_eval is False


def test_a_fit_counts_distinct_prompts_and_its_integrity_checks_find_nothing(tmp_path: Path) -> None:
    config = {
        "output_dir": str(tmp_path / "run"),
        "grpo": {"warmup_steps": 0, "prompts_per_step": 4, "group_size": 2},
        "policy": {"d_model": 16, "n_layers": 1},
        "trainer": {"max_steps": 1},
        "eval_sets": {"easy": {"digits": 1, "size": 30, "n_samples": 2}},
        "evaluator": {"integrity": "fail", "eval_before_train": True},
        "logger": {"csv": False},
    }
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(config))
    assert main(["fit", "-c", str(path)]) == 0
    records = read_history(tmp_path / "run")
    assert {(r["num_prompts"], r["num_samples"]) for r in eval_rows(records)} == {(30, 60)}
    checks = [(e["check"], e["status"]) for e in event_rows(records, "integrity")]
    assert checks == [("overlap", "ok"), ("gold", "ok"), ("duplicates", "ok")]
