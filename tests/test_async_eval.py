"""`EvaluationCallback(mode="async")` in one process: the same results as sync, training goes on
while a round is in flight, worker failures surface, a resume neither loses nor repeats a round.

Training progress is observed through a gate file: a callback writes each finished global step
to it, and a gated `evaluate_fn` (running in the worker process) waits until training reached a
later step. If training waited for the round, the gate would never open and the round would
fail after `GATE_TIMEOUT_S` instead of recording.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import time
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from callback_helpers import QUIET_WARNINGS, CountingModule, make_trainer, metric_by_step, probe_weights
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from procs import run_in_group

from areal_lightning.app.builders import build_eval_sets, build_module
from areal_lightning.app.config import ConfigError, load_config
from areal_lightning.callbacks.evaluation_callback import EvaluationCallback
from areal_lightning.callbacks.runners import AsyncRunner
from areal_lightning.eval_round import EvalRoundError, EvalSet
from areal_lightning.rl.grpo.module import GRPOModule
from areal_lightning.rl.rollout_eval import rollout_evaluate
from areal_lightning.tracking.history import eval_rows, event_rows, read_history

pytestmark = [pytest.mark.filterwarnings(w) for w in QUIET_WARNINGS]

GATE_TIMEOUT_S = 60.0
SCRIPT_TIMEOUT_S = 240
PROBES = [1, 2, 3]


class GateWriter(Callback):
    """Writes the global step to a file after every optimizer step (the worker reads it)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        self.write(trainer.global_step)

    def write(self, step: int) -> None:
        # Replaced whole, never truncated in place: the worker must not read a half-written file.
        self.path.with_suffix(".tmp").write_text(str(step))
        self.path.with_suffix(".tmp").replace(self.path)


class GateOpensAtTheEnd(GateWriter):
    """`GateWriter`, and at the end of training one step more than it ran: before the evaluation
    callback's own ``on_train_end`` (listed after this one), which waits for the round in flight."""

    def on_train_end(self, trainer: L.Trainer, *args: Any) -> None:
        self.write(trainer.global_step + 1)


def gated_probe(module: Any, batches: Any, ctx: Any) -> dict[str, Any]:
    """`probe_weights`, but the round of `gate_step` returns only once training reached `open_at`."""
    if ctx.global_step == ctx.options["gate_step"]:
        gate, deadline = Path(ctx.options["gate"]), time.monotonic() + GATE_TIMEOUT_S
        while not (gate.exists() and int(gate.read_text()) >= ctx.options["open_at"]):
            if time.monotonic() > deadline:
                raise TimeoutError(f"training never reached step {ctx.options['open_at']} during the round")
            time.sleep(0.01)
    return probe_weights(module, batches, ctx)


def fails_at_step_4(module: Any, batches: Any, ctx: Any) -> dict[str, Any]:
    if ctx.global_step == 4:
        raise ValueError("broken evaluate_fn at step 4")
    return probe_weights(module, batches, ctx)


def worker_dies_at_step_4(module: Any, batches: Any, ctx: Any) -> dict[str, Any]:
    if ctx.global_step == 4:
        os._exit(7)
    return probe_weights(module, batches, ctx)


def _gated_set(gate: Path, gate_step: int, open_at: int) -> list[EvalSet]:
    return [EvalSet("probe", PROBES, options={"gate": str(gate), "gate_step": gate_step, "open_at": open_at})]


def _no_worker_left(callback: EvaluationCallback) -> None:
    assert [p for p in multiprocessing.active_children() if p.name == "areal-lightning-async-eval"] == []


def rollouts_and_weights(module: Any, batches: Any, ctx: Any) -> dict[str, Any]:
    """The default GRPO evaluation, plus a number that changes with every weight update."""
    rollout_evaluate(module, batches, ctx)
    return {"param_sum": float(sum(p.double().sum() for p in module.policy.parameters()))}


def _grpo_fit(run_dir: Path, mode: str) -> GRPOModule:
    cfg = load_config(
        None,
        [
            "eval_sets.easy.size=12",
            "eval_sets.easy.batch_size=5",
            "grpo.warmup_steps=100",
            "grpo.prompts_per_step=8",
            "grpo.group_size=8",
            "task.train_size=16",
            # seed 3 drew steps 1-2 with every group's rewards equal (zero advantages, no update)
            "seed=1",
        ],
    )
    L.seed_everything(cfg.seed, verbose=False)
    module = build_module(cfg)
    callback = EvaluationCallback(
        build_eval_sets(cfg, module.task),
        rollouts_and_weights,
        schedule={"freq_steps": 2, "eval_before_train": True},
        execution={"mode": mode, "on_busy": "wait"},
        seed=cfg.seed,
    )
    make_trainer(run_dir, [callback], 5).fit(module)
    return module


