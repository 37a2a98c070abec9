"""An evaluation round of an `HFPolicy` on a GSM8K file gives every sample the same sampled
completion on 1 rank in one batch and on 2 ranks in small batches (per-sample seeds), and the
same metrics."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")
from ddp_utils import run_ddp
from hf_models import save_tiny_llama, write_gsm8k

PROMPTS = 7  # odd: the two ranks get different numbers of samples
TIMEOUT_S = 300.0


def _round(rank: int, world_size: int, overrides: list[str]) -> list[Any]:
    import torch

    from areal_lightning.app.builders import build_eval_sets, build_module
    from areal_lightning.app.config import load_config
    from areal_lightning.eval_round import check_eval_sets_consistent, run_round
    from areal_lightning.rl.rollout_eval import rollout_evaluate

    torch.set_num_threads(1)
    cfg = load_config(None, overrides)
    module = build_module(cfg)  # loads the same saved weights on every rank
    eval_sets = build_eval_sets(cfg)
    check_eval_sets_consistent(eval_sets)
    return run_round(module, eval_sets, rollout_evaluate, seed=cfg.seed, global_step=0, epoch=0, max_table_rows=PROMPTS)


@pytest.mark.ddp
@pytest.mark.slow
def test_hf_completions_and_metrics_match_on_one_and_two_ranks(tmp_path: Path) -> None:
    model = save_tiny_llama(tmp_path / "model", digit_bias=2.0)
    data = write_gsm8k(tmp_path / "test.jsonl", PROMPTS)
    overrides = [
        "policy.kind=hf",
        f"policy.path={model}",
        "task.name=math",
        f"task.path={data}",
        "task.verifier=numeric",
        f"eval_sets.gsm8k.path={data}",
        "eval_sets.gsm8k.n_samples=3",
        "eval_sets.gsm8k.temperature=1.0",
        "eval_sets.gsm8k.max_new_tokens=8",
    ]
    # One rank, all prompts in one batch (no process group here); two ranks, batches of 2: a sample's
    # completion must depend on its own seed, not on its batch neighbours, its padding or its rank.
    (one,) = _round(0, 1, [*overrides, f"eval_sets.gsm8k.batch_size={PROMPTS}"])
    double = run_ddp(_round, 2, [*overrides, "eval_sets.gsm8k.batch_size=2"], timeout_s=TIMEOUT_S)
    (two,) = double[0]
    assert one.num_prompts == two.num_prompts == PROMPTS and one.num_samples == two.num_samples == 3 * PROMPTS
    completions = [(r["index"], r["completion"]) for r in one.table_rows]
    assert [i for i, _ in completions] == list(range(PROMPTS))
    assert len({c for _, c in completions}) > PROMPTS // 2  # sampled text, not one string repeated
    assert completions == [(r["index"], r["completion"]) for r in two.table_rows]
    assert one.metrics.keys() == two.metrics.keys()
    for name, value in one.metrics.items():
        # The engine's token scores are float32 logits of batches padded differently here (one batch
        # of every prompt, batches of 2): their last bits may differ, the text and the counts do not.
        scores = name.startswith(("completion/logprob", "completion/entropy"))
        assert math.isclose(value, two.metrics[name], rel_tol=1e-6 if scores else 0, abs_tol=1e-12), name
    assert double[0][0].metrics == double[1][0].metrics
