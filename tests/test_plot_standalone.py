"""`areal-lightning plot` after `areal-lightning evaluate`: a run's standalone evaluations (its
run_id, ``source: "standalone"``) are rings on the run's own line, never another run: the legend,
the colours and the title stay as they were, one legend entry says what the rings are."""

from __future__ import annotations

import io
import json
import os
import sys
from pathlib import Path
from typing import Any

import matplotlib.image as mimage
import numpy as np
import pytest
from cli_server import run_cli
from procs import run_in_group

from areal_lightning.tracking.history import EvalHistory, eval_rows, read_history
from areal_lightning.tracking.records import eval_record
from areal_lightning.viz.panels import build_panels
from areal_lightning.viz.plot import build_figure
from areal_lightning.viz.runs import PlotNote, load_runs

STEPS = (0, 100, 200, 300, 400)
RING = "standalone evaluation"
EXAMPLE = Path(__file__).resolve().parents[1] / "areal_lightning" / "app" / "configs" / "arithmetic_grpo.yaml"
SMALL = [
    "trainer.max_steps=4",
    "trainer.checkpoint_every_n_steps=2",
    "trainer.enable_progress_bar=false",
    "policy.d_model=32",
    "policy.n_heads=2",
    "grpo.warmup_steps=30",
    "grpo.prompts_per_step=4",
    "grpo.group_size=4",
    "task.train_size=16",
    "eval_sets.easy.size=8",
    "eval_sets.easy.n_samples=2",
    "eval_sets.hard.size=4",
    "eval_sets.hard.n_samples=2",
    "evaluator.freq_steps=4",
    "evaluator.freq_epochs=null",
    "evaluator.freq_secs=null",
    "logger.wandb.mode=disabled",
]
TIMEOUT_S = 240


def _records(run_id: str, speed: float, source: str = "training", steps=STEPS, trigger="steps") -> list[dict]:
    out = []
    for i, step in enumerate(steps):
        for dataset, ceiling in (("easy", 0.9), ("hard", 0.3)):
            acc = ceiling * (1 - np.exp(-speed * (i + 1)))
            metrics = {"accuracy": acc, "accuracy/ci_low": acc - 0.05, "accuracy/ci_high": acc + 0.05}
            metrics["reward/mean"] = 2 * acc - 1
            out.append(
                eval_record(
                    step,
                    i,
                    dataset,
                    metrics,
                    trigger=[trigger],
                    num_samples=8,
                    num_prompts=4,
                    eval_secs=0.1,
                    mode="sync",
                    world_size=1,
                    run_id=run_id,
                    source=source,
                )
            )
    return out


def _run(root: Path, name: str, speed: float) -> Path:
    run = root / "runs" / name
    EvalHistory.in_run_dir(run).append_many(_records(f"{name}id00", speed))
    return run


def _evaluate(run: Path, steps: tuple[int, ...], speed: float = 3.0) -> None:
    """What `areal-lightning evaluate --ckpt` appends: the checkpoint's step and run id, source standalone."""
    run_id = read_history(run)[0]["run_id"]
    EvalHistory.in_run_dir(run).append_many(_records(run_id, speed, "standalone", steps, "evaluate"))


def _visible(ax: Any) -> list[tuple]:
    """What a reader tells the lines apart by: label, colour, line style, points."""
    return [
        (line.get_label(), line.get_color(), line.get_linestyle(), list(line.get_xdata()), list(line.get_ydata()))
        for line in ax.get_lines()
        if not line.get_label().startswith("_")
    ]


def _legend(ax: Any) -> list[str]:
    return [t.get_text() for t in ax.get_legend().get_texts()]


def _rings(ax: Any) -> dict[str, Any]:
    return {line.get_label(): line for line in ax.get_lines() if line.get_label().startswith("_evaluate ")}


def _load(*runs: Path) -> dict[str, list[dict]]:
    with pytest.warns(PlotNote):
        return load_runs(list(runs))


def test_an_evaluate_is_a_ring_on_its_runs_line_and_nothing_else_changes(tmp_path: Path) -> None:
    run = _run(tmp_path, "trial0", 0.8)
    before = build_figure(load_runs([run])).axes[0]
    _evaluate(run, (250,))
    _evaluate(run, (400,), speed=0.5)
    with pytest.warns(PlotNote, match=r"^run 'trial0' has standalone evaluations \(areal-lightning evaluate\) of its "):
        runs = load_runs([run])
    assert list(runs) == ["trial0"]  # one run: no "holds 2 runs", no "[<run_id> evaluate]"
    after = build_figure(runs).axes[0]
    assert after.get_title() == before.get_title() == "accuracy per eval set \u2014 trial0"
    assert _visible(after) == _visible(before)  # same lines, colours, styles and points
    assert _legend(after) == [*_legend(before), RING] == ["easy", "hard", "confidence interval", RING]
    rings = _rings(after)
    assert set(rings) == {"_evaluate easy", "_evaluate hard"}
    colours = {label: colour for label, colour, *_ in _visible(after)}
    standalone = {(r["dataset"], r["step"]): r["metrics"]["accuracy"] for r in eval_rows(runs["trial0"])}
    for dataset in ("easy", "hard"):
        ring = rings[f"_evaluate {dataset}"]
        assert list(ring.get_xdata()) == [250, 400] and ring.get_linestyle() == "None"
        assert list(ring.get_ydata()) == [standalone[(dataset, 250)], standalone[(dataset, 400)]]
        assert ring.get_markeredgecolor() == colours[dataset] and ring.get_markerfacecolor() == "none"


