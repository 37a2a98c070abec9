"""Several metrics on one figure: a panel per metric, side by side, the runs in the same colours in
every panel (``areal-lightning plot RUN1 RUN2 --metric reward/mean --metric success@1``), as the
design document's Figure 3 sets MT2 against MT4."""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.figure import Figure

PANEL_WIDTH_IN = 5.0
PANEL_HEIGHT_IN = 4.2
MAX_PANELS = 6


def build_panels(runs: Mapping[str, Sequence[Mapping[str, Any]]], metrics: Sequence[str]) -> Figure:
    """A figure with one panel per metric in `metrics`, each drawn as `build_figure` draws one
    metric (one metric: exactly `build_figure`'s figure).

    Args:
        runs: run name -> its eval history records.
        metrics: one to `MAX_PANELS` metric names.

    Raises:
        PlotError: no metric or more than `MAX_PANELS`, a metric named twice, or a metric that no run has.

    Example:
        >>> recs = [{"step": s, "dataset": "easy", "metrics": {"a": s / 10, "b": 1.0}} for s in (0, 5)]
        >>> [ax.get_ylabel() for ax in build_panels({"demo": recs}, ["a", "b"]).axes]
        ['a', 'b']
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from areal_lightning.viz.plot import FIGURE_DPI, PlotError, _collect_series, _draw_series, _style_axes, build_figure

    if not 1 <= len(metrics) <= MAX_PANELS:
        raise PlotError(f"plot draws 1 to {MAX_PANELS} metrics on one figure, got {len(metrics)}: {list(metrics)}")
    if len(metrics) == 1:
        return build_figure(runs, metrics[0])
    twice = sorted({m for m in metrics if list(metrics).count(m) > 1})
    if twice:
        raise PlotError(f"--metric {twice[0]!r} is given twice; name each metric once")
    series = {metric: _collect_series(runs, metric) for metric in metrics}  # every metric checked before drawing
    size = (PANEL_WIDTH_IN * len(metrics), PANEL_HEIGHT_IN)
    fig = Figure(figsize=size, dpi=FIGURE_DPI, layout="constrained")
    FigureCanvasAgg(fig)
    run_names = list(runs)
    for ax, metric in zip(fig.subplots(1, len(metrics), squeeze=False)[0], metrics, strict=True):
        _draw_series(ax, series[metric], run_names, len(runs) == 1)
        _style_axes(ax, metric, series[metric], run_names, len(runs) == 1)
        ax.set_title(metric)
    return fig


class MetricsAction(argparse.Action):
    """``--metric`` given once keeps its name (a string); given again, the names so far become a list."""

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: str | None = None) -> None:
        current = getattr(namespace, self.dest)
        if current is self.default:
            setattr(namespace, self.dest, values)
        else:
            setattr(namespace, self.dest, [*([current] if isinstance(current, str) else current), values])