@pytest.mark.process
def test_async_and_sync_record_identical_metrics_at_identical_steps(tmp_path: Path) -> None:
    _grpo_fit(tmp_path / "sync", "sync")
    module = _grpo_fit(tmp_path / "async", "async")
    sync, asyn = eval_rows(read_history(tmp_path / "sync")), eval_rows(read_history(tmp_path / "async"))
    assert [r["step"] for r in sync] == [0, 2, 4, 5]
    assert [(r["step"], r["trigger"], r["metrics"]) for r in asyn] == [
        (r["step"], r["trigger"], r["metrics"]) for r in sync
    ]
    assert {r["mode"] for r in asyn} == {"async"} and {r["mode"] for r in sync} == {"sync"}
    assert len({r["metrics"]["param_sum"] for r in sync}) == 4  # the weights changed between rounds
    assert {"reward/mean", "accuracy", "pass@4", "maj@4"} <= set(asyn[0]["metrics"])
    weights_mb = sum(t.numel() * t.element_size() for t in module.state_dict().values()) / 2**20
    assert {r["snapshot_mib"] for r in asyn} == {weights_mb} and all(r["snapshot_secs"] > 0 for r in asyn)
    # on_busy=wait: a round is collected before the next one starts, the last one at the end of the fit.
    steps = [r["step"] for r in asyn]
    assert all(0 <= r["lag_steps"] <= later - r["step"] for r, later in zip(asyn, [*steps[1:], steps[-1]], strict=True))


