"""`areal-lightning fit` with fault hooks, for the crash tests (run as a script, never imported by pytest).

Environment:
    FAULT_MARKS: a file each hook appends one line to (``warmup``, ``round <set> <step>``, ``hang ...``).
    FAULT_HANG: ``round:<step>`` hangs inside that step's evaluation round; ``checkpoint:<step>`` hangs
        after that step's round was recorded, before its checkpoint is saved. The test then SIGKILLs us.

Everything else is the real command: ``python fit_with_faults.py fit -c CONFIG key=value ... [--ckpt PATH]``.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch
from lightning.pytorch.callbacks import ModelCheckpoint

import areal_lightning.rl.grpo.module as grpo
from areal_lightning.app.cli import main

MARKS = Path(os.environ["FAULT_MARKS"])
KIND, _, STEP = os.environ.get("FAULT_HANG", ":").partition(":")
HANG_S = 3600.0


def _mark(line: str) -> None:
    with open(MARKS, "a") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


def _hang_if(kind: str, step: int) -> None:
    if kind == KIND and str(step) == STEP:
        _mark(f"hang {kind} {step}")
        time.sleep(HANG_S)


real_warmup = grpo.format_warmup


def _warmup(*args, **kwargs):
    _mark("warmup")
    return real_warmup(*args, **kwargs)


real_evaluate = grpo.GRPOModule.evaluate


def _evaluate(self, batches, ctx):
    if ctx.sanity:  # the sanity pass when fit starts: not a round
        return real_evaluate(self, batches, ctx)
    _mark(f"round {ctx.dataset} {ctx.global_step}")
    _hang_if("round", ctx.global_step)
    return real_evaluate(self, batches, ctx)


real_checkpoint_hook = ModelCheckpoint.on_train_batch_end


def _checkpoint_hook(self, trainer, *args, **kwargs):
    _hang_if("checkpoint", trainer.global_step)  # the evaluation callback ran before this hook
    return real_checkpoint_hook(self, trainer, *args, **kwargs)


if __name__ == "__main__":
    torch.set_num_threads(1)  # the reference and the resumed run compute alike
    grpo.format_warmup = _warmup
    grpo.GRPOModule.evaluate = _evaluate
    ModelCheckpoint.on_train_batch_end = _checkpoint_hook
    sys.exit(main(sys.argv[1:]))
