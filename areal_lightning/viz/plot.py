"""Eval curves from eval histories: ``areal-lightning plot RUN_DIR [RUN_DIR ...]``.

One run: the metric of each eval set over training steps (a line per eval set). Several runs:
the metric across runs (a line per run and eval set; colour = run, line style = eval set). Runs
are told apart by ``run_id`` (`viz.runs`): a directory whose history holds several runs is drawn
as several runs, with a printed warning. A run's standalone evaluations (``areal-lightning
evaluate`` of its checkpoints: ``source: "standalone"``, the run's ``run_id``) are rings on the
run's own line, in its colour, under one legend entry: never another run, another colour or
another line's label.
Where a history has ``<metric>/ci_low`` and ``<metric>/ci_high`` (our accuracy metric logs its
Wilson interval there) the interval is a shaded band around the line.

Drawing uses matplotlib's object API with the Agg canvas, so it works without a display and
never touches pyplot's global state.
"""

from __future__ import annotations

import difflib
import math
import re
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # matplotlib loads when a figure is drawn: `areal-lightning fit` parses its arguments without it
    from matplotlib.figure import Figure

from areal_lightning.tracking.history import eval_rows, is_standalone
from areal_lightning.tracking.writable import option_problem
from areal_lightning.viz.metric_groups import group_records
from areal_lightning.viz.runs import PlotError as PlotError, load_runs as load_runs, run_names as run_names

DEFAULT_METRIC = "accuracy"
CI_LOW_SUFFIX = "/ci_low"
CI_HIGH_SUFFIX = "/ci_high"
FIGURE_SIZE_IN = (8.0, 4.8)
FIGURE_DPI = 150
BAND_ALPHA = 0.18
LINE_WIDTH = 1.8
MARKER_SIZE = 5.5
MAX_MARKERS = 30
SAVE_FORMATS = (".png", ".pdf", ".svg")
# Above this many legend entries the legend moves outside the axes, so it hides no data.
LEGEND_INSIDE_MAX = 6
# Runs named in a comparison's title before it says "N runs" instead.
TITLE_MAX_RUNS = 3
X_LABEL = "global step of evaluated weights"
PALETTE_SIZE = 10
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
# A standalone evaluation: an open ring around the point, in the colour of its run's line.
STANDALONE_MARKER = "o"
STANDALONE_MARKER_SIZE = 2 * MARKER_SIZE
STANDALONE_EDGE_WIDTH = 1.6
STANDALONE_LABEL = "standalone evaluation"
"""The legend entry of the rings; each ring's own label is hidden (``_evaluate <line label>``)."""
LINE_STYLES = ("-", "--", ":", "-.")
# Metrics that live in [0, 1]; their y axis is fixed to [0, 1] so curves from runs compare at a
# glance. Matched against the metric name or its last "/" component.
UNIT_INTERVAL_METRIC = re.compile(
    r"(accuracy|acc|(pass|maj|best|mean|worst|success)@\d+|pass\^\d+|success_rate|zero_std_frac(tion)?|truncated|stopped|no_answer)"
)


@dataclass(frozen=True)
class Series:
    """One curve: a metric of one eval set of one run over steps (NaN where missing); `standalone`:
    the run's standalone evaluations of that eval set (drawn as rings), not its training rounds."""

    run: str
    dataset: str
    steps: np.ndarray
    values: np.ndarray
    ci_low: np.ndarray | None
    ci_high: np.ndarray | None
    standalone: bool = False


def _as_float(value: Any) -> float:
    """History values are numbers or null (NaN written by the trainer)."""
    return math.nan if value is None else float(value)


def metric_names(records: Sequence[Mapping[str, Any]]) -> list[str]:
    """The plottable metric names in eval records, sorted (the ``/ci_*`` bounds left out)."""
    names = {k for r in eval_rows(records) for k in r.get("metrics", {})}
    return sorted(n for n in names if not n.endswith((CI_LOW_SUFFIX, CI_HIGH_SUFFIX)))


