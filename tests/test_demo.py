"""`make demo`'s own command, as a user runs it in a terminal: the progress bar on, every default of
the main job's config (W&B offline, CSV, checkpoints), only the output directory moved to tmp.

It is the user's first contact with the project: every scheduled round (before training, every
100 steps, at the end) must yield metrics, `easy` accuracy (20 problems held out of training: what
the policy makes of pairs it never saw) must rise above twice chance (1 in 19 sums), no round may
fail, and the plot must be drawn. About 2-3 minutes on 2 quiet CPU cores.

The same run is the suite's one-process proof that GRPO learns: its last checkpoint, evaluated on
all 100 one-digit problems (the 80 it trained on and the 20 held out), is far above the policy it
started from (the format warm-up, which teaches no answers). One fit, read by every test here.
"""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

import lightning as L
import pytest
import yaml
from procs import on_a_terminal, round_lines_glued

from areal_lightning.app.builders import build_eval_sets, build_module
from areal_lightning.app.checkpoints import STATE_DICT_KEY, load_checkpoint, load_weights
from areal_lightning.app.config import load_config
from areal_lightning.eval_round import run_round
from areal_lightning.rl.grpo.module import GRPOModule
from areal_lightning.rl.rollout_eval import rollout_evaluate
from areal_lightning.tracking.history import eval_rows, event_rows, read_history

ROOT = Path(__file__).resolve().parents[1]
CONFIG = yaml.safe_load((ROOT / "areal_lightning" / "app" / "configs" / "arithmetic_grpo.yaml").read_text())
DEMO_TIMEOUT_S = 1500
MAX_STEPS = CONFIG["trainer"]["max_steps"]
SCHEDULED_STEPS = list(range(0, MAX_STEPS + 1, CONFIG["evaluator"]["schedule"]["freq_steps"]))
START_MAX_ACCURACY = 0.3
END_MIN_ACCURACY = 0.1  # held out: seed 1 reached 0.17-0.19 from step 200 on (README)


def demo_command() -> list[str]:
    """The `demo` target's command line in the Makefile, with `$(VENV)/bin/` as this interpreter's."""
    makefile = (ROOT / "Makefile").read_text()
    line = re.search(r"^demo:.*\n\t(?P<cmd>.+)$", makefile, re.MULTILINE)
    assert line is not None, "the Makefile has no demo target"
    argv = shlex.split(line["cmd"])
    assert argv[0] == "$(VENV)/bin/areal-lightning", argv
    return [str(Path(sys.executable).parent / "areal-lightning"), *argv[1:]]


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """(the demo's output directory, what its terminal showed), once for the module's tests."""
    out = tmp_path_factory.mktemp("make-demo") / "demo"
    status, shown = on_a_terminal([*demo_command(), f"output_dir={out}"], DEMO_TIMEOUT_S, ROOT)
    assert status == 0, shown[-3000:]
    return out, shown


@pytest.mark.slow
@pytest.mark.timeout(DEMO_TIMEOUT_S + 60)
def test_make_demo_records_every_scheduled_round_and_learns(demo: tuple[Path, str]) -> None:
    out, shown = demo
    assert "it/s" in shown or "s/it" in shown  # the progress bar was on, as in a terminal

    records = read_history(out)
    assert event_rows(records, "error") == []
    rows = eval_rows(records)
    assert SCHEDULED_STEPS[-1] == MAX_STEPS >= 400, SCHEDULED_STEPS  # rounds before, between and at the end
    for dataset in ("easy", "hard"):
        steps = sorted({r["step"] for r in rows if r["dataset"] == dataset})
        assert set(SCHEDULED_STEPS) <= set(steps), (dataset, steps)
        assert all("accuracy" in r["metrics"] for r in rows if r["dataset"] == dataset)
    easy = {r["step"]: r["metrics"]["accuracy"] for r in rows if r["dataset"] == "easy"}
    assert easy[0] <= START_MAX_ACCURACY, easy
    assert easy[max(easy)] >= END_MIN_ACCURACY, easy
    assert (out / "eval_accuracy.png").stat().st_size > 0
    assert "rounds failed" not in shown
    # What the person at the terminal read: one line per round, none glued to the progress bar, a
    # sane epoch, and no third-party noise (Lightning's tips and deprecations, see app/console.py).
    assert shown.count("evaluation at step") == len({r["step"] for r in rows}), shown[-3000:]
    assert round_lines_glued(shown) == []
    # The bar's last epoch is the end round's (49 of 8 steps each for 400 steps); no max_epochs: no "Epoch 49/-2".
    (last_epoch,) = {r["epoch"] for r in rows if r["step"] == MAX_STEPS}
    assert last_epoch > 0 and "/-2" not in shown and re.search(rf"Epoch {last_epoch}\b", shown), last_epoch
    for noise in ("litlogger", "litmodels", "LeafSpec"):
        assert noise not in shown


def _all_problems_accuracy(module: GRPOModule, cfg, step: int) -> dict[str, float]:
    (easy,) = [s for s in build_eval_sets(cfg, module.task) if s.name == "easy"]
    (result,) = run_round(module, [easy], rollout_evaluate, seed=7, global_step=step, epoch=0)
    assert result.num_prompts == 100  # every one-digit problem, each once
    return result.metrics


@pytest.mark.slow
@pytest.mark.timeout(DEMO_TIMEOUT_S + 60)
def test_the_demos_grpo_raises_accuracy_on_the_one_digit_problems_far_beyond_chance(demo: tuple[Path, str]) -> None:
    out, _ = demo
    # The demo's own config, its `easy` set widened to all 100 one-digit problems (none held out).
    cfg = load_config(out / "config.yaml", ["task.hold_out_eval=false", "eval_sets.easy.size=100"])
    L.seed_everything(cfg.seed, verbose=False)
    start = build_module(cfg)
    start.setup("fit")  # the format warm-up that `fit` runs before GRPO step 1
    assert start.warmed_up
    before = _all_problems_accuracy(start, cfg, 0)

    end = build_module(cfg)
    ckpt_path = out / "checkpoints" / "last.ckpt"
    ckpt = load_checkpoint(ckpt_path)
    assert ckpt["global_step"] == MAX_STEPS
    load_weights(end, ckpt[STATE_DICT_KEY], ckpt_path)
    after = _all_problems_accuracy(end, cfg, MAX_STEPS)

    # The format warm-up teaches no answers: chance level on 19 possible sums.
    assert before["accuracy"] < 0.1, before
    # 100 prompts (400 samples) each: the 95% Wilson intervals over prompts are disjoint with room to spare.
    assert after["accuracy/ci_low"] > before["accuracy/ci_high"] + 0.05, (before, after)
    assert after["reward/mean"] > 3 * max(before["reward/mean"], 0.02), (before, after)
