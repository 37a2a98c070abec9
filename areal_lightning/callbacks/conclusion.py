"""What happens to a round once its runner returns it, in one fixed order, on every rank alike.

A skipped round becomes a ``skipped`` event. A failed round is recorded, and raises for the first
round of a fit (the sanity round) or under ``on_error="raise"``. A finished round goes through the
follow-ups that add to it (`follow_ups`, in list order), is published to
``trainer.callback_metrics`` (where ModelCheckpoint and EarlyStopping read it; adopted
EarlyStoppings check right away), is recorded (`EvalRecorder`), then goes through the follow-ups
that read the record.
"""

from __future__ import annotations

from collections.abc import Sequence

import lightning as L
from lightning.pytorch.callbacks import EarlyStopping

from areal_lightning.callbacks.choices import ErrorPolicy
from areal_lightning.callbacks.follow_ups import FollowUp
from areal_lightning.callbacks.lightning_monitors import check_after_round, publish_round
from areal_lightning.callbacks.runners import Finished, Outcome, Skipped
from areal_lightning.eval_round import EvalRoundError
from areal_lightning.tracking.recorder import EvalRecorder

SANITY_NOTE = (
    "(the first evaluation round of a fit is a sanity round, as Lightning's sanity check is for validation: "
    "its failure stops training whatever on_error says; later rounds follow on_error)"
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
        self.rounds_this_fit = 0  # the first round of a fit is a sanity round: its failure stops training

    def __call__(self, trainer: L.Trainer, outcomes: Sequence[Outcome]) -> None:
        for done in outcomes:
            if isinstance(done, Skipped):
                self._skipped(trainer, done)
            elif done.error is not None:
                self._failed(trainer, done.step, done.error)
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

    def _failed(self, trainer: L.Trainer, step: int, err: EvalRoundError) -> None:
        """Records a failed round; raises (every rank alike) for the sanity round or ``on_error='raise'``.

        The first round of a fit is a sanity round, as Lightning's sanity check is for validation:
        its failure is most likely a bug in `evaluate_fn`, which would fail every later round too.
        """
        sanity = self.rounds_this_fit == 0
        stops = sanity or self.on_error is ErrorPolicy.RAISE
        self.recorder.error(trainer, step, err, stops=stops, why=SANITY_NOTE if sanity else "")
        if sanity:
            raise EvalRoundError(f"{err}\n{SANITY_NOTE}") from err
        if self.on_error is ErrorPolicy.RAISE:
            raise err

    def _finished(self, trainer: L.Trainer, done: Finished) -> None:
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
        for follow_up in self.follow_ups:
            if follow_up.after_record:
                follow_up.observe(trainer, done, self.recorder)
