"""The sanity pass when `fit` starts, and every metric name the configuration uses checked against it.

As a Lightning user meets it: Lightning's own `BoringModel` (a validation loop with its sanity
steps) in a `Trainer` with its defaults, `ModelCheckpoint` and `EarlyStopping` on eval metrics,
and the mistakes a user makes: a monitor one level too shallow (``eval/probe/acc`` for a metric
that returns a mapping and logs ``eval/probe/acc/accuracy``), a threshold, best metric, adaptive or
reward-watch metric that no round produces. Each ends with one clear error before the first
training step; without the pass (``sanity_batches=0``) the first round is checked instead, never
a NaN left under a monitor for the whole fit.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from callback_helpers import QUIET_WARNINGS, quiet
from ddp_utils import run_ddp
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint
from lightning.pytorch.demos.boring_classes import BoringModel

from areal_lightning.callbacks import EvaluationCallback
from areal_lightning.callbacks.sanity import MetricNameError
from areal_lightning.metrics import AccuracyMetric, RewardMetric
from areal_lightning.tracking.history import HISTORY_FILENAME, eval_rows, read_history

pytestmark = [pytest.mark.filterwarnings(w) for w in QUIET_WARNINGS]

BATCH_SIZE = 4
FREQ_STEPS = 3
MAX_STEPS = 6


def samples(n: int, seed: int) -> list[torch.Tensor]:
    return list(torch.randn(n, 32, generator=torch.Generator().manual_seed(seed)))


EVAL_SETS = {"probe": samples(3 * BATCH_SIZE + 1, 1), "other": samples(2 * BATCH_SIZE, 2)}


class Calls:
    """An `evaluate_fn` that keeps what it was called with: an accuracy created as a user would
    (``ctx.metric("acc", AccuracyMetric)``: it logs ``acc/accuracy``, ``acc/ci_low`` ...), a reward
    with per-prompt outcomes (paired deltas)."""

    def __init__(self) -> None:
        self.seen: list[tuple[bool, int, str, list[int]]] = []

    def __call__(self, module: Any, batches: Any, ctx: Any) -> dict[str, Any]:
        acc, reward = ctx.metric("acc", AccuracyMetric), ctx.metric("reward", RewardMetric)
        for batch in batches:
            self.seen.append((ctx.sanity, module.trainer.global_step, ctx.dataset, list(batch.indices)))
            out = module(torch.stack(batch.samples).to(ctx.device)).sum(dim=-1).double()
            values = (out > 0).double()
            acc.update(values)
            reward.update(values)
            ctx.record_outcomes("reward/mean", batch.indices, values)
        return {}


def _callback(evaluate: Calls, **settings: Any) -> EvaluationCallback:
    from areal_lightning.eval_round import EvalSet

    sets = [EvalSet(name, s, batch_size=BATCH_SIZE) for name, s in EVAL_SETS.items()]
    return EvaluationCallback(sets, evaluate, schedule={"freq_steps": FREQ_STEPS}, **settings)


def test_the_sanity_pass_evaluates_each_sets_first_batch_before_step_one_and_records_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # Lightning's defaults: logs and checkpoints in the current directory
    evaluate = Calls()
    best = ModelCheckpoint(monitor="eval/probe/acc/accuracy", mode="max")
    stop = EarlyStopping(monitor="eval/probe/reward/mean/delta", mode="max", patience=5)  # from round 2 on
    trainer = L.Trainer(max_steps=MAX_STEPS, callbacks=[_callback(evaluate), best, stop])
    trainer.fit(BoringModel())

    sanity = [(step, dataset, indices) for is_sanity, step, dataset, indices in evaluate.seen if is_sanity]
    assert sanity == [(0, "probe", [0, 1, 2, 3]), (0, "other", [0, 1, 2, 3])]  # the first batch, at step 0
    assert [s for s, *_ in evaluate.seen[:2]] == [True, True]  # before any recorded round
    records = eval_rows(read_history(tmp_path / HISTORY_FILENAME))
    assert sorted({r["step"] for r in records}) == [3, 6]  # the pass itself is recorded nowhere
    assert best.best_model_path  # the monitored metric exists: a best checkpoint was kept


@pytest.mark.parametrize("kind", [ModelCheckpoint, EarlyStopping])
def test_a_monitor_one_level_too_shallow_is_refused_before_step_one_naming_the_metric_it_meant(
    tmp_path: Path, kind: type[ModelCheckpoint] | type[EarlyStopping]
) -> None:
    trainer = L.Trainer(
        max_steps=MAX_STEPS,
        default_root_dir=tmp_path,
        callbacks=[_callback(Calls()), kind(monitor="eval/probe/acc", mode="max")],
    )
    message = (
        rf"`{kind.__name__}\(monitor='eval/probe/acc'\)` names eval/probe/acc, which the evaluation does not log "
        r"\(did you mean eval/probe/acc/accuracy\?\)\. It logs eval/<set>/<metric> for the eval sets probe, other "
        r"and the metrics acc/accuracy, acc/ci_high, acc/ci_low, eval_secs, "
    )
    with pytest.raises(MetricNameError, match=message):
        trainer.fit(BoringModel())
    assert trainer.global_step == 0  # nothing trained, nothing lost
    assert not (tmp_path / HISTORY_FILENAME).exists()


@pytest.mark.parametrize(
    ("settings", "where"),
    [
        ({"decisions": {"metric_thresholds": {"acc": 0.7}}}, r"`Decisions\(metric_thresholds=...\)`"),
        ({"decisions": {"best_metrics": {"accuracy": "max"}}}, r"`Decisions\(best_metrics=...\)`"),
        ({"schedule": {"freq_steps": 3, "adaptive": {"metric": "acc"}}}, r"`Schedule\(adaptive=...\)`"),
        (
            {"decisions": {"reward_watch": {"metric": "acc", "eval_set": "other"}}},
            r"`Decisions\(reward_watch=...\)`",
        ),
    ],
    ids=["threshold", "best metric", "adaptive metric", "reward watch metric"],
)
def test_every_metric_name_of_the_settings_is_checked_before_step_one(
    tmp_path: Path, settings: dict[str, Any], where: str
) -> None:
    sets = {name: s for name, s in EVAL_SETS.items()}
    callback = EvaluationCallback(sets, Calls(), **{"schedule": {"freq_steps": FREQ_STEPS}, **settings})
    trainer = L.Trainer(max_steps=MAX_STEPS, default_root_dir=tmp_path, callbacks=[callback])
    with pytest.raises(MetricNameError, match=rf"{where} names the metric '(acc|accuracy)', which .*did you mean acc/"):
        trainer.fit(BoringModel())
    assert trainer.global_step == 0


def test_names_that_only_later_rounds_log_are_accepted(tmp_path: Path) -> None:
    """A paired change (from the second round on) and a best value are known from their base metric."""
    callbacks = [
        _callback(Calls(), decisions={"best_metrics": {"acc/accuracy": "max"}}),
        ModelCheckpoint(monitor="eval/other/reward/mean/delta_best_ci_low", mode="max"),
        EarlyStopping(monitor="eval/probe/acc/accuracy/best", mode="max", patience=5),
    ]
    trainer = L.Trainer(max_steps=MAX_STEPS, default_root_dir=tmp_path, callbacks=callbacks, logger=False)
    trainer.fit(BoringModel())
    assert trainer.global_step == MAX_STEPS


def test_without_the_sanity_pass_the_first_round_is_checked_and_a_typo_is_never_a_nan_for_ever(tmp_path: Path) -> None:
    best = ModelCheckpoint(monitor="eval/probe/acc", mode="max")
    callback = _callback(Calls(), rounds={"sanity_batches": 0})
    trainer = L.Trainer(max_steps=MAX_STEPS, default_root_dir=tmp_path, callbacks=[callback, best], logger=False)
    with pytest.raises(MetricNameError, match=r"did you mean eval/probe/acc/accuracy\?"):
        trainer.fit(BoringModel())
    assert trainer.global_step == FREQ_STEPS  # the first round, recorded, then the refusal
    assert sorted({r["step"] for r in eval_rows(read_history(tmp_path))}) == [FREQ_STEPS]


def _sanity_on_ranks(rank: int, world_size: int, root: str) -> tuple[list[tuple[str, list[int]]], list[int]]:
    quiet()
    evaluate = Calls()
    trainer = L.Trainer(
        max_steps=MAX_STEPS,
        accelerator="cpu",
        devices=world_size,
        strategy="ddp",
        default_root_dir=root,
        callbacks=[_callback(evaluate)],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
    )
    trainer.fit(BoringModel())
    sanity = [(dataset, indices) for is_sanity, _, dataset, indices in evaluate.seen if is_sanity]
    return sanity, sorted({r["step"] for r in eval_rows(read_history(root))}) if rank == 0 else []


@pytest.mark.ddp
def test_the_sanity_pass_evaluates_a_real_batch_on_every_rank(tmp_path: Path) -> None:
    (rank0, steps), (rank1, _) = run_ddp(_sanity_on_ranks, 2, str(tmp_path))
    # Each rank its own first batch of each set (the sets' first two batches, dealt by cost).
    assert sorted(rank0 + rank1) == sorted(
        [("probe", [0, 1, 2, 3]), ("probe", [4, 5, 6, 7]), ("other", [0, 1, 2, 3]), ("other", [4, 5, 6, 7])]
    )
    assert len(rank0) == len(rank1) == 2
    assert steps == [3, 6]


def _no_outcomes(module: Any, batches: Any, ctx: Any) -> dict[str, Any]:
    reward = ctx.metric("reward", RewardMetric)  # reward/mean, with no per-prompt outcomes recorded
    for batch in batches:
        reward.update(module(torch.stack(batch.samples).to(ctx.device)).sum(dim=-1).double())
    return {}


@pytest.mark.parametrize("rule", ["lcb", "paired"])
def test_a_noise_aware_best_rule_without_outcomes_is_refused_before_step_one(tmp_path: Path, rule: str) -> None:
    from areal_lightning.callbacks.selection import NoiseUnknownError

    decisions = {"best_metrics": {"reward/mean": "max"}, "best_rule": rule}
    callback = EvaluationCallback(EVAL_SETS, _no_outcomes, schedule={"freq_steps": FREQ_STEPS}, decisions=decisions)
    trainer = L.Trainer(max_steps=MAX_STEPS, default_root_dir=tmp_path, callbacks=[callback], logger=False)
    message = rf"`Decisions\(best_rule='{rule}'\)` needs the per-prompt outcomes of 'reward/mean' on eval set 'probe'"
    with pytest.raises(NoiseUnknownError, match=message):
        trainer.fit(BoringModel())
    assert trainer.global_step == 0
