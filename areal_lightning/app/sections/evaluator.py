"""The ``evaluator`` section: the four option groups of `EvaluationCallback` (`callbacks.settings`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from areal_lightning.app.config_errors import owned_by_key
from areal_lightning.callbacks.settings import Decisions, Execution, RoundSettings, Schedule, validate_together


@dataclass
class EvaluatorConfig:
    """When and how to evaluate (the YAML `evaluator` block): the four groups `EvaluationCallback`
    takes, each checking its own fields when built; the metric and eval set names they give are
    checked against the rest of the config in `Config._check_thresholds`."""

    schedule: Schedule = field(default_factory=Schedule)
    """When rounds run: freq_steps, freq_epochs, freq_secs, eval_before_train, eval_at_end, adaptive, budget."""
    execution: Execution = field(default_factory=Execution)
    """Where they run: mode (sync, async), on_busy, async_device, async_threads, max_snapshot_mib."""
    rounds: RoundSettings = field(default_factory=RoundSettings)
    """What a round does: precision, cache, cache_dir, max_table_rows, on_error, sanity_batches, verbose."""
    decisions: Decisions = field(default_factory=Decisions)
    """What follows a round: metric_thresholds, best_metrics, best_rule, reward_watch, prompt_story, ..."""

    def check(self, path: str) -> None:
        with owned_by_key(path):  # the check that spans two groups
            validate_together(self.execution, self.rounds)
