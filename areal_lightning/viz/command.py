"""``areal-lightning plot``: its arguments and what it runs."""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

from areal_lightning.tracking.history import HISTORY_FILENAME
from areal_lightning.viz.panels import plot_panels
from areal_lightning.viz.plot import DEFAULT_METRIC, PlotError, plot_runs
from areal_lightning.viz.runs import PlotNote


def add_plot_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``RUN_DIR [RUN_DIR ...] [--metric NAME ...] [--out FILE]`` to the ``plot`` subcommand."""
    parser.add_argument(
        "run_dirs",
        nargs="+",
        metavar="RUN_DIR",
        help=f"run output directories, each holding {HISTORY_FILENAME} (or that file itself)",
    )
    parser.add_argument(
        "--metric",
        action="append",
        help="metric to draw, e.g. accuracy, pass@4, completion/truncated, or a group: accuracy/bucket "
        f"(default: {DEFAULT_METRIC}); repeat it for one panel per metric, side by side",
    )
    parser.add_argument(
        "--out",
        default=None,
        metavar="FILE",
        help="output image (.png, .pdf, .svg); default: RUN_DIR/eval_<metric>.png "
        "for one run, compare_<metric>.png beside the first run for several",
    )


def plot_main(args: argparse.Namespace) -> int:
    """Run ``areal-lightning plot``: one metric's figure (`plot_runs`) or a panel per metric
    (`plot_panels`); print the saved path, return 0; or print why, return 2. Warnings and notes
    (`PlotNote`: what the figure's rings are) go to stderr, before the path."""
    # A run's eval_history.jsonl named in place of its directory is that run (the user's spelling).
    run_dirs = [d.parent if d.name == HISTORY_FILENAME and d.is_file() else d for d in map(Path, args.run_dirs)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            metrics = args.metric or [DEFAULT_METRIC]
            if len(metrics) == 1:
                path = plot_runs(run_dirs, metric=metrics[0], out=args.out)
            else:
                path = plot_panels(run_dirs, metrics, out=args.out)
        except PlotError as err:
            status, message = 2, f"areal-lightning plot: error: {err}"
        else:
            status, message = 0, str(path)
    for warning in caught:
        kind = "note" if issubclass(warning.category, PlotNote) else "warning"
        print(f"areal-lightning plot: {kind}: {warning.message}", file=sys.stderr)
    print(message, file=sys.stderr if status else sys.stdout)
    return status
