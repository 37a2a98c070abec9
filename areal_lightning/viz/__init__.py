"""Figures of evaluation curves drawn from eval histories."""

from areal_lightning.viz.command import add_plot_arguments, plot_main
from areal_lightning.viz.panels import build_panels, plot_panels
from areal_lightning.viz.plot import (
    DEFAULT_METRIC,
    PlotError,
    build_figure,
    default_output,
    metric_names,
    plot_runs,
)
from areal_lightning.viz.runs import PlotNote, load_runs

__all__ = [
    "DEFAULT_METRIC",
    "PlotError",
    "PlotNote",
    "add_plot_arguments",
    "build_figure",
    "build_panels",
    "default_output",
    "load_runs",
    "metric_names",
    "plot_main",
    "plot_panels",
    "plot_runs",
]
