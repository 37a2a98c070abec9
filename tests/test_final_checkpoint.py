"""`last.ckpt` holds the step training ended at, also when `max_steps` is not a multiple of
`trainer.checkpoint_every_n_steps` (Lightning alone leaves it at the last periodic step); the second
commands a user runs, `evaluate` and a resume, then start from the final weights."""

from __future__ import annotations

from pathlib import Path

import torch
from small_run import SMALL_FIT

from areal_lightning.app.cli import main
from areal_lightning.tracking.history import eval_rows, read_history

CONFIG = Path(__file__).resolve().parents[1] / "areal_lightning" / "app" / "configs" / "arithmetic_grpo.yaml"
FIT = [*SMALL_FIT, "grpo.warmup_steps=2", "logger.wandb.mode=disabled", "evaluator.freq_steps=null"]


def _step(path: Path) -> int:
    return int(torch.load(path, map_location="cpu", weights_only=False)["global_step"])


def test_last_ckpt_holds_the_final_step_for_evaluate_and_a_resume(tmp_path: Path) -> None:
    out = tmp_path / "run"
    fit = ["fit", "-c", str(CONFIG), *FIT, "trainer.checkpoint_every_n_steps=4", f"output_dir={out}"]
    assert main([*fit, "trainer.max_steps=6"]) == 0
    ckpts = out / "checkpoints"
    assert sorted(p.name for p in ckpts.glob("*.ckpt")) == ["last.ckpt", "step4.ckpt"]
    assert _step(ckpts / "last.ckpt") == 6 and _step(ckpts / "step4.ckpt") == 4

    config = out / "config.yaml"
    assert main(["evaluate", "-c", str(config), "--ckpt", str(ckpts / "last.ckpt")]) == 0
    evaluated = [r for r in eval_rows(read_history(out)) if r["trigger"] == ["evaluate"]]
    assert {r["step"] for r in evaluated} == {6}

    # A resume continues from step 6: it trains steps 7-8 only, and the end round is that of step 8.
    assert main(["fit", "-c", str(config), "--ckpt", str(ckpts / "last.ckpt"), "trainer.max_steps=8"]) == 0
    assert _step(ckpts / "last.ckpt") == 8 and _step(ckpts / "step8.ckpt") == 8
    ends = [r["step"] for r in eval_rows(read_history(out)) if "end" in r["trigger"]]
    assert ends == [6, 6, 8, 8]  # easy and hard, at the end of each fit
