"""`EvaluationCallback` under Lightning's defaults, as a new user meets it.

A third-party LightningModule (Lightning's own `BoringModel`: a validation loop with its sanity
steps) in ``L.Trainer(...)`` with nothing switched off: the progress bar (TQDM and Rich), the
default logger, default checkpointing, ``accelerator``/``devices`` left to "auto",
``default_root_dir`` left to the current directory, plus `ModelCheckpoint` and `EarlyStopping`
monitoring an eval metric with their defaults; sync and async; one and two processes. Every
round must yield metrics and none an ``error`` record. And ``fast_dev_run`` runs a round on each
eval set's first batch and writes nothing, as Lightning's own callbacks do.

Eval sets have several batches, so the round's batch list goes through the progress display (a
one-batch set would hide what broke every round under the default progress bar).
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from callback_helpers import QUIET_WARNINGS, quiet
from ddp_utils import run_ddp
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint, RichProgressBar, TQDMProgressBar
from lightning.pytorch.demos.boring_classes import BoringModel

from areal_lightning.callbacks import EvaluationCallback
from areal_lightning.eval_round import EvalRoundError
from areal_lightning.metrics import RewardMetric
from areal_lightning.tracking.history import HISTORY_FILENAME, eval_rows, event_rows, read_history

pytestmark = [pytest.mark.filterwarnings(w) for w in QUIET_WARNINGS]

MONITOR = "eval/easy/reward/mean"
BATCH_SIZE = 64
EVAL_SIZE = 5 * BATCH_SIZE - 20  # five batches, the last one short
STEPS_PER_EPOCH = 64  # BoringModel: 64 random samples, batches of 1
FREQ_STEPS = 80  # the first round comes after the first epoch's validation
MAX_STEPS = 140  # two epoch ends with a validation (steps 64 and 128), rounds at 80 and at the end
TIMEOUT_S = 240.0


def eval_samples() -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(7)
    return list(torch.randn(EVAL_SIZE, 32, generator=generator))


def boring_evaluate(module: Any, batches: Any, ctx: Any) -> dict[str, Any]:
    """A user's evaluate_fn: the module's output as a reward, metrics created before the loop."""
    reward = ctx.metric("reward", RewardMetric)
    for batch in batches:
        out = module(torch.stack(batch.samples).to(ctx.device))
        reward.update(out.sum(dim=-1).double())
    return {}


def _bar(kind: str) -> L.Callback:
    return TQDMProgressBar() if kind == "tqdm" else RichProgressBar()


def _fit_with_defaults(bar: str, mode: str) -> tuple[EvaluationCallback, ModelCheckpoint, L.Trainer]:
    evaluation = EvaluationCallback(
        {"easy": eval_samples()}, boring_evaluate, schedule={"freq_steps": FREQ_STEPS}, execution={"mode": mode}
    )
    best = ModelCheckpoint(monitor=MONITOR, mode="max")
    stop = EarlyStopping(monitor=MONITOR, mode="max", patience=10)
    trainer = L.Trainer(max_steps=MAX_STEPS, callbacks=[evaluation, best, stop, _bar(bar)])
    trainer.fit(BoringModel())
    return evaluation, best, trainer


def _logged_eval_steps(log_dir: Path) -> list[int]:
    with open(log_dir / "metrics.csv") as f:
        return [int(row["step"]) for row in csv.DictReader(f) if row.get(MONITOR)]


@pytest.mark.process
@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("bar", ["tqdm", "rich"])
def test_every_round_yields_metrics_under_lightnings_defaults(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], bar: str, mode: str
) -> None:
    monkeypatch.chdir(tmp_path)  # default_root_dir: the current directory
    evaluation, best, trainer = _fit_with_defaults(bar, mode)
    records = read_history(tmp_path)
    assert event_rows(records, "error") == []
    rows = eval_rows(records)
    assert [r["step"] for r in rows] == evaluation.evaluated_steps == [FREQ_STEPS, MAX_STEPS]
    assert all(r["num_prompts"] == EVAL_SIZE and MONITOR.split("/", 2)[2] in r["metrics"] for r in rows)
    # The default logger (CSV here) got every round at its step.
    assert trainer.logger is not None and trainer.logger.log_dir is not None
    assert _logged_eval_steps(Path(trainer.logger.log_dir)) == [FREQ_STEPS, MAX_STEPS]
    # ModelCheckpoint's default epoch-end save: before the first round (step 64, after a validation
    # loop ran) it scores the save worst instead of refusing; at step 128 the round of step 80 wins
    scores = [pytest.approx(r["metrics"]["reward/mean"]) for r in rows]
    if mode == "sync":
        assert best.best_model_path.endswith(f"step={2 * STEPS_PER_EPOCH}.ckpt")
        assert float(best.best_model_score) in scores
    else:  # here the worker's first result arrives after the last save: the worst score stands
        assert float(best.best_model_score) in [*scores, float("-inf")]
    if bar == "tqdm" and mode == "sync":
        assert "Evaluating easy" in capsys.readouterr().out  # shown as Lightning shows validation


def _fit_on_two_ranks(rank: int, world_size: int, root: str) -> list[tuple[str, list[int], int]]:
    quiet()
    out = []
    for bar, mode in (("tqdm", "sync"), ("rich", "async")):
        run_dir = Path(root) / f"{bar}-{mode}"
        evaluation = EvaluationCallback(
            {"easy": eval_samples()},
            boring_evaluate,
            schedule={"freq_steps": 10, "eval_before_train": True},
            execution={"mode": mode},
        )
        trainer = L.Trainer(
            max_steps=20,
            accelerator="cpu",
            devices=world_size,
            strategy="ddp",
            default_root_dir=run_dir,
            callbacks=[evaluation, _bar(bar)],
        )
        trainer.fit(BoringModel())
        out.append((f"{bar}-{mode}", evaluation.evaluated_steps, trainer.global_step))
    return out


@pytest.mark.ddp
def test_two_processes_with_the_progress_bar_on_record_every_round(tmp_path: Path) -> None:
    results = run_ddp(_fit_on_two_ranks, 2, str(tmp_path), timeout_s=TIMEOUT_S)
    assert results[0] == results[1]
    for name, evaluated, _ in results[0]:
        records = read_history(tmp_path / name)
        assert event_rows(records, "error") == [], name
        rows = eval_rows(records)
        assert [r["step"] for r in rows] == evaluated, name
        assert all((r["num_prompts"], r["world_size"]) == (EVAL_SIZE, 2) for r in rows), name
        # async skips a round that falls due while the previous one runs (on_busy="skip"), and says so
        skipped = [e["step"] for e in event_rows(records, "skipped")]
        assert set(evaluated + skipped) == {0, 10, 20} and evaluated[0] == 0, name


def test_fast_dev_run_evaluates_a_first_batch_and_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    seen: list[int] = []

    def counting(module: Any, batches: Any, ctx: Any) -> dict[str, Any]:
        seen.append(sum(len(b.indices) for b in batches))
        return boring_evaluate(module, batches, ctx)

    evaluation = EvaluationCallback(
        {"easy": eval_samples()}, counting, schedule={"freq_steps": 1, "eval_before_train": True}
    )
    L.Trainer(fast_dev_run=True, callbacks=[evaluation]).fit(BoringModel())
    assert evaluation.evaluated_steps == [0, 1]
    assert seen == [BATCH_SIZE, BATCH_SIZE]
    assert not (tmp_path / HISTORY_FILENAME).exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no logs, no checkpoints, no history


def _fails(module: Any, batches: Any, ctx: Any) -> dict[str, Any]:
    raise ValueError("a bug in evaluate_fn")


def test_fast_dev_run_surfaces_a_broken_evaluate_fn(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    evaluation = EvaluationCallback({"easy": eval_samples()}, _fails, schedule={"freq_steps": 1})
    with pytest.raises(EvalRoundError, match="a bug in evaluate_fn"):
        L.Trainer(fast_dev_run=True, callbacks=[evaluation]).fit(BoringModel())


@pytest.mark.parametrize("on_error", ["log", "raise"])
@pytest.mark.parametrize(("sanity_batches", "stopped_at", "why"), [(1, 0, "sanity pass"), (0, 5, "sanity round")])
def test_a_failing_sanity_pass_or_first_round_stops_training_whatever_on_error_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, on_error: str, sanity_batches: int, stopped_at: int, why: str
) -> None:
    monkeypatch.chdir(tmp_path)
    rounds = {"on_error": on_error, "sanity_batches": sanity_batches}
    evaluation = EvaluationCallback({"easy": eval_samples()}, _fails, schedule={"freq_steps": 5}, rounds=rounds)
    trainer = L.Trainer(max_steps=20, callbacks=[evaluation])
    with pytest.raises(EvalRoundError, match=why) as caught:
        trainer.fit(BoringModel())
    assert "ValueError: a bug in evaluate_fn" in str(caught.value)
    assert trainer.global_step == stopped_at  # not after the last step
    assert [e["step"] for e in event_rows(read_history(tmp_path), "error")] == [stopped_at]


def _fails_after_the_first_round(module: Any, batches: Any, ctx: Any) -> dict[str, Any]:
    if ctx.global_step > 5:
        raise ValueError("a transient failure")
    return boring_evaluate(module, batches, ctx)


def test_later_failures_follow_on_error_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    evaluation = EvaluationCallback({"easy": eval_samples()}, _fails_after_the_first_round, schedule={"freq_steps": 5})
    trainer = L.Trainer(max_steps=15, callbacks=[evaluation])
    trainer.fit(BoringModel())
    assert trainer.global_step == 15
    records = read_history(tmp_path)
    assert [r["step"] for r in eval_rows(records)] == [5]
    assert [e["step"] for e in event_rows(records, "error")] == [10, 15]
