"""Evaluation under sharded parameters: FSDP2 `fully_shard` under Lightning's `ModelParallelStrategy`
on 2 and 3 gloo CPU processes.

Every forward all-gathers the parameters, so a rank that runs one forward more than another
pairs that all-gather with the other rank's next collective. The eval sets (1, 9 and 37 prompts,
batch 4) give the ranks different numbers of batches, and the warmed-up policy ends its
completions at EOS after different numbers of decode steps: without the round's padding batches
and fixed-length decoding the run hangs (until the timeout) or crashes. The results must equal one
process evaluating the same weights without any sharding.
"""

from __future__ import annotations

import math
import tempfile
from typing import Any

import pytest
import torch
from callback_helpers import QUIET_WARNINGS, make_trainer, quiet, round_metrics
from ddp_utils import run_ddp
from lightning.pytorch.strategies import DDPStrategy, DeepSpeedStrategy, ModelParallelStrategy, SingleDeviceStrategy
from typing_extensions import override

from areal_lightning.app.builders import build_eval_sets, build_module
from areal_lightning.app.config import Config, load_config
from areal_lightning.callbacks.evaluation_callback import EvaluationCallback
from areal_lightning.callbacks.parallelism import UnsupportedStrategyError, forwards_in_lockstep, refuse_for_async
from areal_lightning.eval_round import EvalSet, run_round
from areal_lightning.eval_round.round import local_batches, padding_batches
from areal_lightning.rl.grpo.module import GRPOModule
from areal_lightning.rl.grpo.warmup import format_warmup
from areal_lightning.rl.rollout_eval import rollout_evaluate
from areal_lightning.tracking.history import eval_rows, read_history

pytestmark = [*(pytest.mark.filterwarnings(w) for w in QUIET_WARNINGS)]

TIMEOUT_S = 240.0
SET_SIZES = {"one": 1, "nine": 9, "thirty_seven": 37}
WARMUP_STEPS = 40  # enough for completions to end at EOS after 2-4 tokens, at different steps per batch
OVERRIDES = [
    *(f"eval_sets.{name}.size={size}" for name, size in SET_SIZES.items()),
    *(
        f"eval_sets.{name}.{key}={value}"
        for name in SET_SIZES
        for key, value in (("batch_size", 4), ("n_samples", 2), ("temperature", 1.0))
    ),
    "policy.d_model=32",
    "policy.n_layers=2",
    "seed=3",
    f"grpo.warmup_steps={WARMUP_STEPS}",
]


class ShardedGRPO(GRPOModule):
    """`GRPOModule` with its policy sharded by FSDP2 over every rank (or split by tensor parallelism)."""

    tensor_parallel = False

    @override
    def configure_model(self) -> None:
        from torch.distributed.fsdp import fully_shard

        if self.tensor_parallel:
            from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module

            parallelize_module(self.policy.blocks[0].qkv, self.device_mesh["tensor_parallel"], ColwiseParallel())
            return
        mesh = self.device_mesh["data_parallel"]
        for block in self.policy.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(self.policy, mesh=mesh)

    @override
    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        # One forward on every rank: the test is about evaluation, not GRPO under FSDP.
        ids, mask = batch["prompt_ids"], batch["prompt_mask"]
        positions = (mask.long().cumsum(dim=1) - 1).clamp(min=0)
        return self.policy(ids, mask, positions).mean() * 0.0


def _config() -> Config:
    return load_config(None, OVERRIDES)


def _warmed_module(cfg: Config, cls: type[GRPOModule] = GRPOModule) -> GRPOModule:
    module = build_module(cfg, cls)
    format_warmup(module.policy, module.task, steps=cfg.grpo.warmup_steps, lr=cfg.grpo.warmup_lr, seed=cfg.seed)
    module.warmed_up = True
    return module


def _fit_sharded(rank: int, world_size: int, tensor_parallel: bool = False) -> Any:
    quiet()
    cfg = _config()
    module = _warmed_module(cfg, ShardedGRPO)
    module.tensor_parallel = tensor_parallel
    eval_sets = build_eval_sets(cfg, module.task)
    sizes = (1, world_size) if tensor_parallel else (world_size, 1)
    with tempfile.TemporaryDirectory() as run_dir:
        callback = EvaluationCallback(
            eval_sets,
            schedule={"eval_before_train": True, "eval_at_end": False},
            rounds={"on_error": "raise"},
            output_dir=run_dir,
            seed=cfg.seed,
        )
        strategy = ModelParallelStrategy(data_parallel_size=sizes[0], tensor_parallel_size=sizes[1])
        trainer = make_trainer(run_dir, [callback], max_steps=1, strategy=strategy, devices=world_size)
        try:
            trainer.fit(module)
        except UnsupportedStrategyError as err:
            return str(err)
        return eval_rows(read_history(run_dir)) if rank == 0 else None


