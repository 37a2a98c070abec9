"""Several metrics side by side, one panel each, on a shared step axis: e.g. accuracy next to the
completions' length and truncation (``areal-lightning plot RUN --metric accuracy --metric
completion/length/mean --metric completion/truncated``), where a run whose answers grow until
they hit ``max_new_tokens`` shows before its accuracy collapses."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from areal_lightning.viz.plot import (
    FIGURE_DPI,
    FIGURE_SIZE_IN,
    PlotError,
    _collect_series,
    _draw_series,
    _metric_file_part,
    _style_axes,
    runs_and_target,
)

if TYPE_CHECKING:
    from matplotlib.figure import Figure

PANEL_WIDTH_IN = 5.2
MAX_PANELS = 6
"""Metrics one figure holds, a panel each (side by side)."""


def build_panels(runs: Mapping[str, Sequence[Mapping[str, Any]]], metrics: Sequence[str]) -> Figure:
    """One panel per metric, left to right, each drawn as :func:`~areal_lightning.viz.plot.build_figure` draws one.

    Raises:
        PlotError: no metric or more than `MAX_PANELS`, a metric given twice, or one that no run has
            (named with those it has).

    Example:
        >>> recs = [{"step": s, "dataset": "easy", "metrics": {"accuracy": s / 10, "completion/truncated": 0.1}}
        ...         for s in (0, 5)]
        >>> [ax.get_ylabel() for ax in build_panels({"demo": recs}, ["accuracy", "completion/truncated"]).axes]
        ['accuracy', 'completion/truncated']
    """
    if not 1 <= len(metrics) <= MAX_PANELS:
        raise PlotError(f"plot draws 1 to {MAX_PANELS} metrics on one figure, got {len(metrics)}: {list(metrics)}")
    twice = sorted({m for m in metrics if list(metrics).count(m) > 1})
    if twice:
        raise PlotError(f"--metric {twice[0]!r} is given twice; name each metric once")
    series = [_collect_series(runs, metric) for metric in metrics]  # every metric checked before drawing

    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(PANEL_WIDTH_IN * len(metrics), FIGURE_SIZE_IN[1]), dpi=FIGURE_DPI, layout="constrained")
    FigureCanvasAgg(fig)
    run_names, single = list(runs), len(runs) == 1
    for i, (metric, found) in enumerate(zip(metrics, series, strict=True)):
        ax = fig.add_subplot(1, len(metrics), i + 1)
        _draw_series(ax, found, run_names, single)
        _style_axes(ax, metric, found, run_names, single)
        ax.set_title(metric)
    return fig


def panels_output(run_dirs: Sequence[Path], metrics: Sequence[str]) -> Path:
    """``<run>/eval_<metric>+<metric>....png`` for one run, ``compare_...`` beside the first of several."""
    part = "+".join(_metric_file_part(m) for m in metrics)
    if len(run_dirs) == 1:
        return run_dirs[0] / f"eval_{part}.png"
    return run_dirs[0].parent / f"compare_{part}.png"


def plot_panels(run_dirs: Sequence[str | Path], metrics: Sequence[str], out: str | Path | None = None) -> Path:
    """Read the runs' eval histories, draw :func:`build_panels`, save it, return the path.

    Raises:
        PlotError: as :func:`~areal_lightning.viz.plot.plot_runs`, for each metric.

    Example:
        >>> plot_panels(["runs/arith-grpo/trial0"], ["accuracy", "completion/truncated"])  # doctest: +SKIP
        PosixPath('runs/arith-grpo/trial0/eval_accuracy+completion_truncated.png')
    """
    runs, target = runs_and_target(run_dirs, out, lambda dirs: panels_output(dirs, metrics))
    fig = build_panels(runs, metrics)
    target.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(target)
    return target
