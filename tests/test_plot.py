"""`areal-lightning plot`: the two figures of the seed, drawn from real eval histories."""

from __future__ import annotations

import argparse
import io
import json
import math
from pathlib import Path

import matplotlib.colors as mcolors
import matplotlib.image as mimage
import numpy as np
import pytest

from areal_lightning.tracking.history import (
    HISTORY_FILENAME,
    EvalHistory,
    read_history,
)
from areal_lightning.tracking.records import eval_record, event_record
from areal_lightning.viz.command import add_plot_arguments, plot_main
from areal_lightning.viz.plot import (
    FIGURE_DPI,
    FIGURE_SIZE_IN,
    PlotError,
    build_figure,
    load_runs,
    plot_runs,
    run_names,
)
from areal_lightning.viz.runs import PlotNote

STEPS = [0, 100, 200, 300, 400]
EVAL_SETS = {"easy": (0.05, 0.95), "hard": (0.02, 0.25)}  # start and ceiling of accuracy
PROMPTS = 200
Z95 = 1.959963984540054


def _wilson(p: float, n: int) -> tuple[float, float]:
    """Reference Wilson interval, written out from its textbook formula."""
    denom = 1 + Z95**2 / n
    centre = (p + Z95**2 / (2 * n)) / denom
    half = Z95 * math.sqrt(p * (1 - p) / n + Z95**2 / (4 * n * n)) / denom
    return centre - half, centre + half


def _accuracy(speed: float, dataset: str, round_: int) -> float:
    start, ceiling = EVAL_SETS[dataset]
    return start + (ceiling - start) * (1 - math.exp(-speed * round_))


def _write_run(run_dir: Path, speed: float) -> None:
    """Five eval rounds of two eval sets, as the evaluation callback writes them."""
    history = EvalHistory.in_run_dir(run_dir)
    for round_, step in enumerate(STEPS):
        records = []
        for dataset in EVAL_SETS:
            acc = _accuracy(speed, dataset, round_)
            low, high = _wilson(acc, PROMPTS)
            metrics = {
                "accuracy": acc,
                "accuracy/ci_low": low,
                "accuracy/ci_high": high,
                "reward/mean": 2 * acc - 1,
                "pass@4": min(1.0, 1.3 * acc),
            }
            records.append(
                eval_record(
                    step,
                    round_,
                    dataset,
                    metrics,
                    trigger=["steps"],
                    num_samples=4 * PROMPTS,
                    num_prompts=PROMPTS,
                    eval_secs=1.5,
                    mode="sync",
                    world_size=2,
                )
            )
        history.append_many(records)
    history.append(event_record("alert", STEPS[-1], dataset="easy", message="accuracy >= 0.7"))


@pytest.fixture()
def runs(tmp_path: Path) -> dict[str, Path]:
    """Two runs side by side, as when comparing two training configurations."""
    dirs = {"mt2": tmp_path / "runs" / "mt2", "mt4": tmp_path / "runs" / "mt4"}
    _write_run(dirs["mt2"], speed=0.7)
    _write_run(dirs["mt4"], speed=1.0)
    return dirs


def _band_bounds(collection) -> tuple[np.ndarray, np.ndarray]:
    """Lowest and highest y of a fill_between band at each x."""
    vertices = collection.get_paths()[0].vertices
    xs = np.unique(vertices[:, 0])
    lows = np.array([vertices[vertices[:, 0] == x, 1].min() for x in xs])
    highs = np.array([vertices[vertices[:, 0] == x, 1].max() for x in xs])
    return lows, highs


def _assert_png(path: Path, run_dirs: list[Path], metric: str = "accuracy") -> None:
    """The file is the figure of `metric` for `run_dirs` (pixel for pixel), at the documented size."""
    image = mimage.imread(path)
    width, height = FIGURE_SIZE_IN
    assert image.shape[:2] == (round(height * FIGURE_DPI), round(width * FIGURE_DPI))
    expected = io.BytesIO()
    build_figure(load_runs(run_dirs), metric).savefig(expected, format="png")
    expected.seek(0)
    np.testing.assert_array_equal(image, mimage.imread(expected, format="png"))
    assert image[..., :3].std() > 0.05  # and it is not a blank canvas