def metric_series(
    run: str, records: Sequence[Mapping[str, Any]], metric: str, *, standalone: bool = False
) -> list[Series]:
    """A :class:`Series` per eval set that has ``metric``, eval sets in first-seen order.

    Where a step appears twice for one eval set (e.g. a resumed run evaluated it again) the
    later record wins, as it is the one the run went on from.
    """
    by_dataset: dict[str, dict[int, Mapping[str, Any]]] = {}
    for row in eval_rows(records):
        metrics = row.get("metrics", {})
        if metric in metrics:
            by_dataset.setdefault(str(row.get("dataset")), {})[int(row["step"])] = metrics
    series = []
    for dataset, rows in by_dataset.items():
        steps = sorted(rows)
        values = np.array([_as_float(rows[s][metric]) for s in steps])
        low_key, high_key = metric + CI_LOW_SUFFIX, metric + CI_HIGH_SUFFIX
        has_ci = any(low_key in rows[s] and high_key in rows[s] for s in steps)
        low = np.array([_as_float(rows[s].get(low_key)) for s in steps]) if has_ci else None
        high = np.array([_as_float(rows[s].get(high_key)) for s in steps]) if has_ci else None
        series.append(Series(run, dataset, np.array(steps), values, low, high, standalone))
    return series


def _is_unit_interval(metric: str, series: Sequence[Series]) -> bool:
    """Fix y to [0, 1] for a known [0, 1] metric whose values do lie there."""
    last = metric.rsplit("/", 1)[-1]
    if not (UNIT_INTERVAL_METRIC.fullmatch(metric) or UNIT_INTERVAL_METRIC.fullmatch(last)):
        return False
    arrays = [a for s in series for a in (s.values, s.ci_low, s.ci_high) if a is not None]
    finite = np.concatenate([a[np.isfinite(a)] for a in arrays]) if arrays else np.array([])
    return bool(finite.size == 0 or (finite.min() >= 0.0 and finite.max() <= 1.0))


def _title(metric: str, runs: Sequence[str]) -> str:
    if len(runs) == 1:
        return f"{metric} per eval set \u2014 {runs[0]}"
    if len(runs) <= TITLE_MAX_RUNS:
        return f"{metric}: " + " vs ".join(runs)
    return f"{metric} across {len(runs)} runs"


def build_figure(runs: Mapping[str, Sequence[Mapping[str, Any]]], metric: str = DEFAULT_METRIC) -> Figure:
    """Draw ``metric`` over steps for one run (a line per eval set) or several (per run, eval set).

    Args:
        runs: run name -> its eval history records (as :func:`read_history` returns them).
        metric: a key of the records' ``"metrics"``, e.g. ``"accuracy"`` or ``"reward/mean"``.

    Returns:
        The Figure (Agg canvas attached): one Axes; a line labelled ``dataset`` (one run) or
        ``"run: dataset"`` (several) per series; a shaded band per series with a CI. A run's
        standalone evaluations (`is_standalone`) are rings in its line's colour, labelled
        ``"_evaluate <label>"`` (hidden), under one legend entry ``standalone evaluation``.

    Raises:
        PlotError: no runs, a run without eval records, no run has ``metric``, or it has no
            finite value anywhere.

    Example:
        >>> recs = [{"step": s, "dataset": "easy", "metrics": {"accuracy": s / 10}} for s in (0, 5)]
        >>> [l.get_label() for l in build_figure({"demo": recs}).axes[0].get_lines()]
        ['easy']
    """
    all_series = _collect_series(runs, metric)

    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=FIGURE_SIZE_IN, dpi=FIGURE_DPI, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    run_names = list(runs)
    single = len(runs) == 1
    _draw_series(ax, all_series, run_names, single)
    _style_axes(ax, metric, all_series, run_names, single)
    return fig


