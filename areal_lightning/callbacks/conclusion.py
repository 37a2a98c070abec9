"""What happens to a round once its runner returns it, in one fixed order, on every rank alike.

A skipped round becomes a ``skipped`` event. A failed round is recorded, and raises for the first
round of a fit (the sanity round) or under ``on_error="raise"``. A finished round goes through the
follow-ups that add to it (`follow_ups`, in list order), is published to
``trainer.callback_metrics`` (where ModelCheckpoint and EarlyStopping read it; adopted
EarlyStoppings check right away), is recorded (`EvalRecorder`), then goes through the follow-ups
that read the record.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import lightning as L
from lightning.pytorch.callbacks import EarlyStopping

from areal_lightning.callbacks.choices import ErrorPolicy
from areal_lightning.callbacks.follow_ups import FollowUp
from areal_lightning.callbacks.lightning_monitors import check_after_round, publish_round
from areal_lightning.callbacks.runners import Finished, Outcome, Skipped
from areal_lightning.eval_round import EvalRoundError, SetResult
from areal_lightning.tracking.recorder import EvalRecorder

SANITY_NOTE = (
    "(with the sanity pass off, the first evaluation round of a fit is a sanity round, as Lightning's sanity "
    "check is for validation: its failure stops training whatever on_error says; later rounds follow on_error)"
)


class Conclusion:
    """Concludes the outcomes of a callback's runner.

    Args:
        follow_ups: the callback's follow-ups, in the order they observe a round.
        recorder: where records and events go.
        on_error: what a failed round does after the sanity round.
    """

    def __init__(self, follow_ups: Sequence[FollowUp], recorder: EvalRecorder, on_error: ErrorPolicy) -> None:
        self.follow_ups = list(follow_ups)
        self.recorder = recorder
        self.on_error = on_error
        self.adopted: list[EarlyStopping] = []  # EarlyStopping on eval metrics: checked after each round
        self.evaluated_steps: list[int] = []
        self.skipped_step: int | None = None  # the latest step whose round was skipped while busy
        self.rounds_this_fit = 0
        self.stand_in_sanity: Callable[[L.Trainer, list[SetResult]], None] | None = None
        """Set when the fit has no sanity pass: the first round stands in for it (its failure stops
        training) and this checks its metric names."""

    def __call__(self, trainer: L.Trainer, outcomes: Sequence[Outcome]) -> None:
        for done in outcomes:
            if isinstance(done, Skipped):
                self._skipped(trainer, done)
            elif done.error is not None:
                self._failed(trainer, done)
            else:
                self._finished(trainer, done)

    def _skipped(self, trainer: L.Trainer, done: Skipped) -> None:
        self.skipped_step = done.step
        message = (
            f"evaluation of step {done.step} skipped: the round of step {done.running_step} is still "
            "running (on_busy='skip')"
        )
        trigger = [str(c) for c in done.causes]
        self.recorder.event(trainer, "skipped", done.step, message, trigger=trigger, running_step=done.running_step)

    def _failed(self, trainer: L.Trainer, done: Finished) -> None:
        """Records a failed round: the sets that did not fail as a finished round, an error record
        per failed set; raises (every rank alike) for the sanity round or ``on_error='raise'``.

        The first round of a fit is a sanity round, as Lightning's sanity check is for validation:
        its failure is most likely a bug in `evaluate_fn`, which would fail every later round too.
        """
        err = done.error
        assert err is not None
        sanity = self.rounds_this_fit == 0 and self.stand_in_sanity is not None
        stops = sanity or self.on_error is ErrorPolicy.RAISE
        if done.all_results:
            self._finished(trainer, done, check_names=not sanity)  # a failing eval set costs only itself
        why = SANITY_NOTE if sanity else ""
        for dataset, message in err.messages.items():
            self.recorder.error(trainer, done.step, message, dataset=dataset, stops=stops, why=why)
        if sanity:
            raise EvalRoundError(f"{err}\n{SANITY_NOTE}", results=err.results, failures=err.failures) from err
        if self.on_error is ErrorPolicy.RAISE:
            raise err

    def _finished(self, trainer: L.Trainer, done: Finished, *, check_names: bool = True) -> None:
        first = self.rounds_this_fit == 0
        self.evaluated_steps.append(done.step)
        self.rounds_this_fit += 1
        for follow_up in self.follow_ups:
            if not follow_up.after_record:
                follow_up.observe(trainer, done, self.recorder)
        results = done.all_results
        publish_round(trainer, results, done.step)
        check_after_round(trainer, trainer.lightning_module, self.adopted)
        causes = [str(c) for c in done.causes]
        self.recorder.round(
            trainer,
            results,
            done.step,
            done.epoch,
            causes,
            cached=set(done.cached),
            fields=done.fields,
            extras=done.extras,
        )
        if first and check_names and self.stand_in_sanity is not None:
            self.stand_in_sanity(trainer, results)  # recorded first: nothing evaluated is lost
        for follow_up in self.follow_ups:
            if follow_up.after_record:
                follow_up.observe(trainer, done, self.recorder)