def test_one_run_draws_a_line_and_a_wilson_band_per_eval_set(runs: dict[str, Path]) -> None:
    fig = build_figure({"mt2": read_history(runs["mt2"])})
    (ax,) = fig.axes
    lines = ax.get_lines()
    assert [line.get_label() for line in lines] == ["easy", "hard"]
    for line, dataset in zip(lines, EVAL_SETS, strict=True):
        np.testing.assert_array_equal(line.get_xdata(), STEPS)
        np.testing.assert_allclose(line.get_ydata(), [_accuracy(0.7, dataset, i) for i in range(5)])
    assert len(ax.collections) == 2
    for band, line, dataset in zip(ax.collections, lines, EVAL_SETS, strict=True):
        expected = [_wilson(_accuracy(0.7, dataset, i), PROMPTS) for i in range(5)]
        lows, highs = _band_bounds(band)
        np.testing.assert_allclose(lows, [lo for lo, _ in expected])
        np.testing.assert_allclose(highs, [hi for _, hi in expected])
        # a band has its line's colour
        assert mcolors.same_color(band.get_facecolor()[0][:3], line.get_color())
    assert lines[0].get_color() != lines[1].get_color()
    assert ax.get_ylim() == (0.0, 1.0)
    assert "mt2" in ax.get_title() and "accuracy" in ax.get_title()
    assert ax.get_xlabel() == "global step of evaluated weights" and ax.get_ylabel() == "accuracy"
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == ["easy", "hard", "confidence interval"]


def test_several_runs_draw_a_line_per_run_and_eval_set(runs: dict[str, Path]) -> None:
    fig = build_figure({name: read_history(d) for name, d in runs.items()})
    (ax,) = fig.axes
    lines = ax.get_lines()
    assert [line.get_label() for line in lines] == ["mt2: easy", "mt2: hard", "mt4: easy", "mt4: hard"]
    assert len(ax.collections) == 4
    np.testing.assert_allclose(lines[3].get_ydata(), [_accuracy(1.0, "hard", i) for i in range(5)])
    # colour tells runs apart, line style tells eval sets apart
    assert lines[0].get_color() == lines[1].get_color() != lines[2].get_color()
    assert lines[0].get_linestyle() != lines[1].get_linestyle()
    assert lines[0].get_linestyle() == lines[2].get_linestyle()
    assert ax.get_title() == "accuracy: mt2 vs mt4"


def test_reward_comparison_has_no_band_and_free_y_axis(runs: dict[str, Path]) -> None:
    fig = build_figure({name: read_history(d) for name, d in runs.items()}, metric="reward/mean")
    (ax,) = fig.axes
    assert len(ax.get_lines()) == 4 and len(ax.collections) == 0
    # The y axis fits the data (rewards go negative: not squeezed into [0, 1]) with matplotlib's margin.
    values = [2 * _accuracy(speed, d, i) - 1 for speed in (0.7, 1.0) for d in EVAL_SETS for i in range(len(STEPS))]
    lo, hi = min(values), max(values)
    margin = ax.margins()[1] * (hi - lo)
    assert ax.get_ylim() == pytest.approx((lo - margin, hi + margin))
    assert ax.get_ylabel() == "reward/mean"


def test_plot_runs_saves_pngs_at_the_default_places(runs: dict[str, Path]) -> None:
    one = plot_runs([runs["mt2"]])
    assert one == runs["mt2"] / "eval_accuracy.png"
    _assert_png(one, [runs["mt2"]])
    both = plot_runs([runs["mt2"], runs["mt4"]], metric="reward/mean")
    assert both == runs["mt2"].parent / "compare_reward_mean.png"
    _assert_png(both, [runs["mt2"], runs["mt4"]], "reward/mean")
    pass_k = plot_runs([str(runs["mt4"])], metric="pass@4")
    assert pass_k.name == "eval_pass@4.png"
    _assert_png(pass_k, [runs["mt4"]], "pass@4")