def test_two_runs_keep_their_legend_and_colours_when_an_evaluate_is_added(tmp_path: Path) -> None:
    mt2, mt4 = _run(tmp_path, "mt2", 0.5), _run(tmp_path, "mt4", 1.0)
    metrics = ["reward/mean", "accuracy"]  # docs/multi_turn.md's panels
    before = build_panels(load_runs([mt2, mt4]), metrics)
    _evaluate(mt4, (400,))
    runs = _load(mt2, mt4)
    assert list(runs) == ["mt2", "mt4"]
    after = build_panels(runs, metrics)
    for ax_before, ax_after in zip(before.axes, after.axes, strict=True):
        assert _visible(ax_after) == _visible(ax_before)
        assert _legend(ax_after)[: len(_legend(ax_before))] == _legend(ax_before)
        assert _legend(ax_after)[-1] == RING and "mt4 [" not in " ".join(_legend(ax_after))
        colours = {label: colour for label, colour, *_ in _visible(ax_after)}
        assert colours["mt2: easy"] != colours["mt4: easy"] == colours["mt4: hard"]
        rings = _rings(ax_after)
        assert set(rings) == {"_evaluate mt4: easy", "_evaluate mt4: hard"}
        assert {r.get_markeredgecolor() for r in rings.values()} == {colours["mt4: easy"]}
    single = build_figure(runs, "reward/mean").axes[0]
    assert single.get_title() == "reward/mean: mt2 vs mt4"


def test_a_run_that_only_a_watcher_evaluated_is_its_ringed_line(tmp_path: Path) -> None:
    run = tmp_path / "runs" / "watched"
    EvalHistory.in_run_dir(run).append_many(_records("wtch0000", 1.0, "standalone", (10, 20, 30), "watch"))
    ax = build_figure(_load(run)).axes[0]
    assert [(label, x) for label, _, _, x, _ in _visible(ax)] == [("easy", [10, 20, 30]), ("hard", [10, 20, 30])]
    assert _legend(ax) == ["easy", "hard", "confidence interval", RING]
    assert [list(r.get_xdata()) for r in _rings(ax).values()] == [[10, 20, 30], [10, 20, 30]]


def test_an_old_history_keeps_its_evaluate_with_the_run_before_it(tmp_path: Path) -> None:
    """Files from before run ids and ``source``: an evaluate's record says so by its trigger only."""
    run = tmp_path / "old"
    run.mkdir()

    def line(step: int, accuracy: float, trigger: str) -> str:
        return json.dumps({"step": step, "trigger": [trigger], "dataset": "easy", "metrics": {"accuracy": accuracy}})

    first = [line(s, s / 10, "steps") for s in (0, 5, 10)]
    second = [line(s, s / 20, "steps") for s in (0, 5)]
    (run / "eval_history.jsonl").write_text("\n".join([*first, line(10, 0.7, "evaluate"), *second]) + "\n")
    with pytest.warns(UserWarning, match=r"holds 2 runs \(old \[legacy-1\], old \[legacy-2\]\)"):
        runs = _load(run)
    ax = build_figure(runs).axes[0]
    assert [(label, x) for label, _, _, x, _ in _visible(ax)] == [
        ("old [legacy-1]: easy", [0, 5, 10]),
        ("old [legacy-2]: easy", [0, 5]),
    ]
    ((label, ring),) = _rings(ax).items()
    assert label == "_evaluate old [legacy-1]: easy"
    assert (list(ring.get_xdata()), list(ring.get_ydata())) == ([10], [0.7])


@pytest.mark.process
def test_fit_evaluate_then_plot_shows_one_run_with_its_evaluation_ringed(tmp_path: Path) -> None:
    env = dict(os.environ, WANDB_MODE="disabled")
    run = tmp_path / "runs" / "trial0"
    fit = run_cli(["fit", "-c", str(EXAMPLE), *SMALL, f"output_dir={run}"], TIMEOUT_S, tmp_path, env)
    assert fit.returncode == 0, fit.stderr[-3000:]
    ckpt = run / "checkpoints" / "step2.ckpt"  # between the training rounds (steps 0 and 4)
    done = run_cli(["evaluate", "-c", str(run / "config.yaml"), "--ckpt", str(ckpt)], TIMEOUT_S, tmp_path, env)
    assert done.returncode == 0, done.stderr[-3000:]
    records = eval_rows(read_history(run))
    assert {r["run_id"] for r in records} == {records[0]["run_id"]}
    evaluated = {r["dataset"]: r["metrics"]["accuracy"] for r in records if r["source"] == "standalone"}
    assert set(evaluated) == {"easy", "hard"}

    out = tmp_path / "figure.png"
    plot = run_in_group([sys.executable, "-m", "areal_lightning", "plot", str(run), "--out", str(out)], TIMEOUT_S)
    assert plot.returncode == 0, plot.stderr
    assert plot.stdout.strip() == str(out)
    assert plot.stderr.strip() == (
        "areal-lightning plot: note: run 'trial0' has standalone evaluations (areal-lightning evaluate) of its "
        "checkpoint at step 2: rings on the run's line, not another run"
    )
    ax = build_figure(_load(run)).axes[0]
    assert [(label, x) for label, _, _, x, _ in _visible(ax)] == [("easy", [0, 4]), ("hard", [0, 4])]
    assert _legend(ax) == ["easy", "hard", "confidence interval", RING]
    for dataset, accuracy in evaluated.items():
        ring = _rings(ax)[f"_evaluate {dataset}"]
        assert (list(ring.get_xdata()), list(ring.get_ydata())) == ([2], [accuracy])
    expected = io.BytesIO()
    ax.figure.savefig(expected, format="png")
    expected.seek(0)
    np.testing.assert_array_equal(mimage.imread(out), mimage.imread(expected, format="png"))  # the CLI drew this
