"""`RoundOutcomes`: every rank's per-prompt outcomes of a round, gathered once however many follow-ups
(the prompt story, a noise-aware best rule) read them."""

from __future__ import annotations

from areal_lightning.callbacks.runners import Finished
from areal_lightning.eval_round.ranks import all_gather_object

AllOutcomes = dict[str, dict[str, dict[int, float]]]
"""``{eval set: {metric: {sample index: outcome}}}``."""


class RoundOutcomes:
    """Every rank's per-prompt outcomes of the latest round (`SetResult.outcomes` of each fresh set),
    gathered on the first `of` call of the round: every rank must call it for the same rounds, in
    the same order (follow-ups do: they run alike on every rank)."""

    def __init__(self) -> None:
        self._done: Finished | None = None
        self._all: AllOutcomes = {}

    def of(self, done: Finished) -> AllOutcomes:
        if done is not self._done:
            merged: AllOutcomes = {}
            for part in all_gather_object({r.dataset: r.outcomes for r in done.results}):
                for dataset, per_metric in part.items():
                    for metric, outcomes in per_metric.items():
                        merged.setdefault(dataset, {}).setdefault(metric, {}).update(outcomes)
            self._done, self._all = done, merged
        return self._all