def test_plot_runs_writes_where_told(runs: dict[str, Path], tmp_path: Path) -> None:
    out = plot_runs(list(runs.values()), out=tmp_path / "report" / "fig.pdf")
    assert out == tmp_path / "report" / "fig.pdf"
    assert out.read_bytes().startswith(b"%PDF")


def test_run_names_collide_then_parent_is_added(tmp_path: Path) -> None:
    _write_run(tmp_path / "lr3e-4" / "trial0", speed=0.7)
    _write_run(tmp_path / "lr1e-3" / "trial0", speed=1.0)
    out = plot_runs([tmp_path / "lr3e-4" / "trial0", tmp_path / "lr1e-3" / "trial0"])
    assert out == tmp_path / "lr3e-4" / "compare_accuracy.png"
    _assert_png(out, [tmp_path / "lr3e-4" / "trial0", tmp_path / "lr1e-3" / "trial0"])
    assert run_names([Path("a/lr3e-4/trial0"), Path("a/lr1e-3/trial0"), Path("a/b/trial1")]) == [
        "lr3e-4/trial0",
        "lr1e-3/trial0",
        "trial1",
    ]
    assert run_names([Path("x/b/t"), Path("y/b/t")]) == ["x/b/t", "y/b/t"]  # still equal: full path


def test_truncated_last_line_plots_what_is_whole_and_warns_once(runs: dict[str, Path]) -> None:
    path = runs["mt2"] / HISTORY_FILENAME
    lines = path.read_text().splitlines()
    # drop the alert and cut the last round's "hard" record in half
    path.write_text("\n".join(lines[:-2]) + "\n" + lines[-2][:50])
    with pytest.warns(UserWarning, match="unfinished last line") as caught:
        fig = build_figure({"mt2": read_history(runs["mt2"])})
        plot_runs([runs["mt2"]])  # the PNG is drawn too
    assert len([w for w in caught if "unfinished" in str(w.message)]) == 2  # once per read
    easy, hard = fig.axes[0].get_lines()
    assert len(easy.get_xdata()) == 5 and len(hard.get_xdata()) == 4


def test_null_values_leave_a_gap_and_a_step_evaluated_twice_keeps_the_later(tmp_path: Path) -> None:
    history = EvalHistory.in_run_dir(tmp_path / "run")
    kwargs = dict(trigger=["steps"], num_samples=4, num_prompts=1, eval_secs=0.1, mode="sync", world_size=1)
    history.append(eval_record(0, 0, "easy", {"accuracy": 0.1}, **kwargs))
    history.append(eval_record(10, 0, "easy", {"accuracy": float("nan")}, **kwargs))
    history.append(eval_record(20, 0, "easy", {"accuracy": 0.3}, **kwargs))
    history.append(eval_record(20, 0, "easy", {"accuracy": 0.4}, **kwargs))  # resumed, re-evaluated
    (line,) = build_figure({"run": read_history(history.path)}).axes[0].get_lines()
    np.testing.assert_array_equal(line.get_xdata(), [0, 10, 20])
    np.testing.assert_array_equal(line.get_ydata(), [0.1, np.nan, 0.4])


def test_a_run_without_the_metric_is_left_out_with_a_warning(runs: dict[str, Path]) -> None:
    other = [{"step": 0, "dataset": "easy", "metrics": {"loss": 1.0}}]
    with pytest.warns(UserWarning, match="run 'other' has no metric 'accuracy'; it is left out"):
        fig = build_figure({"mt2": read_history(runs["mt2"]), "other": other})
    assert len(fig.axes[0].get_lines()) == 2


