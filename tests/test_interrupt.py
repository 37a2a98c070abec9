"""`StopOnSignal` in a real Trainer: a signal during a step lets the step finish, checkpoints it and
stops the way Lightning stops for that signal; a second signal stops at once without a checkpoint;
the Trainer leaves the process's signal handlers as it found them."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from callback_helpers import CountingModule, make_trainer, quiet
from ddp_utils import run_ddp
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities.exceptions import SIGTERMException

from areal_lightning.app.interrupt import StopOnSignal


class SignalDuringStep(Callback):
    """Sends `sig` to this process `times` times from inside the training step that makes step `at`."""

    def __init__(self, sig: signal.Signals, at: int, times: int = 1) -> None:
        self.sig, self.at, self.times = sig, at, times
        self.steps_seen: list[int] = []

    def on_before_optimizer_step(self, trainer: L.Trainer, *args: Any) -> None:
        if trainer.global_step + 1 == self.at:
            for _ in range(self.times):
                os.kill(os.getpid(), self.sig)

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        self.steps_seen.append(trainer.global_step)


@pytest.mark.parametrize(
    ("sig", "raised"), [(signal.SIGINT, SystemExit), (signal.SIGTERM, SIGTERMException)], ids=["SIGINT", "SIGTERM"]
)
def test_a_signal_finishes_the_step_checkpoints_it_and_stops(tmp_path: Path, sig: signal.Signals, raised: type) -> None:
    handlers_before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    stop = StopOnSignal(tmp_path / "checkpoints" / "last.ckpt")
    sender = SignalDuringStep(sig, at=3)
    with pytest.raises(raised):  # Lightning ends a KeyboardInterrupt with sys.exit(1)
        make_trainer(tmp_path, [sender, stop], max_steps=10, enable_checkpointing=True).fit(CountingModule())
    assert sender.steps_seen == [1, 2, 3]  # step 3 finished, step 4 never started
    assert (stop.requested, stop.stopped_by, stop.saved_step) == (sig, sig, 3)
    ckpt = torch.load(stop.path, weights_only=True)
    assert ckpt["global_step"] == 3 and float(ckpt["state_dict"]["w"]) == 3.0  # the step's own weights
    assert [p.name for p in stop.path.parent.iterdir()] == ["last.ckpt"]  # no partial file left
    assert {s: signal.getsignal(s) for s in handlers_before} == handlers_before


def test_a_second_signal_stops_at_once_without_a_checkpoint(tmp_path: Path) -> None:
    handler_before = signal.getsignal(signal.SIGINT)  # ignored in a process started in the background
    stop = StopOnSignal(tmp_path / "checkpoints" / "last.ckpt")
    sender = SignalDuringStep(signal.SIGINT, at=3, times=2)
    with pytest.raises(SystemExit):
        make_trainer(tmp_path, [sender, stop], max_steps=10, enable_checkpointing=True).fit(CountingModule())
    assert sender.steps_seen == [1, 2]  # step 3 never finished
    assert (stop.stopped_by, stop.saved_step) == (signal.SIGINT, None)
    assert not stop.path.parent.exists()
    assert signal.getsignal(signal.SIGINT) == handler_before


def _signal_on_rank_1(rank: int, world_size: int, root: str) -> tuple[int, int | None, int | None, int]:
    quiet()
    stop = StopOnSignal(Path(root) / "checkpoints" / "last.ckpt")
    callbacks: list[Callback] = [stop]
    if rank == 1:  # this rank alone gets the signal, during step 3
        callbacks.insert(0, SignalDuringStep(signal.SIGINT, at=3))
    trainer = make_trainer(
        root, callbacks, max_steps=10, strategy="ddp", accelerator="cpu", devices=world_size, enable_checkpointing=True
    )
    with pytest.raises(SystemExit):
        trainer.fit(CountingModule(epoch_len=10 * world_size))
    assert stop.stopped_by is not None
    return trainer.global_step, stop.saved_step, int(stop.stopped_by), int(torch.load(stop.path)["global_step"])


@pytest.mark.ddp
def test_a_signal_on_one_rank_stops_every_rank_after_the_same_step(tmp_path: Path) -> None:
    results = run_ddp(_signal_on_rank_1, 2, str(tmp_path), timeout_s=120.0)
    assert results == [(3, 3, int(signal.SIGINT), 3)] * 2