def _collect_series(runs: Mapping[str, Sequence[Mapping[str, Any]]], metric: str) -> list[Series]:
    """Every run's series of `metric`; a `PlotError` when there is nothing to draw."""
    if not runs:
        raise PlotError("build_figure(runs=...) needs at least one run, got none")
    for name, records in runs.items():
        if not eval_rows(records):
            raise PlotError(f"run {name!r} has no eval records (only alerts / errors, or none)")
    training: list[Series] = []
    standalone: list[Series] = []
    for name, records in runs.items():
        of_training = _series_of(name, [r for r in records if not is_standalone(r)], metric, standalone=False)
        of_standalone = _series_of(name, [r for r in records if is_standalone(r)], metric, standalone=True)
        if not (of_training or of_standalone) and len(runs) > 1:
            warnings.warn(
                f"run {name!r} has no metric {metric!r}; it is left out of the figure", UserWarning, stacklevel=3
            )
        training.extend(of_training)
        standalone.extend(of_standalone)
    # Training lines first: an eval set's colour and line style do not change when an evaluate is added.
    all_series = training + standalone
    if not all_series:
        available = sorted({m for records in runs.values() for m in metric_names(records)})
        close = difflib.get_close_matches(metric, available, n=3, cutoff=0.6)
        hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
        raise PlotError(
            f"no run has metric {metric!r}.{hint} Metrics in the history: {', '.join(available) or '(none)'}"
        )
    if not any(np.isfinite(s.values).any() for s in all_series):
        raise PlotError(
            f"metric {metric!r} has no finite value in any eval record (every one is null: NaN); nothing to draw"
        )
    return all_series


def _series_of(name: str, records: Sequence[Mapping[str, Any]], metric: str, *, standalone: bool) -> list[Series]:
    """`metric`'s series in `records`, or its group's (`group_records`) where it is not a metric."""
    return metric_series(name, records, metric, standalone=standalone) or metric_series(
        name, group_records(records, metric), metric, standalone=standalone
    )


def _draw_series(ax: Any, all_series: Sequence[Series], run_names: list[str], single: bool) -> None:
    """A line (and a band where there is a CI) per series: colour per eval set (one run) or per run.
    Standalone evaluations are rings on their run's line; where the run has no training line of
    the eval set (e.g. only `evaluate --watch` evaluated it), they are that line, ringed."""
    datasets = list(dict.fromkeys(s.dataset for s in all_series))
    palette = [f"C{i}" for i in range(PALETTE_SIZE)]  # matplotlib's default colour cycle
    lined = {(s.run, s.dataset) for s in all_series if not s.standalone}
    for s in all_series:
        d_index, r_index = datasets.index(s.dataset), run_names.index(s.run)
        color = palette[(d_index if single else r_index) % len(palette)]
        style = "-" if single else LINE_STYLES[d_index % len(LINE_STYLES)]
        marker = MARKERS[d_index % len(MARKERS)]
        label = s.dataset if single else f"{s.run}: {s.dataset}"
        if s.standalone:
            _draw_rings(ax, s, color, label)
            if (s.run, s.dataset) in lined:
                continue
        # A marker per eval round, thinned on long runs so the line stays readable.
        every = max(1, math.ceil(len(s.steps) / MAX_MARKERS))
        ax.plot(
            s.steps,
            s.values,
            color=color,
            linestyle=style,
            marker=marker,
            label=label,
            linewidth=LINE_WIDTH,
            markersize=MARKER_SIZE,
            markevery=every,
            markeredgecolor="white",
            markeredgewidth=0.7,
            clip_on=False,
            zorder=3,
        )
        if s.ci_low is not None and s.ci_high is not None:
            ax.fill_between(
                s.steps, s.ci_low, s.ci_high, color=color, alpha=BAND_ALPHA, linewidth=0, label=f"_ci {label}", zorder=2
            )


def _draw_rings(ax: Any, s: Series, color: str, label: str) -> None:
    """A ring around each of `s`'s points (standalone evaluations), above the line's own markers."""
    ax.plot(
        s.steps,
        s.values,
        linestyle="none",
        marker=STANDALONE_MARKER,
        markersize=STANDALONE_MARKER_SIZE,
        markerfacecolor="none",
        markeredgecolor=color,
        markeredgewidth=STANDALONE_EDGE_WIDTH,
        label=f"_evaluate {label}",
        clip_on=False,
        zorder=4,
    )


