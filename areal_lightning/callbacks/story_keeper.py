"""`StoryKeeper`: keeps each prompt's outcome across rounds and adds the story metrics of
`callbacks.prompt_story` to every round (the `PromptStory` follow-up of `callbacks.follow_ups` runs it).

The outcomes of a round live on the ranks that evaluated them; `RoundOutcomes` brings them
together on every rank, so the story is computed from the whole set, in index order, and is
the same number on any number of ranks. Rank 0 writes them to ``<output_dir>/prompt_outcomes.jsonl``
(`tracking.prompt_outcomes`); a resumed run marks its resumption there first, so that the file,
read with `read_prompt_outcomes`, holds each round of the run once, in order.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

import lightning as L

from areal_lightning.callbacks.prompt_story import (
    FIRST_ROUND_BUCKETS,
    PromptStorySettings,
    StoryBuckets,
    first_round_bucket,
    gap_metrics,
    gap_names,
    story_metric_names,
    story_metrics,
)
from areal_lightning.callbacks.round_outcomes import RoundOutcomes
from areal_lightning.callbacks.runners import Finished
from areal_lightning.eval_round import EvalSet
from areal_lightning.eval_round.subsample import sample_stratum
from areal_lightning.tracking.prompt_outcomes import MIB, OUTCOMES_FILENAME, PromptOutcomesFile, outcome_row
from areal_lightning.tracking.recorder import EvalRecorder


def _int_keys(per_set: Mapping[str, Mapping[Any, float]]) -> dict[str, dict[int, float]]:
    return {d: {int(i): float(v) for i, v in o.items()} for d, o in per_set.items()}


class StoryKeeper:
    """Adds ``pass@<k>/gap`` to every set, and ``<metric>/gained``, ``<metric>/lost`` and
    ``<metric>/bucket/<b>`` to every set whose round recorded the metric's per-prompt outcomes;
    writes each round's outcomes (rank 0). Its state (the first and the previous round's outcomes
    of every prompt) lets the first round after a resume go on as if training had not stopped.

    Args:
        settings: the story's options (checked here).
        outcomes: where the round's outcomes of every rank are gathered (shared with the best rule).
        eval_sets: the eval sets, for the names of ``stratum`` buckets before any round.

    Raises:
        ArgumentError: for an option out of range (`PromptStorySettings.check`).
    """

    def __init__(
        self, settings: PromptStorySettings, outcomes: RoundOutcomes, eval_sets: Sequence[EvalSet] = ()
    ) -> None:
        settings.check()
        self.settings = settings
        self.outcomes = outcomes
        self._first: dict[str, dict[int, float]] = {}
        self._previous: dict[str, dict[int, float]] = {}
        self._strata: dict[str, dict[int, str]] = self._strata_of(eval_sets)
        self._file: PromptOutcomesFile | None = None
        self._full = False
        self._resumed = False

    def _strata_of(self, eval_sets: Sequence[EvalSet]) -> dict[str, dict[int, str]]:
        if self.settings.buckets is not StoryBuckets.STRATUM:
            return {}
        field = self.settings.stratum_field
        return {s.name: {i: sample_stratum(x, field) for i, x in enumerate(s.samples)} for s in eval_sets}

    def names(self, dataset: str, metrics: Collection[str], outcome_names: Collection[str]) -> set[str]:
        """The names the story adds to `dataset`'s rounds, given the names a round produced and those
        with per-prompt outcomes (the buckets of ``stratum`` from the eval sets it was given)."""
        names = set(gap_names(metrics))
        if self.settings.metric in outcome_names:
            strata = set(self._strata.get(dataset, {}).values())
            names |= set(story_metric_names([self.settings.metric], self.settings, strata))
        return names

    def start(self, trainer: L.Trainer, eval_sets: Sequence[EvalSet], recorder: EvalRecorder) -> None:
        self._strata = self._strata_of(eval_sets)
        if recorder.history is not None:  # rank 0, unless fast_dev_run
            mib = self.settings.max_file_mib
            self._file = PromptOutcomesFile(
                recorder.history.path.parent / OUTCOMES_FILENAME,
                recorder.history.once_per_step,
                None if mib is None else int(mib * MIB),
            )
            if self._resumed:
                self._file.resume(trainer.global_step, recorder.run_id)
        self._resumed = False

    def observe(self, trainer: L.Trainer, done: Finished, recorder: EvalRecorder) -> None:
        for r in done.all_results:
            r.metrics.update(gap_metrics(r.metrics))
        if not done.results:
            return
        every = self.outcomes.of(done)
        metric = self.settings.metric
        rows = []
        for r in done.results:
            per_metric = every.get(r.dataset, {})
            if per_metric:
                causes = [str(c) for c in done.causes]
                rows.append(
                    outcome_row(
                        done.step,
                        done.epoch,
                        r.dataset,
                        per_metric,
                        r.num_prompts,
                        trigger=causes,
                        run_id=recorder.run_id,
                    )
                )
            if metric in per_metric:
                r.metrics.update(self._story(r.dataset, per_metric[metric]))
        self._write(trainer, done.step, rows, recorder)

    def _story(self, dataset: str, current: dict[int, float]) -> dict[str, float]:
        if self.settings.buckets is StoryBuckets.FIRST_ROUND:
            first = self._first.setdefault(dataset, dict(current))
            buckets = {i: b for i, v in first.items() if (b := first_round_bucket(v)) is not None}
            names: Sequence[str] = FIRST_ROUND_BUCKETS
        else:
            buckets = self._strata.get(dataset, {})
            names = sorted(set(buckets.values()))
        out = story_metrics(
            self.settings.metric, current, self._previous.get(dataset), buckets, names, self.settings.solved_at
        )
        self._previous[dataset] = dict(current)
        return out

    def _write(self, trainer: L.Trainer, step: int, rows: list[dict[str, Any]], recorder: EvalRecorder) -> None:
        if self._file is None or self._full or not rows:
            return
        if not self._file.append(rows):
            self._full = True
            message = (
                f"{self._file.path} reached its bound of {self.settings.max_file_mib} MiB at step {step}; later "
                "rounds are not written to it (the story metrics go on); raise "
                "evaluator.decisions.prompt_story.max_file_mib to keep them"
            )
            recorder.event(trainer, "prompt_outcomes", step, message, level=logging.WARNING, path=str(self._file.path))

    def reset(self, dataset: str) -> None:
        """Forgets an eval set's rounds (its content changed): its next round is a first round again."""
        self._first.pop(dataset, None)
        self._previous.pop(dataset, None)

    def state_dict(self) -> dict[str, Any]:
        return {"first": self._first, "previous": self._previous}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restores a `state_dict` (a missing key: nothing kept, a checkpoint from before the story)
        and marks the next start a resumption."""
        self._first = _int_keys(state.get("first", {}))
        self._previous = _int_keys(state.get("previous", {}))
        self._resumed = True


def story_names(eval_set: EvalSet, base_names: Iterable[str], settings: PromptStorySettings | None) -> list[str]:
    """Every name the prompt story may add to `eval_set`'s metrics, given the names its rounds log
    (known before any round: a config's thresholds and monitors can be checked against them).

    Example:
        >>> sorted(story_names(EvalSet("easy", [1, 2]), ["accuracy", "pass@1", "pass@4"], PromptStorySettings()))[-3:]
        ['accuracy/gained', 'accuracy/lost', 'pass@4/gap']
    """
    strata: set[str] = set()
    if settings is not None and settings.buckets is StoryBuckets.STRATUM:
        strata = {sample_stratum(s, settings.stratum_field) for s in eval_set.samples}
    return story_metric_names(base_names, settings, strata)
