"""Stratified subsets: proportional, at least one per stratum, stable across rounds, the same
prompts evaluated on 1 and 2 ranks; configured per eval set in YAML."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from callback_helpers import CountingModule, make_trainer
from ddp_utils import run_ddp

from areal_lightning.app.builders import build_callback, build_eval_sets
from areal_lightning.app.config import ConfigError, load_config
from areal_lightning.eval_round import EvalBatch, EvalContext, run_round
from areal_lightning.eval_round.subsample import allocate, stratified_indices
from areal_lightning.tasks.arithmetic import ArithmeticTask
from areal_lightning.tracking.history import eval_rows, read_history

OVERRIDES = ["eval_sets.easy.size=80", "eval_sets.easy.batch_size=7", "eval_sets.easy.subsample.max_prompts=30"]


@pytest.mark.parametrize(
    "sizes,k",
    [
        ({"a": 70, "b": 25, "c": 5}, 10),
        ({"a": 500, "b": 3, "c": 1}, 20),
        ({"a": 13, "b": 7, "c": 11, "d": 1}, 17),
        ({"a": 5, "b": 5}, 10),
    ],
)
def test_allocation_is_proportional_with_one_per_stratum(sizes: dict[str, int], k: int) -> None:
    alloc = allocate(sizes, k)
    total = sum(sizes.values())
    assert sum(alloc.values()) == k
    held = {s for s, n in sizes.items() if k * n / total < 1}  # raised to the minimum of one
    rest = {s: n for s, n in sizes.items() if s not in held}
    for s, n in sizes.items():
        assert 1 <= alloc[s] <= n
    for s, n in rest.items():  # the other places are shared in proportion, within one place
        assert abs(alloc[s] - (k - len(held)) * n / sum(rest.values())) < 1, s
    assert all(alloc[s] == 1 for s in held)


def test_fewer_places_than_strata_go_to_the_largest_strata() -> None:
    assert allocate({"a": 1, "b": 9, "c": 4}, 2) == {"a": 0, "b": 1, "c": 1}


def test_subset_is_stable_and_its_seed_matters() -> None:
    strata = ["x" if i % 3 else "y" for i in range(99)]
    first = stratified_indices(strata, 20, seed=5)
    assert first == stratified_indices(strata, 20, seed=5) and len(set(first)) == 20
    assert first != stratified_indices(strata, 20, seed=6)
    assert Counter(strata[i] for i in first) == {"x": 13, "y": 7}  # 66:33 of 99 -> 13.3 : 6.7


def test_arithmetic_eval_set_keeps_the_share_of_two_digit_sums() -> None:
    cfg = load_config(None, OVERRIDES)
    full = ArithmeticTask(seed=cfg.seed).make_samples("easy", 1, 80)
    (subset,) = build_eval_sets(cfg, ArithmeticTask(seed=cfg.seed))
    share = sum(s.stratum == "sum2" for s in full) / len(full)
    assert len(subset.samples) == 30
    assert abs(sum(s.stratum == "sum2" for s in subset.samples) - 30 * share) < 1


def _record_prompts(module: Any, batches: list[EvalBatch], ctx: EvalContext) -> dict[str, float]:
    for batch in batches:
        for index, sample in zip(batch.indices, batch.samples, strict=True):
            ctx.record_sample(index, prompt=sample.prompt, rank=ctx.rank)
    return {}


def _evaluated_prompts(rank: int, world_size: int) -> list[str]:
    import torch

    cfg = load_config(None, OVERRIDES)
    (result,) = run_round(
        torch.nn.Linear(1, 1),
        build_eval_sets(cfg, ArithmeticTask(seed=cfg.seed)),
        _record_prompts,
        seed=cfg.seed,
        global_step=0,
        epoch=0,
        max_table_rows=1000,
    )
    assert result.num_prompts == 30
    return [row["prompt"] for row in result.table_rows]


@pytest.mark.ddp
def test_the_same_subset_is_evaluated_on_one_and_two_ranks() -> None:
    one = _evaluated_prompts(0, 1)
    two = run_ddp(_evaluated_prompts, 2, timeout_s=120.0)
    assert one == two[0] == two[1] and len(one) == 30


def test_history_counts_the_subset_every_round(tmp_path: Path) -> None:
    cfg = load_config(None, [*OVERRIDES, "evaluator.freq_steps=2", f"output_dir={tmp_path}"])
    cb = build_callback(cfg, evaluate_fn=_record_prompts)
    make_trainer(tmp_path, [cb], 4).fit(CountingModule())
    assert [r["num_prompts"] for r in eval_rows(read_history(tmp_path))] == [30, 30]


def test_config_needs_exactly_one_size() -> None:
    with pytest.raises(ConfigError, match=r"eval_sets\.easy\.subsample needs exactly one of max_prompts and fraction"):
        load_config(None, ["eval_sets.easy.subsample.max_prompts=3", "eval_sets.easy.subsample.fraction=0.5"])
    with pytest.raises(ConfigError, match=r"eval_sets.easy.subsample.fraction must be a number in \(0, 1\]"):
        load_config(None, ["eval_sets.easy.subsample.fraction=1.5"])
