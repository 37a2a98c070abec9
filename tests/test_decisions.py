"""Eval metrics drive Lightning's own decisions: `ModelCheckpoint` keeps the best round's weights,
`EarlyStopping` stops on an eval metric (the same step on 2 DDP ranks), and the best value of a
watched metric survives a resume.

The scripted `evaluate_fn` reports an accuracy that depends on the global step only (rising, then
falling), and `CountingModule`'s weight ``w`` equals the global step, so a checkpoint's weights
say which round it holds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from callback_helpers import QUIET_WARNINGS, CountingModule, grouped, make_trainer, quiet
from ddp_utils import run_ddp
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint

from areal_lightning.callbacks.best import BestValues, improves
from areal_lightning.callbacks.choices import Direction
from areal_lightning.callbacks.evaluation_callback import EvaluationCallback
from areal_lightning.errors import ArgumentError
from areal_lightning.tracking.history import eval_rows, read_history

pytestmark = [pytest.mark.filterwarnings(w) for w in QUIET_WARNINGS]

MONITOR = "eval/easy/accuracy"
PROMPTS = 20
# Accuracy by evaluated step: rises to its best at step 6, then falls.
ACCURACY = {0: 0.1, 2: 0.3, 4: 0.6, 6: 0.9, 8: 0.5, 10: 0.4, 12: 0.2}
BEST_STEP = 6
TIMEOUT_S = 240.0


def scripted_accuracy(module: Any, batches: Any, ctx: Any) -> dict[str, Any]:
    """Prompt i is correct when i < accuracy * PROMPTS: the mean is exactly ``ACCURACY[step]``."""
    correct = round(ACCURACY[ctx.global_step] * PROMPTS)
    outcomes = [float(i < correct) for b in batches for i in b.indices]
    return {"accuracy": torch.tensor(outcomes, dtype=torch.float64)}


def _callback(**kwargs: Any) -> EvaluationCallback:
    return EvaluationCallback({"easy": list(range(PROMPTS))}, scripted_accuracy, **grouped(eval_at_end=False, **kwargs))


@pytest.mark.parametrize("when", ["every_n_train_steps", "train_epoch_end"])
def test_model_checkpoint_on_an_eval_metric_keeps_the_best_rounds_weights(tmp_path: Path, when: str) -> None:
    if when == "every_n_train_steps":
        cb, ckpt = (
            _callback(freq_steps=2),
            ModelCheckpoint(tmp_path / "ckpt", monitor=MONITOR, mode="max", save_top_k=1, every_n_train_steps=2),
        )
    else:  # 2 steps an epoch, a round at every epoch end, ModelCheckpoint's default epoch-end save
        cb, ckpt = (
            _callback(freq_epochs=1),
            ModelCheckpoint(tmp_path / "ckpt", monitor=MONITOR, mode="max", save_top_k=1),
        )
    # ModelCheckpoint listed first: Lightning still runs it after the evaluation.
    make_trainer(tmp_path, [ckpt, cb], max_steps=12).fit(CountingModule(epoch_len=2))
    assert cb.evaluated_steps == [2, 4, 6, 8, 10, 12]
    kept = sorted(p.name for p in (tmp_path / "ckpt").iterdir())
    assert len(kept) == 1 and f"step={BEST_STEP}" in kept[0]
    assert float(ckpt.best_model_score) == pytest.approx(ACCURACY[BEST_STEP])
    state = torch.load(ckpt.best_model_path, weights_only=False)
    assert state["global_step"] == BEST_STEP
    assert float(state["state_dict"]["w"]) == BEST_STEP  # the weights of the best round
    saved_best = state["callbacks"][cb.state_key]["best"]["best"]["easy"]["accuracy"]
    assert saved_best == [pytest.approx(ACCURACY[BEST_STEP]), BEST_STEP]


def test_every_round_reaches_callback_metrics_and_the_history_with_its_best(tmp_path: Path) -> None:
    cb = _callback(freq_steps=2)
    trainer = make_trainer(tmp_path, [cb], max_steps=10)
    trainer.fit(CountingModule(epoch_len=2))
    metrics = trainer.callback_metrics
    assert float(metrics[MONITOR]) == pytest.approx(ACCURACY[10])
    assert float(metrics[f"{MONITOR}/best"]) == pytest.approx(ACCURACY[BEST_STEP])
    assert float(metrics[f"{MONITOR}/best_step"]) == BEST_STEP
    assert float(metrics["eval/step"]) == 10
    assert metrics[MONITOR].dtype == torch.float32
    rows = eval_rows(read_history(tmp_path))
    assert [(r["step"], r["metrics"]["accuracy/best"], r["metrics"]["accuracy/best_step"]) for r in rows] == [
        (2, pytest.approx(0.3), 2),
        (4, pytest.approx(0.6), 4),
        (6, pytest.approx(0.9), 6),
        (8, pytest.approx(0.9), 6),
        (10, pytest.approx(0.9), 6),
    ]


def test_early_stopping_on_an_eval_metric_stops_after_patience(tmp_path: Path) -> None:
    cb = _callback(freq_epochs=1)
    stop = EarlyStopping(monitor=MONITOR, mode="max", patience=2, check_on_train_epoch_end=True)
    trainer = make_trainer(tmp_path, [cb, stop], max_steps=12)
    trainer.fit(CountingModule(epoch_len=2))
    # Best at step 6; steps 8 and 10 do not improve: patience 2 runs out at step 10.
    assert trainer.global_step == 10 and cb.evaluated_steps == [2, 4, 6, 8, 10]
    assert float(stop.best_score) == pytest.approx(ACCURACY[BEST_STEP])


@pytest.mark.parametrize("order", ["before", "after"])
def test_early_stopping_decides_on_the_round_whatever_its_place_in_the_list(tmp_path: Path, order: str) -> None:
    cb = _callback(freq_epochs=1)
    stop = EarlyStopping(monitor=MONITOR, mode="max", patience=2, check_on_train_epoch_end=True)
    callbacks = [stop, cb] if order == "before" else [cb, stop]
    trainer = make_trainer(tmp_path, callbacks, max_steps=12)
    trainer.fit(CountingModule(epoch_len=2))
    # The check runs right after each round: listed first, it still sees the round of its epoch.
    assert trainer.global_step == 10 and cb.evaluated_steps == [2, 4, 6, 8, 10]
    assert float(stop.best_score) == pytest.approx(ACCURACY[BEST_STEP])


@pytest.mark.parametrize("check_on_train_epoch_end", [True, False, None])
def test_early_stopping_patience_counts_step_based_rounds_not_epoch_ends(
    tmp_path: Path, check_on_train_epoch_end: bool | None
) -> None:
    # Rounds every 2 steps, epochs of 3 steps: Lightning's own check at epoch ends would see a
    # round's value twice or not at all. strict=True (the default) never meets a missing value.
    cb = _callback(freq_steps=2)
    stop = EarlyStopping(monitor=MONITOR, mode="max", patience=2, check_on_train_epoch_end=check_on_train_epoch_end)
    trainer = make_trainer(tmp_path, [cb, stop], max_steps=12)
    trainer.fit(CountingModule(epoch_len=3))
    assert trainer.global_step == 10 and cb.evaluated_steps == [2, 4, 6, 8, 10]
    assert float(stop.best_score) == pytest.approx(ACCURACY[BEST_STEP])


def _early_stop_on_two_ranks(rank: int, world_size: int, root: str) -> tuple[int, list[int], float, float]:
    quiet()
    cb = _callback(freq_epochs=1)
    # strict=True (the default): a rank whose callback_metrics lack the monitor raises.
    stop = EarlyStopping(monitor=MONITOR, mode="max", patience=2, check_on_train_epoch_end=True)
    trainer = make_trainer(root, [cb, stop], max_steps=20, strategy="ddp", accelerator="cpu", devices=world_size)
    trainer.fit(CountingModule(epoch_len=2 * world_size))  # 2 steps an epoch on each rank
    return (
        trainer.global_step,
        cb.evaluated_steps,
        float(trainer.callback_metrics[MONITOR]),
        float(trainer.callback_metrics[f"{MONITOR}/best"]),
    )


@pytest.mark.ddp
def test_early_stopping_on_an_eval_metric_stops_both_ranks_at_the_same_step(tmp_path: Path) -> None:
    results = run_ddp(_early_stop_on_two_ranks, 2, str(tmp_path), timeout_s=TIMEOUT_S)
    assert results[0] == results[1]
    step, evaluated, last, best = results[0]
    assert step == 10 and evaluated == [2, 4, 6, 8, 10]
    assert last == pytest.approx(ACCURACY[10]) and best == pytest.approx(ACCURACY[BEST_STEP])


def test_best_value_survives_a_resume(tmp_path: Path) -> None:
    ckpt = ModelCheckpoint(tmp_path / "every", every_n_train_steps=8, save_top_k=-1)
    first = _callback(freq_steps=2)
    make_trainer(tmp_path, [first, ckpt], max_steps=8).fit(CountingModule(epoch_len=2))
    assert first.best.best("easy", "accuracy") == (pytest.approx(0.9), 6)
    resumed = _callback(freq_steps=2)
    trainer = make_trainer(tmp_path, [resumed], max_steps=12)
    trainer.fit(CountingModule(epoch_len=2), ckpt_path=str(tmp_path / "every" / "epoch=3-step=8.ckpt"))
    assert resumed.evaluated_steps == [10, 12]  # only falling rounds after the resume
    assert float(trainer.callback_metrics[f"{MONITOR}/best"]) == pytest.approx(ACCURACY[BEST_STEP])
    assert float(trainer.callback_metrics[f"{MONITOR}/best_step"]) == BEST_STEP


def test_best_values_follow_the_direction_and_load_old_checkpoints() -> None:
    best = BestValues({"loss": "min", "accuracy": Direction.MAX})
    for step, (loss, acc) in enumerate([(1.0, 0.2), (0.5, float("nan")), (0.7, 0.2), (0.4, 0.3)]):
        out = best.update("easy", {"loss": loss, "accuracy": acc}, step)
    assert out == {"loss/best": 0.4, "loss/best_step": 3.0, "accuracy/best": 0.3, "accuracy/best_step": 3.0}
    assert best.best("easy", "accuracy") == (0.3, 3)
    assert improves(0.2, 0.2, Direction.MAX) is False  # a tie keeps the earlier round
    fresh = BestValues({"accuracy": "max"})
    fresh.load_state_dict({})  # a checkpoint from before best values
    assert fresh.best("easy", "accuracy") is None
    fresh.load_state_dict(best.state_dict())
    assert fresh.best("easy", "accuracy") == (0.3, 3)


def test_bad_best_metrics_are_refused_with_the_choices() -> None:
    with pytest.raises(ArgumentError, match=r"best_metrics.accuracy=.*up.*Possible choices are: max, min"):
        _callback(freq_steps=2, best_metrics={"accuracy": "up"})
    with pytest.raises(ArgumentError, match="best_metrics"):
        _callback(freq_steps=2, best_metrics=["accuracy"])
