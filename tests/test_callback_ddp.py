"""`EvaluationCallback` under Lightning's DDP on 2 CPU processes (gloo): the ranks agree.

One launch (a module-scoped fixture) runs three short fits with ``Trainer(strategy="ddp",
accelerator="cpu", devices=2)`` inside processes that `run_ddp` started (Lightning sees the
launcher's environment and joins the existing process group instead of re-running the script):

* every trigger on, with a clock that runs 3x faster on rank 1 (its own time trigger would fire
  at other steps): both ranks must evaluate at rank 0's steps, and nothing may hang;
* ``threshold_action="stop"``: both ranks stop at the same step;
* an `evaluate_fn` that fails on rank 1 only: both ranks record the error and train on;
* an eval set too small to reach rank 1, with metrics created inside the batch loop (so rank 1
  never creates them): the round still reduces (rank 1 gets fresh copies), or, for a metric that
  cannot be copied, fails on both ranks with an error record instead of hanging (the first round,
  a sanity round: training stops on both ranks with the error).

A rank that decided alone would wait forever in a collective; `run_ddp`'s timeout turns that
into a test failure.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from callback_helpers import (
    QUIET_WARNINGS,
    CountingModule,
    FakeClock,
    grouped,
    history_steps,
    make_trainer,
    metric_by_step,
    probe_weights,
    quiet,
    reference_schedule,
)
from ddp_utils import run_ddp

from areal_lightning.callbacks.evaluation_callback import EvaluationCallback
from areal_lightning.eval_round import EvalRoundError
from areal_lightning.metrics import RewardMetric
from areal_lightning.tracking.history import eval_rows, event_rows, read_history

pytestmark = [pytest.mark.ddp, *(pytest.mark.filterwarnings(w) for w in QUIET_WARNINGS)]

WORLD_SIZE = 2
TIMEOUT_S = 120.0
SAMPLES_PER_EPOCH = 8  # 4 steps an epoch on each of the 2 ranks (Lightning's DistributedSampler)
EPOCH_LEN = SAMPLES_PER_EPOCH // WORLD_SIZE
MAX_STEPS = 11
STEP_SECS = {0: 0.75, 1: 2.25}  # rank 1's clock runs 3x faster
TRIGGERS: dict[str, Any] = {"freq_steps": 5, "freq_epochs": 2, "freq_secs": 2.0, "eval_before_train": True}
EVAL_SET = {"probe": list(range(7))}  # odd size: the ranks get different numbers of samples
STOP_SCRIPT = [0.9, 0.8, 0.3]  # mean reward at evaluations 1, 2, 3: crosses 0.7 downwards at the 3rd
THRESHOLD = 0.7
FAILING_STEP = 4
TINY_SET = {"tiny": [1.0, 2.0, 4.0]}  # one batch of the default size: rank 1 is dealt nothing


def _ddp_trainer(run_dir: Path, callbacks: list[Any], max_steps: int) -> Any:
    return make_trainer(run_dir, callbacks, max_steps, strategy="ddp", accelerator="cpu", devices=WORLD_SIZE)


def _stop_script(module: Any, batches: Any, ctx: Any) -> dict[str, Any]:
    reward = ctx.metric("reward", RewardMetric)
    for batch in batches:
        reward.update(torch.full((len(batch.samples),), STOP_SCRIPT[ctx.global_step // 2 - 1], dtype=torch.float64))
    return {}


def _fails_on_rank_1(module: Any, batches: Any, ctx: Any) -> dict[str, float]:
    if ctx.rank == 1 and ctx.global_step == FAILING_STEP:
        raise RuntimeError(f"rank-1-only failure at step {ctx.global_step}")
    return {"w": float(module.w)}


def _metrics_before_the_loop(module: Any, batches: Any, ctx: Any) -> dict[str, Any]:
    reward = ctx.metric("reward", RewardMetric)
    for batch in batches:  # never entered on a rank dealt no batch
        reward.update(torch.tensor(batch.samples, dtype=torch.float64))
    return {}


def _metrics_in_the_loop(module: Any, batches: Any, ctx: Any) -> dict[str, Any]:
    for batch in batches:  # never entered on a rank dealt no batch
        ctx.metric("reward", RewardMetric).update(torch.tensor(batch.samples, dtype=torch.float64))
    return {}


def _uncopyable_in_the_loop(module: Any, batches: Any, ctx: Any) -> dict[str, Any]:
    class LocalReward(RewardMetric):  # a class local to a function cannot be pickled to another rank
        pass

    for batch in batches:
        ctx.metric("reward", LocalReward).update(torch.tensor(batch.samples, dtype=torch.float64))
    return {}


def _fits(rank: int, world_size: int, root: str) -> dict[str, Any]:
    quiet()
    out: dict[str, Any] = {}

    clock = FakeClock()
    callback = EvaluationCallback(EVAL_SET, probe_weights, **grouped(clock=clock, **TRIGGERS))
    module = CountingModule(epoch_len=SAMPLES_PER_EPOCH, clock=clock, step_secs=STEP_SECS[rank])
    trainer = _ddp_trainer(Path(root) / "triggers", [callback], MAX_STEPS)
    trainer.fit(module)
    out["triggers"] = (callback.evaluated_steps, trainer.global_step, float(module.w))

    callback = EvaluationCallback(
        EVAL_SET,
        _stop_script,
        schedule={"freq_steps": 2},
        decisions={"metric_thresholds": {"reward": THRESHOLD}, "threshold_action": "stop"},
    )
    trainer = _ddp_trainer(Path(root) / "stop", [callback], 20)
    trainer.fit(CountingModule(epoch_len=SAMPLES_PER_EPOCH))
    out["stop"] = (callback.evaluated_steps, trainer.global_step)

    callback = EvaluationCallback(EVAL_SET, _fails_on_rank_1, schedule={"freq_steps": 2})
    trainer = _ddp_trainer(Path(root) / "error", [callback], 6)
    trainer.fit(CountingModule(epoch_len=SAMPLES_PER_EPOCH))
    out["error"] = (callback.evaluated_steps, trainer.global_step)

    callback = EvaluationCallback(TINY_SET, _metrics_before_the_loop, schedule={"freq_steps": 2})
    trainer = _ddp_trainer(Path(root) / "idle_rank", [callback], 6)
    trainer.fit(CountingModule(epoch_len=SAMPLES_PER_EPOCH))
    out["idle_rank"] = (callback.evaluated_steps, trainer.global_step)

    callback = EvaluationCallback(TINY_SET, _metrics_in_the_loop, schedule={"freq_steps": 3})
    trainer = _ddp_trainer(Path(root) / "in_loop", [callback], 6)
    trainer.fit(CountingModule(epoch_len=SAMPLES_PER_EPOCH))
    out["in_loop"] = (callback.evaluated_steps, trainer.global_step)

    callback = EvaluationCallback(TINY_SET, _uncopyable_in_the_loop, schedule={"freq_steps": 3})
    trainer = _ddp_trainer(Path(root) / "uncopyable", [callback], 6)
    try:
        trainer.fit(CountingModule(epoch_len=SAMPLES_PER_EPOCH))
        out["uncopyable"] = None
    except EvalRoundError as err:
        out["uncopyable"] = (str(err), trainer.global_step)
    return out


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    root = tmp_path_factory.mktemp("callback_ddp")
    return root, run_ddp(_fits, WORLD_SIZE, str(root), timeout_s=TIMEOUT_S)


def test_ranks_with_different_clocks_evaluate_at_the_same_steps(ddp_run: tuple[Path, list[dict[str, Any]]]) -> None:
    root, results = ddp_run
    expected = reference_schedule(MAX_STEPS, EPOCH_LEN, step_secs=STEP_SECS[0], **TRIGGERS)
    assert any("secs" in causes for _, causes in expected)  # rank 0's time trigger decides
    rank1_alone = reference_schedule(MAX_STEPS, EPOCH_LEN, step_secs=STEP_SECS[1], **TRIGGERS)
    assert rank1_alone != expected  # rank 1 alone would have evaluated at other steps
    for rank in range(WORLD_SIZE):
        evaluated, global_step, w = results[rank]["triggers"]
        assert evaluated == [step for step, _ in expected], f"rank {rank}"
        assert (global_step, w) == (MAX_STEPS, float(MAX_STEPS))
    assert history_steps(root / "triggers") == expected
    assert metric_by_step(root / "triggers", "w") == [(step, float(step)) for step, _ in expected]
    records = eval_rows(read_history(root / "triggers"))
    # One record per round (rank 0 writes alone), over the whole eval set, each sample once.
    assert all(r["world_size"] == WORLD_SIZE and r["num_prompts"] == len(EVAL_SET["probe"]) for r in records)
    assert all(r["metrics"]["sample_value"] == pytest.approx(3.0) for r in records)


def test_threshold_stop_stops_every_rank_at_the_same_step(ddp_run: tuple[Path, list[dict[str, Any]]]) -> None:
    root, results = ddp_run
    stop_step = 2 * len(STOP_SCRIPT)
    for rank in range(WORLD_SIZE):
        assert results[rank]["stop"] == ([2, 4, 6], stop_step), f"rank {rank}"
    alerts = event_rows(read_history(root / "stop"), "alert")
    assert [(a["step"], a["value"]) for a in alerts] == [(stop_step, pytest.approx(STOP_SCRIPT[-1]))]


def test_a_failure_on_one_rank_is_recorded_and_every_rank_trains_on(ddp_run: tuple[Path, list[dict[str, Any]]]) -> None:
    root, results = ddp_run
    for rank in range(WORLD_SIZE):
        assert results[rank]["error"] == ([2, 6], 6), f"rank {rank}"
    errors = event_rows(read_history(root / "error"), "error")
    assert [e["step"] for e in errors] == [FAILING_STEP]
    assert f"rank 1: RuntimeError: rank-1-only failure at step {FAILING_STEP}" in errors[0]["message"]
    assert [s for s, _ in history_steps(root / "error")] == [2, 6]


def test_metrics_declared_before_the_loop_reduce_when_a_rank_gets_no_batch(
    ddp_run: tuple[Path, list[dict[str, Any]]],
) -> None:
    root, results = ddp_run
    for rank in range(WORLD_SIZE):
        assert results[rank]["idle_rank"] == ([2, 4, 6], 6), f"rank {rank}"
    records = read_history(root / "idle_rank")
    rewards = TINY_SET["tiny"]
    rounds = [r for r in records if "event" not in r]
    assert [r["step"] for r in rounds] == [2, 4, 6]
    for record in rounds:
        assert record["metrics"]["reward/mean"] == pytest.approx(sum(rewards) / len(rewards))
        assert record["metrics"]["reward/max"] == max(rewards)
        assert record["num_prompts"] == len(rewards)


def test_a_metric_first_created_in_the_batch_loop_reaches_the_rank_that_never_created_it(
    ddp_run: tuple[Path, list[dict[str, Any]]],
) -> None:
    root, results = ddp_run
    for rank in range(WORLD_SIZE):
        assert results[rank]["in_loop"] == ([3, 6], 6), f"rank {rank}"
    records = read_history(root / "in_loop")
    assert event_rows(records, "error") == []
    rewards = TINY_SET["tiny"]
    for record in (r for r in records if "event" not in r):
        assert record["metrics"]["reward/mean"] == pytest.approx(sum(rewards) / len(rewards))
        assert record["num_prompts"] == len(rewards)


def test_a_metric_that_cannot_be_copied_fails_the_sanity_pass_on_every_rank(
    ddp_run: tuple[Path, list[dict[str, Any]]],
) -> None:
    root, results = ddp_run
    for rank in range(WORLD_SIZE):
        assert results[rank]["uncopyable"] is not None, f"rank {rank} trained on"
        message, step = results[rank]["uncopyable"]
        assert step == 0, f"rank {rank}"  # stopped by the sanity pass, before the first step
        assert "metric 'reward' exists only on some ranks (ranks [1] never created it" in message
        assert "create it with ctx.metric(...) before the batch loop" in message
        assert "sanity pass" in message
    errors = event_rows(read_history(root / "uncopyable"), "error")
    assert [(e["step"], e["dataset"]) for e in errors] == [(0, "tiny")]
