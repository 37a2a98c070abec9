"""Figures of evaluation curves drawn from eval histories."""

from areal_lightning.viz.plot import (
    DEFAULT_METRIC,
    PlotError,
    add_plot_arguments,
    build_figure,
    default_output,
    metric_names,
    plot_main,
    plot_runs,
)

__all__ = [
    "DEFAULT_METRIC",
    "PlotError",
    "add_plot_arguments",
    "build_figure",
    "default_output",
    "metric_names",
    "plot_main",
    "plot_runs",
]