def _single_process_results() -> dict[str, Any]:
    cfg = _config()
    module = _warmed_module(cfg)
    results = run_round(
        module, build_eval_sets(cfg, module.task), rollout_evaluate, seed=cfg.seed, global_step=0, epoch=0
    )
    return {r.dataset: r for r in results}


@pytest.mark.ddp
@pytest.mark.parametrize("world_size", [2, 3])
def test_fully_sharded_rounds_equal_one_unsharded_process(world_size: int) -> None:
    rows = run_ddp(_fit_sharded, world_size, timeout_s=TIMEOUT_S)[0]
    reference = _single_process_results()
    assert [r["dataset"] for r in rows] == list(SET_SIZES)  # one round, every set recorded once
    for row in rows:
        expected = reference[row["dataset"]]
        assert row["num_prompts"] == SET_SIZES[row["dataset"]] == expected.num_prompts
        assert row["num_samples"] == expected.num_samples
        assert row["world_size"] == world_size
        assert round_metrics(row["metrics"]).keys() == expected.metrics.keys()
        for name, value in expected.metrics.items():
            got = row["metrics"][name]  # NaN (a stderr of one prompt) is null in the history
            assert got == value or (got is None and math.isnan(value)), (row["dataset"], name)  # bit for bit


@pytest.mark.ddp
def test_tensor_parallel_model_is_refused_before_any_round() -> None:
    messages = run_ddp(_fit_sharded, 2, True, timeout_s=TIMEOUT_S)
    assert messages[0] == messages[1]
    assert "cannot evaluate a tensor-parallel model: parameter 'policy.blocks.0.qkv.weight'" in messages[0]
    assert "tensor_parallel_size=1" in messages[0]


def test_lockstep_follows_the_strategy() -> None:
    layer = torch.nn.Linear(2, 2)
    assert not forwards_in_lockstep(SingleDeviceStrategy(torch.device("cpu")), layer)
    assert not forwards_in_lockstep(DDPStrategy(), layer)
    assert forwards_in_lockstep(ModelParallelStrategy(), layer)


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_deepspeed_stages_get_one_answer_for_lockstep_and_async(stage: int) -> None:
    # DeepSpeed is not installed here, so the strategy is built without its constructor (which
    # imports it); `zero_stage_3` is Lightning's own property reading the ZeRO config.
    strategy = object.__new__(DeepSpeedStrategy)
    strategy.config = {"zero_optimization": {"stage": stage}}
    layer = torch.nn.Linear(2, 2)
    sharded = stage == 3  # stages 1-2 shard optimizer state and gradients, never the parameters
    assert forwards_in_lockstep(strategy, layer) is sharded
    if sharded:
        with pytest.raises(ValueError, match="does not support DeepSpeedStrategy: its parameters are sharded"):
            refuse_for_async(strategy)
    else:
        refuse_for_async(strategy)  # whole weights on every rank: a snapshot can be copied


@pytest.mark.parametrize("world_size", [2, 3, 4, 7])
def test_padding_brings_every_rank_to_the_busiest_ranks_batch_count(world_size: int) -> None:
    eval_set = EvalSet("odd", list(range(9)), batch_size=2, cost_fn=lambda i: 1.0 + (i * 7) % 4)
    dealt = [local_batches(eval_set, 0, rank, world_size) for rank in range(world_size)]
    padded = [padding_batches(eval_set, 0, rank, world_size) for rank in range(world_size)]
    busiest = max(len(d) for d in dealt)
    assert [len(d) + len(p) for d, p in zip(dealt, padded, strict=True)] == [busiest] * world_size
    assert any(padded)  # the case under test: some rank pads
    cheapest = min(range(9), key=lambda i: (1.0 + (i * 7) % 4, i))
    assert {tuple(b.indices) for p in padded for b in p} == {(cheapest,)}