@pytest.mark.process
def test_training_advances_while_a_round_is_in_flight_and_a_busy_round_is_skipped(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    callback = EvaluationCallback(
        _gated_set(gate, gate_step=4, open_at=9), gated_probe, schedule={"freq_steps": 4}, execution={"mode": "async"}
    )
    make_trainer(tmp_path, [GateWriter(gate), callback], 10).fit(CountingModule(epoch_len=5))
    rows = eval_rows(read_history(tmp_path))
    assert [(r["step"], r["trigger"]) for r in rows] == [(4, ["steps"]), (10, ["end"])]
    assert metric_by_step(tmp_path, "w") == [(4, 4.0), (10, 10.0)]  # each round saw its snapshot's weights
    # Recorded at step 4; collected once training reached step 9 (the gate) and at the end (10) at the latest.
    assert 5 <= rows[0]["lag_steps"] <= 6
    skipped = event_rows(read_history(tmp_path), "skipped")
    assert [(e["step"], e["running_step"], e["trigger"]) for e in skipped] == [(8, 4, ["steps"])]
    assert callback.evaluated_steps == [4, 10]
    _no_worker_left(callback)


@pytest.mark.process
def test_the_last_steps_round_skipped_while_busy_is_the_end_round_of_the_final_weights(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    callback = EvaluationCallback(
        _gated_set(gate, gate_step=4, open_at=9), gated_probe, schedule={"freq_steps": 4}, execution={"mode": "async"}
    )
    # The round of step 4 runs until training has ended: the round due at step 8, the last, is skipped.
    make_trainer(tmp_path, [GateOpensAtTheEnd(gate), callback], 8).fit(CountingModule(epoch_len=5))
    skipped = event_rows(read_history(tmp_path), "skipped")
    assert [(e["step"], e["running_step"], e["trigger"]) for e in skipped] == [(8, 4, ["steps", "end"])]
    # The end round evaluates the final weights once, recorded at the last step.
    rows = eval_rows(read_history(tmp_path))
    assert [(r["step"], r["trigger"]) for r in rows] == [(4, ["steps"]), (8, ["end"])]
    assert metric_by_step(tmp_path, "w") == [(4, 4.0), (8, 8.0)]
    assert callback.evaluated_steps == [4, 8]
    _no_worker_left(callback)


@pytest.mark.process
def test_on_busy_wait_evaluates_every_due_step(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    callback = EvaluationCallback(
        _gated_set(gate, gate_step=2, open_at=3),
        gated_probe,
        schedule={"freq_steps": 2, "eval_at_end": False},
        execution={"mode": "async", "on_busy": "wait"},
    )
    make_trainer(tmp_path, [GateWriter(gate), callback], 8).fit(CountingModule(epoch_len=5))
    assert metric_by_step(tmp_path, "w") == [(2, 2.0), (4, 4.0), (6, 6.0), (8, 8.0)]
    assert event_rows(read_history(tmp_path), "skipped") == []


@pytest.mark.process
def test_a_failing_evaluate_fn_surfaces_with_its_worker_traceback(tmp_path: Path) -> None:
    callback = EvaluationCallback(
        {"probe": PROBES},
        fails_at_step_4,
        schedule={"freq_steps": 2},
        execution={"mode": "async", "on_busy": "wait"},
        rounds={"on_error": "raise"},
    )
    with pytest.raises(EvalRoundError) as info:
        make_trainer(tmp_path, [callback], 10).fit(CountingModule(epoch_len=5))
    message = str(info.value)
    assert "ValueError: broken evaluate_fn at step 4" in message
    assert "Traceback" in message and "in fails_at_step_4" in message  # the worker's own traceback
    _no_worker_left(callback)


@pytest.mark.process
def test_a_dead_worker_is_an_error_record_and_the_next_round_gets_a_new_worker(tmp_path: Path) -> None:
    callback = EvaluationCallback(
        {"probe": PROBES},
        worker_dies_at_step_4,
        schedule={"freq_steps": 2},
        execution={"mode": "async", "on_busy": "wait"},
    )
    make_trainer(tmp_path, [callback], 8).fit(CountingModule(epoch_len=5))
    errors = event_rows(read_history(tmp_path), "error")
    assert [e["step"] for e in errors] == [4]
    assert "worker process exited with code 7" in errors[0]["message"]
    assert metric_by_step(tmp_path, "w") == [(2, 2.0), (6, 6.0), (8, 8.0)]
    _no_worker_left(callback)


class Killed(RuntimeError):
    """Stands for a crash of the training process."""


class KillAfterStep(Callback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        if trainer.global_step == self.step:
            raise Killed(f"killed after step {self.step}")


@pytest.mark.process
def test_a_checkpoint_taken_with_a_round_in_flight_resumes_without_losing_or_repeating_it(tmp_path: Path) -> None:
    gate = tmp_path / "gate"

    def fit(kill_after: int | None, ckpt: Path | None) -> EvaluationCallback:
        # The round of step 4 is still running at step 5, when the checkpoint is taken.
        callback = EvaluationCallback(
            _gated_set(gate, gate_step=4, open_at=5),
            gated_probe,
            schedule={"freq_steps": 4},
            execution={"mode": "async"},
        )
        callbacks: list[Callback] = [
            GateWriter(gate),
            callback,
            ModelCheckpoint(
                dirpath=tmp_path / "ckpt",
                filename="step{step}",
                auto_insert_metric_name=False,
                every_n_train_steps=5,
                save_top_k=-1,
            ),
        ]
        if kill_after is not None:
            callbacks.append(KillAfterStep(kill_after))
        make_trainer(tmp_path, callbacks, 12).fit(CountingModule(epoch_len=5), ckpt_path=ckpt)
        return callback

    with pytest.raises(Killed):  # right after the checkpoint: a round still running would be lost
        fit(kill_after=5, ckpt=None)
    first = eval_rows(read_history(tmp_path))
    assert [(r["step"], r["lag_steps"]) for r in first] == [(4, 1)]  # finished for the checkpoint of step 5
    assert [p for p in multiprocessing.active_children() if p.name == "areal-lightning-async-eval"] == []
    resumed = fit(kill_after=None, ckpt=tmp_path / "ckpt" / "step5.ckpt")
    assert metric_by_step(tmp_path, "w") == [(4, 4.0), (8, 8.0), (12, 12.0)]
    assert resumed.evaluated_steps == [8, 12]


def test_a_snapshot_over_the_memory_bound_is_refused_before_training(tmp_path: Path) -> None:
    callback = EvaluationCallback(
        {"probe": PROBES},
        probe_weights,
        schedule={"freq_steps": 2},
        execution={"mode": "async", "max_snapshot_mib": 1e-6},
    )
    module = CountingModule(epoch_len=5)
    with pytest.raises(
        ValueError,
        match=r"async evaluation needs a 0\.0 MiB snapshot of CountingModule's weights, more "
        r"than max_snapshot_mib=1e-06; raise max_snapshot_mib",
    ):
        make_trainer(tmp_path, [callback], 4).fit(module)
    assert float(module.w.detach()) == 0.0  # not one step trained


def test_a_lambda_evaluate_fn_is_a_clear_error_in_async_mode(tmp_path: Path) -> None:
    callback = EvaluationCallback(
        {"probe": PROBES}, lambda m, b, c: {}, schedule={"freq_steps": 2}, execution={"mode": "async"}
    )
    with pytest.raises(ValueError, match="mode='async' evaluates in a worker process, so the module, evaluate_fn"):
        make_trainer(tmp_path, [callback], 4).fit(CountingModule(epoch_len=5))


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("evaluator.on_busy=later", "evaluator.on_busy must be one of skip, wait; got 'later'"),
        ("evaluator.async_threads=0", "evaluator.async_threads must be a positive integer, got 0"),
        (
            "evaluator.max_snapshot_mib=-1",
            "evaluator.max_snapshot_mib must be a positive number of MiB or null, got -1.0",
        ),
        (
            "evaluator.async_device=gpu9",
            "evaluator.async_device must be a device string (cpu, cuda:1) or null, got 'gpu9'",
        ),
    ],
)
def test_async_config_errors_name_the_key(override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_config(None, ["eval_sets.easy.size=4", override])


@pytest.mark.process
def test_async_config_builds_an_async_callback(tmp_path: Path) -> None:
    from areal_lightning.app.builders import build_callback

    def from_config(run: Path, *overrides: str) -> EvaluationCallback:
        options = ["eval_sets.easy.size=4", "evaluator.mode=async", "evaluator.on_busy=wait", f"output_dir={run}"]
        options += ["evaluator.freq_steps=2", "evaluator.async_device=cpu", *overrides]
        return build_callback(load_config(None, options), {"probe": PROBES}, probe_weights)

    callback = from_config(tmp_path / "a", "evaluator.max_snapshot_mib=16")
    make_trainer(tmp_path / "a", [callback], 4).fit(CountingModule())
    records = read_history(tmp_path / "a")
    # Rounds recorded as async (with their snapshot), none skipped although rounds overlap: on_busy=wait.
    assert [(r["step"], r["mode"]) for r in eval_rows(records)] == [(2, "async"), (4, "async")]
    assert all(r["snapshot_mib"] > 0 for r in eval_rows(records)) and event_rows(records, "skipped") == []
    # max_snapshot_mib reaches the evaluator: a bound below the weights' size stops the run before training.
    with pytest.raises(ValueError, match=r"more than max_snapshot_mib=1e-06; raise max_snapshot_mib"):
        make_trainer(tmp_path / "b", [from_config(tmp_path / "b", "evaluator.max_snapshot_mib=0.000001")], 4).fit(
            CountingModule()
        )


def test_sharded_strategies_are_refused_with_a_clear_message(tmp_path: Path) -> None:
    from lightning.pytorch.strategies import DDPStrategy, FSDPStrategy, ModelParallelStrategy

    from areal_lightning.callbacks.parallelism import refuse_for_async

    for strategy in (FSDPStrategy(), ModelParallelStrategy()):
        with pytest.raises(
            ValueError,
            match=rf"mode='async'\)` does not support {type(strategy).__name__}: its "
            "parameters are sharded",
        ):
            refuse_for_async(strategy)
    refuse_for_async(DDPStrategy())  # whole weights on every rank: accepted
    # And a fit refuses it before training: the callback runs the check when the Trainer sets it up
    # (FSDP2 under ModelParallelStrategy runs on CPU, one process over gloo).
    callback = EvaluationCallback(
        {"probe": PROBES}, probe_weights, schedule={"freq_steps": 2}, execution={"mode": "async"}
    )
    module = CountingModule()
    environ = dict(os.environ)  # the strategy sets MASTER_ADDR, MASTER_PORT, ... for its process group
    try:
        with pytest.raises(ValueError, match=r"does not support ModelParallelStrategy: its parameters are sharded"):
            make_trainer(tmp_path, [callback], 2, strategy=ModelParallelStrategy()).fit(module)
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
        os.environ.clear()
        os.environ.update(environ)
    assert float(module.w) == 0.0 and not (tmp_path / "eval_history.jsonl").exists()  # no step, no round


UNGUARDED_SCRIPT = """
import sys
sys.path.insert(0, {tests!r})
from callback_helpers import CountingModule, make_trainer, probe_weights
from areal_lightning.callbacks.evaluation_callback import EvaluationCallback

callback = EvaluationCallback(
    {{"probe": [1, 2]}}, probe_weights, schedule={{"freq_steps": 2}}, execution={{"mode": "async", "on_busy": "wait"}}
)
make_trainer({root!r}, [callback], 2).fit(CountingModule(epoch_len=5))
"""


@pytest.mark.process
def test_a_script_without_a_main_guard_is_told_why_its_worker_died(tmp_path: Path) -> None:
    # Spawned workers import the script's module; unguarded, it trains again there and dies starting a worker.
    script = tmp_path / "train.py"
    script.write_text(UNGUARDED_SCRIPT.format(tests=str(Path(__file__).parent), root=str(tmp_path / "run")))
    done = run_in_group([sys.executable, str(script)], timeout=SCRIPT_TIMEOUT_S, cwd=tmp_path)
    # The first round is a sanity round: its failure stops the script, with the reason.
    assert done.returncode != 0
    assert '`if __name__ == "__main__":` guard' in done.stderr
    errors = event_rows(read_history(tmp_path / "run"), "error")
    assert len(errors) == 1 and '`if __name__ == "__main__":` guard' in errors[0]["message"]


def matmul_dtype(module: Any, batches: Any, ctx: Any) -> dict[str, Any]:
    """1.0 when a matmul in the round runs in bfloat16 (under the eval precision's autocast)."""
    out = torch.ones(1, 2) @ torch.ones(2, 2)
    return {"bf16": float(out.dtype == torch.bfloat16)}


@pytest.mark.process
@pytest.mark.parametrize("precision", [32, "bf16"])
def test_the_worker_evaluates_at_the_eval_precision(tmp_path: Path, precision: Any) -> None:
    callback = EvaluationCallback(
        {"probe": PROBES},
        matmul_dtype,
        schedule={"freq_steps": 2},
        execution={"mode": "async", "on_busy": "wait"},
        rounds={"precision": precision},
    )
    make_trainer(tmp_path, [callback], 2).fit(CountingModule(epoch_len=5))
    assert metric_by_step(tmp_path, "bf16") == [(2, 1.0 if precision == "bf16" else 0.0)]


def test_the_result_cache_with_async_is_refused_naming_both() -> None:
    with pytest.raises(
        ValueError, match=r"`EvaluationCallback\(...\)` cannot use rounds.cache with execution.mode async"
    ):
        EvaluationCallback({"probe": PROBES}, probe_weights, execution={"mode": "async"}, rounds={"cache": True})
    with pytest.raises(
        ConfigError, match=r"evaluator cannot use rounds.cache with execution.mode async.*set cache to false"
    ):
        load_config(None, ["eval_sets.easy.size=4", "evaluator.mode=async", "evaluator.cache=true"])


class ThreadLog(Callback):
    """Torch's intra-op thread count at the start of each training step, by global step."""

    def __init__(self) -> None:
        self.threads: dict[int, int] = {}

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        self.threads[trainer.global_step] = torch.get_num_threads()


class WaitForWorkerStart(Callback):
    """Before the second step, waits until the async worker has started (it imports for seconds)."""

    def __init__(self, callback: EvaluationCallback) -> None:
        self.callback = callback

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        runner, deadline = self.callback.runner, time.monotonic() + GATE_TIMEOUT_S
        assert isinstance(runner, AsyncRunner)
        evaluator = runner.evaluator
        while trainer.global_step == 1 and evaluator._starting:
            assert time.monotonic() < deadline, "the worker never started"
            evaluator.poll_start()
            time.sleep(0.01)


@pytest.mark.process
def test_training_lends_the_worker_its_threads_while_it_starts_and_evaluates(tmp_path: Path) -> None:
    gate, log = tmp_path / "gate", ThreadLog()
    callback = EvaluationCallback(
        _gated_set(gate, gate_step=4, open_at=6), gated_probe, schedule={"freq_steps": 4}, execution={"mode": "async"}
    )
    before = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        callbacks = [GateWriter(gate), WaitForWorkerStart(callback), log, callback]
        make_trainer(tmp_path, callbacks, 10).fit(CountingModule(epoch_len=5))
        after = torch.get_num_threads()
    finally:
        torch.set_num_threads(before)
    # Step 1 runs while the worker imports; the round submitted after step 4 cannot finish before
    # training reached step 6.
    assert [log.threads[s] for s in range(6)] == [2, 3, 3, 3, 2, 2]
    assert after == 3  # given back, also after the end
    assert metric_by_step(tmp_path, "w")[0] == (4, 4.0)