def test_errors_name_what_was_wrong_and_what_is_accepted(runs: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(PlotError, match=r"directory '.*nope' does not exist; pass the output_dir"):
        plot_runs([tmp_path / "nope"])
    (tmp_path / "bare").mkdir()
    with pytest.raises(PlotError, match=r"'.*bare' has no eval_history.jsonl; pass the output_dir"):
        plot_runs([tmp_path / "bare"])
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / HISTORY_FILENAME).write_text("")
    with pytest.raises(PlotError, match=r"has no eval records \(it is empty or holds only alerts"):
        plot_runs([tmp_path / "empty"])
    EvalHistory.in_run_dir(tmp_path / "alerts").append(event_record("error", 0, message="oom"))
    with pytest.raises(PlotError, match="has no eval records"):
        plot_runs([tmp_path / "alerts"])
    with pytest.raises(PlotError, match=r"is not a directory; pass the output_dir"):
        plot_runs([runs["mt2"] / HISTORY_FILENAME])
    with pytest.raises(
        PlotError,
        match=r"no run has metric 'acuracy'. Did you mean 'accuracy'\? Metrics in the history: "
        r"accuracy, pass@4, reward/mean$",
    ):
        plot_runs([runs["mt2"]], metric="acuracy")
    with pytest.raises(PlotError, match=r"is given twice; pass each run once"):
        plot_runs([runs["mt2"], runs["mt2"].parent / ".." / "runs" / "mt2"])
    with pytest.raises(PlotError, match=r"plot --out 'x.jpg' must end in one of .png, .pdf, .svg"):
        plot_runs([runs["mt2"]], out="x.jpg")
    with pytest.raises(PlotError, match="at least one run directory, got none"):
        plot_runs([])
    with pytest.raises(PlotError, match=r"build_figure\(runs=...\) needs at least one run"):
        build_figure({})
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / HISTORY_FILENAME).write_text("{bad\n" + json.dumps({"step": 0}) + "\n")
    with pytest.raises(PlotError, match="line 1 is not valid JSON"):
        plot_runs([tmp_path / "broken"])


def _cli(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="areal-lightning plot")
    add_plot_arguments(parser)
    return parser.parse_args(argv)


def test_cli_prints_the_path_or_the_error_with_status_2(
    runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = str(tmp_path / "p.png")
    args = _cli([str(runs["mt2"]), str(runs["mt4"]), "--metric", "pass@4", "--out", out])
    assert (args.metric, args.out) == (["pass@4"], str(tmp_path / "p.png"))
    assert plot_main(args) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "p.png")
    _assert_png(tmp_path / "p.png", [runs["mt2"], runs["mt4"]], "pass@4")

    # A run's history file named in place of its directory: that run, its figure beside the file.
    assert plot_main(_cli([str(runs["mt2"] / HISTORY_FILENAME), "--metric", "pass@4"])) == 0
    assert capsys.readouterr().out.strip() == str(runs["mt2"] / "eval_pass@4.png")

    assert plot_main(_cli([str(tmp_path / "missing")])) == 2
    err = capsys.readouterr().err
    assert err.startswith("areal-lightning plot: error: run directory") and "does not exist" in err

    assert plot_main(_cli([str(runs["mt2"]), "--metric", "nope"])) == 2
    assert "Metrics in the history: accuracy, pass@4, reward/mean" in capsys.readouterr().err

    path = runs["mt4"] / HISTORY_FILENAME
    path.write_text(path.read_text() + '{"step": 5')
    assert plot_main(_cli([str(runs["mt4"])])) == 0
    captured = capsys.readouterr()
    assert captured.err.count("areal-lightning plot: warning:") == 1
    assert "unfinished last line" in captured.err
    assert captured.out.strip() == str(runs["mt4"] / "eval_accuracy.png")  # no --metric: accuracy


def _round(step: int, accuracy: float, run_id: str | None, source: str = "training") -> dict:
    return eval_record(
        step,
        0,
        "easy",
        {"accuracy": accuracy},
        trigger=["steps"],
        num_samples=8,
        num_prompts=2,
        eval_secs=0.1,
        mode="sync",
        world_size=1,
        run_id=run_id,
        source=source,
    )


