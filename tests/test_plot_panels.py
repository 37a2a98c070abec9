"""`areal-lightning plot RUN1 RUN2 --metric A --metric B`: a panel per metric on one figure, the
runs in the same colours in every panel; bad metric lists are refused with what was wrong."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from areal_lightning.app.cli import main
from areal_lightning.viz.panels import build_panels, plot_panels
from areal_lightning.viz.plot import PlotError, load_runs


def _run(root: Path, name: str, scale: float) -> Path:
    run = root / name
    run.mkdir(parents=True)
    with (run / "eval_history.jsonl").open("w") as f:
        for step in (0, 10, 20):
            metrics = {"reward/mean": scale * step / 40, "success@1": step / 40, "success@2": scale * step / 30}
            f.write(json.dumps({"step": step, "dataset": "easy", "metrics": metrics, "run_id": name}) + "\n")
    return run


def _lines(ax) -> dict[str, tuple[str, list[float]]]:
    return {line.get_label(): (line.get_color(), list(line.get_ydata())) for line in ax.get_lines()}


def test_each_metric_gets_a_panel_with_a_line_per_run(tmp_path: Path) -> None:
    mt2, mt4 = _run(tmp_path, "mt2", 1.0), _run(tmp_path, "mt4", 1.2)
    out = plot_panels([mt2, mt4], ["reward/mean", "success@2"])
    assert out == tmp_path / "compare_reward_mean+success@2.png" and out.stat().st_size > 0
    fig = build_panels(load_runs([mt2, mt4]), ["reward/mean", "success@2"])
    reward, success = fig.axes
    assert [reward.get_title(), success.get_title()] == ["reward/mean", "success@2"]
    assert _lines(reward)["mt4: easy"][1] == [0.0, 0.3, 0.6]
    assert _lines(success)["mt2: easy"][1] == pytest.approx([0.0, 1 / 3, 2 / 3])
    # A run has one colour in every panel.
    assert _lines(reward)["mt2: easy"][0] == _lines(success)["mt2: easy"][0] != _lines(success)["mt4: easy"][0]
    assert success.get_ylim() == (0.0, 1.0)  # success@t is a share


def test_the_command_takes_the_metric_flag_more_than_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    mt2, mt4 = _run(tmp_path, "mt2", 1.0), _run(tmp_path, "mt4", 1.2)
    assert main(["plot", str(mt2), str(mt4), "--metric", "reward/mean", "--metric", "success@1"]) == 0
    out = tmp_path / "compare_reward_mean+success@1.png"
    assert capsys.readouterr().out.strip() == str(out) and out.is_file()
    assert main(["plot", str(mt2), "--metric", "success@1", "--metric", "sucess@2"]) == 2
    assert (
        "no run has metric 'sucess@2'. Did you mean 'success@2' or 'success@1'? Metrics in the history: "
        "reward/mean, success@1, success@2" in capsys.readouterr().err
    )


def test_bad_metric_lists_are_refused(tmp_path: Path) -> None:
    runs = {"mt2": [{"step": 0, "dataset": "easy", "metrics": {"a": 1.0}}]}
    with pytest.raises(PlotError, match=r"^--metric 'a' is given twice; name each metric once$"):
        build_panels(runs, ["a", "a"])
    with pytest.raises(PlotError, match=r"^plot draws 1 to 6 metrics on one figure, got 0: \[\]$"):
        build_panels(runs, [])
    with pytest.raises(PlotError, match=r"^plot draws 1 to 6 metrics on one figure, got 7"):
        build_panels(runs, list("abcdefg"))
