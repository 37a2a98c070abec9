"""Lightning's CSV logger, able to continue a version: what a run resumed from a checkpoint needs."""

from __future__ import annotations

import csv

from lightning.fabric.loggers.logger import rank_zero_experiment
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter
from typing_extensions import override


class _ContinuingWriter(ExperimentWriter):
    """Lightning's writer, except that an existing ``metrics.csv`` is appended to, never deleted."""

    @override
    def _check_log_dir_exists(self) -> None:
        # Lightning deletes the version's metrics.csv here (with a warning) and offers no option
        # to keep it; this private hook is the one place that decision is made.
        if self._fs.isfile(self.metrics_file_path):
            with self._fs.open(self.metrics_file_path, "r", newline="") as f:
                # The existing header, so that rows of this session fit the file's columns.
                self.metrics_keys = list(next(csv.reader(f), []))


class ContinuingCSVLogger(CSVLogger):
    """Lightning's `CSVLogger` that, given the ``version`` of an earlier session, appends to its
    ``metrics.csv`` instead of deleting it (Lightning's own logger starts that file anew).

    Arguments are those of `CSVLogger`.

    Example:
        >>> import tempfile
        >>> temp = tempfile.TemporaryDirectory(); root = temp.name
        >>> first = ContinuingCSVLogger(root, name="csv"); first.log_metrics({"loss": 1.0}, step=1); first.save()
        >>> again = ContinuingCSVLogger(root, name="csv", version=0); again.log_metrics({"loss": 0.5}, step=2)
        >>> again.save()
        >>> open(f"{root}/csv/version_0/metrics.csv").read().split()
        ['loss,step', '1.0,1', '0.5,2']
        >>> temp.cleanup()
    """

    @property
    @override
    @rank_zero_experiment
    def experiment(self) -> ExperimentWriter:
        """The writer of this version's files (created on first use, on rank 0)."""
        # `_experiment` and `_fs` are the attributes `CSVLogger.experiment` itself fills and uses.
        if self._experiment is None:
            self._fs.makedirs(self.root_dir, exist_ok=True)
            self._experiment = _ContinuingWriter(log_dir=self.log_dir)
        assert isinstance(self._experiment, ExperimentWriter)  # Fabric's CSVLogger types it as its own writer
        return self._experiment


__all__ = ["ContinuingCSVLogger"]