def test_a_history_with_two_runs_is_drawn_as_two_runs_with_a_note(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "runs" / "trial0"
    history = EvalHistory.in_run_dir(run_dir)
    # Run a: killed after evaluating steps 10 and 12, resumed from its checkpoint of step 5,
    # evaluated 10 again, then 15.
    history.append_many(
        [
            _round(0, 0.1, "aaaa1111"),
            _round(5, 0.2, "aaaa1111"),
            _round(10, 0.9, "aaaa1111"),
            _round(12, 0.95, "aaaa1111"),
        ]
    )
    history.append(event_record("resume", 5, message="resumed", run_id="aaaa1111"))
    history.append_many([_round(10, 0.3, "aaaa1111"), _round(15, 0.4, "aaaa1111")])
    # Run b in the same file, and a standalone evaluation of run a's checkpoint of step 15.
    history.append_many([_round(0, 0.5, "bbbb2222"), _round(5, 0.6, "bbbb2222")])
    history.append(_round(15, 0.45, "aaaa1111", source="standalone"))

    with pytest.warns(UserWarning, match="holds 2 runs"), pytest.warns(PlotNote, match="at step 15"):
        runs = load_runs([run_dir])
    assert list(runs) == ["trial0 [aaaa1111]", "trial0 [bbbb2222]"]  # the evaluate is run a's, not a third run
    lines = {line.get_label(): line for line in build_figure(runs).axes[0].get_lines()}
    assert set(lines) == {"trial0 [aaaa1111]: easy", "trial0 [bbbb2222]: easy", "_evaluate trial0 [aaaa1111]: easy"}
    # Run a: one point per step, the dead session's steps 10 and 12 superseded; never merged with run b.
    np.testing.assert_array_equal(lines["trial0 [aaaa1111]: easy"].get_xdata(), [0, 5, 10, 15])
    np.testing.assert_allclose(lines["trial0 [aaaa1111]: easy"].get_ydata(), [0.1, 0.2, 0.3, 0.4])
    np.testing.assert_allclose(lines["trial0 [bbbb2222]: easy"].get_ydata(), [0.5, 0.6])
    # The evaluation is a ring in run a's colour at the checkpoint's step.
    ring = lines["_evaluate trial0 [aaaa1111]: easy"]
    assert (list(ring.get_xdata()), list(ring.get_ydata())) == ([15], [0.45])
    assert ring.get_markeredgecolor() == lines["trial0 [aaaa1111]: easy"].get_color() and ring.get_linestyle() == "None"

    assert plot_main(_cli([str(run_dir)])) == 0
    captured = capsys.readouterr()
    assert captured.out.strip() == str(run_dir / "eval_accuracy.png")
    assert (
        f"areal-lightning plot: warning: {str(run_dir)!r} holds 2 runs (trial0 [aaaa1111], trial0 [bbbb2222])"
        in captured.err
    )
    assert (
        "areal-lightning plot: note: run 'trial0 [aaaa1111]' has standalone evaluations (areal-lightning evaluate) "
        "of its checkpoint at step 15: rings on the run's line, not another run" in captured.err
    )
    _assert_png(run_dir / "eval_accuracy.png", [run_dir])


def test_an_old_history_with_two_runs_appended_is_drawn_as_two_runs(tmp_path: Path) -> None:
    run_dir = tmp_path / "old"
    history = EvalHistory.in_run_dir(run_dir)
    history.append_many([_round(s, s / 10, None) for s in (0, 5, 10)] + [_round(s, s / 20, None) for s in (0, 5)])
    with pytest.warns(UserWarning, match=r"holds 2 runs \(old \[legacy-1\], old \[legacy-2\]\)"):
        runs = load_runs([run_dir])
    lines = build_figure(runs).axes[0].get_lines()
    assert [(line.get_label(), list(line.get_xdata())) for line in lines] == [
        ("old [legacy-1]: easy", [0, 5, 10]),
        ("old [legacy-2]: easy", [0, 5]),
    ]