def _style_axes(ax: Any, metric: str, all_series: Sequence[Series], run_names: list[str], single: bool) -> None:
    """Title, labels, grid and the legend (outside the axes when it is long)."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    from matplotlib.ticker import MaxNLocator

    ax.set_title(_title(metric, run_names))
    ax.set_xlabel(X_LABEL)
    ax.set_ylabel(metric)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if _is_unit_interval(metric, all_series):
        ax.set_ylim(0.0, 1.0)
    ax.grid(True, color="0.88", linewidth=0.8)
    ax.set_axisbelow(True)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)

    handles, labels = ax.get_legend_handles_labels()
    if any(s.ci_low is not None for s in all_series):
        handles.append(Patch(facecolor="0.5", alpha=BAND_ALPHA * 2, label="confidence interval"))
        labels.append("confidence interval")
    if any(s.standalone for s in all_series):
        ring = Line2D([], [], linestyle="none", marker=STANDALONE_MARKER, markersize=STANDALONE_MARKER_SIZE)
        ring.set(markerfacecolor="none", markeredgecolor="0.3", markeredgewidth=STANDALONE_EDGE_WIDTH)
        handles.append(ring)
        labels.append(STANDALONE_LABEL)
    legend_title = "eval set" if single else "run: eval set"
    if len(labels) <= LEGEND_INSIDE_MAX:
        ax.legend(handles, labels, title=legend_title, loc="best", frameon=False)
    else:
        ax.legend(handles, labels, title=legend_title, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)


def _metric_file_part(metric: str) -> str:
    return re.sub(r"[^A-Za-z0-9@._-]+", "_", metric).strip("_") or "metric"


def default_output(run_dirs: Sequence[Path], metric: str) -> Path:
    """``<run>/eval_<metric>.png`` for one run, ``<first run's parent>/compare_<metric>.png``."""
    part = _metric_file_part(metric)
    if len(run_dirs) == 1:
        return run_dirs[0] / f"eval_{part}.png"
    return run_dirs[0].parent / f"compare_{part}.png"


def plot_runs(run_dirs: Sequence[str | Path], metric: str = DEFAULT_METRIC, out: str | Path | None = None) -> Path:
    """Read the runs' eval histories, draw :func:`build_figure`, save it, return the path.

    Args:
        run_dirs: one or more run output directories (each holds ``eval_history.jsonl``).
        metric: the metric to draw, e.g. ``"accuracy"``, ``"pass@4"``, ``"reward/mean"``.
        out: where to save (``.png``, ``.pdf`` or ``.svg``); default: see :func:`default_output`.

    Raises:
        PlotError: a run dir is missing, given twice or has no / an empty history, no run has
            ``metric``, or ``out`` has an unsupported suffix.

    Example:
        >>> plot_runs(["runs/arith-grpo/trial0"])  # doctest: +SKIP
        PosixPath('runs/arith-grpo/trial0/eval_accuracy.png')
    """
    runs, target = runs_and_target(run_dirs, out, lambda dirs: default_output(dirs, metric))
    fig = build_figure(runs, metric)
    target.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(target)
    return target


def runs_and_target(
    run_dirs: Sequence[str | Path], out: str | Path | None, default: Callable[[list[Path]], Path]
) -> tuple[dict[str, list[dict[str, Any]]], Path]:
    """The runs' histories (`load_runs`) and where their figure goes (`out`, else `default(dirs)`).

    Raises:
        PlotError: no run dir, one given twice, missing or without history; an unsupported suffix
            or an unwritable place for the figure.
    """
    dirs = [Path(d) for d in run_dirs]
    if not dirs:
        raise PlotError("plot needs at least one run directory, got none")
    resolved = [d.resolve() for d in dirs]
    for i, r in enumerate(resolved):
        if r in resolved[:i]:
            raise PlotError(f"run directory {str(dirs[i])!r} is given twice; pass each run once")
    target = Path(out) if out is not None else default(dirs)
    if target.suffix.lower() not in SAVE_FORMATS:
        raise PlotError(f"plot --out {str(target)!r} must end in one of {', '.join(SAVE_FORMATS)}")
    runs = load_runs(dirs)
    problem = option_problem("plot --out", target, is_file=True)
    if problem is not None:
        raise PlotError(f"{problem}; pass a writable --out FILE")
    return runs, target
