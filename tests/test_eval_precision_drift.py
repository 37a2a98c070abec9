"""Evaluation precision (bf16 autocast on CPU, evaluation only) and the drift check across a resume."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from callback_helpers import CountingModule, make_trainer
from lightning.pytorch.callbacks import ModelCheckpoint

from areal_lightning.app.config import ConfigError, load_config
from areal_lightning.callbacks import EvaluationCallback
from areal_lightning.eval_round import EvalBatch, EvalContext, run_round
from areal_lightning.eval_round.precision import EvalPrecision, eval_precision
from areal_lightning.tracking.history import eval_rows, event_rows, read_history


class DtypeProbe(CountingModule):
    """Remembers the dtype of its layer's output in training steps."""

    train_dtypes: set[torch.dtype]

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.train_dtypes = getattr(self, "train_dtypes", set()) | {self.layer(batch[0]).dtype}
        return super().training_step(batch, batch_idx)


def _output_dtype(module: Any, batches: list[EvalBatch], ctx: EvalContext) -> dict[str, float]:
    out = module.layer(torch.ones(1, 3))
    return {"bf16": float(out.dtype == torch.bfloat16)}


def test_bf16_evaluation_autocasts_the_round_only(tmp_path: Path) -> None:
    module = DtypeProbe()
    cb = EvaluationCallback({"easy": [0]}, _output_dtype, schedule={"freq_steps": 2}, rounds={"precision": "bf16"})
    make_trainer(tmp_path, [cb], 4).fit(module)
    assert [r["metrics"]["bf16"] for r in eval_rows(read_history(tmp_path))] == [1.0, 1.0]
    assert module.train_dtypes == {torch.float32} and module.layer.weight.dtype == torch.float32


def test_grpo_rollout_evaluation_runs_in_bf16_on_cpu() -> None:
    from areal_lightning.app.builders import build_eval_sets, build_module
    from areal_lightning.rl.rollout_eval import rollout_evaluate

    cfg = load_config(None, ["eval_sets.easy.size=16", "policy.d_model=32", "policy.n_layers=1"])
    module = build_module(cfg)
    # The dtype every Linear of the policy computes in during the round's rollouts.
    seen: set[torch.dtype] = set()
    hooks = [
        m.register_forward_hook(lambda _m, _i, out: seen.add(out.dtype))
        for m in module.modules()
        if isinstance(m, torch.nn.Linear)
    ]
    try:
        with eval_precision(module, EvalPrecision.BF16):
            (result,) = run_round(
                module, build_eval_sets(cfg, module.task), rollout_evaluate, seed=1, global_step=0, epoch=0
            )
        assert hooks and seen == {torch.bfloat16}  # every forward of the rollout ran in bf16
        seen.clear()
        run_round(module, build_eval_sets(cfg, module.task), rollout_evaluate, seed=1, global_step=0, epoch=0)
        assert seen == {torch.float32}  # and only inside the precision context
    finally:
        for hook in hooks:
            hook.remove()
    assert result.num_prompts == 16 and not math.isnan(result.metrics["accuracy"])
    assert next(module.parameters()).dtype == torch.float32


def test_precision_in_yaml_and_errors(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("eval_sets: {easy: {size: 4}}\nevaluator: {precision: 16}\n")
    assert load_config(path).evaluator.rounds.precision is EvalPrecision.FP16
    with pytest.raises(ConfigError, match=r"evaluator\.precision must be one of 32, bf16, 16; got 'fp8'"):
        load_config(None, ["eval_sets.easy.size=4", "evaluator.precision=fp8"])
    with pytest.raises(ValueError, match=r"precision=...\)` must be one of 32, bf16, 16, got 'half'"):
        EvaluationCallback({"easy": [0]}, _output_dtype, rounds={"precision": "half"})


def _sum(module: Any, batches: list[EvalBatch], ctx: EvalContext) -> dict[str, float]:
    return {"total": float(sum(s for b in batches for s in b.samples))}


def _fit(root: Path, samples: list[int], max_steps: int, ckpt: Path | None) -> None:
    callbacks: list[Any] = [EvaluationCallback({"easy": samples}, _sum, schedule={"freq_steps": 2})]
    if ckpt is None:
        callbacks.append(
            ModelCheckpoint(
                dirpath=root / "checkpoints",
                filename="step{step}",
                auto_insert_metric_name=False,
                every_n_train_steps=2,
                save_top_k=-1,
            )
        )
    make_trainer(root, callbacks, max_steps).fit(CountingModule(), ckpt_path=ckpt)


def test_a_changed_eval_set_between_resumes_warns_once_and_records_a_drift_event(tmp_path: Path) -> None:
    _fit(tmp_path, [1, 2, 3], 2, None)
    _fit(tmp_path, [1, 2, 3], 4, tmp_path / "checkpoints" / "step2.ckpt")  # unchanged: no drift
    assert event_rows(read_history(tmp_path), "drift") == []
    with pytest.warns(UserWarning, match="eval set 'easy' changed during the run") as caught:
        _fit(tmp_path, [1, 2, 4], 4, tmp_path / "checkpoints" / "step2.ckpt")
    assert sum("changed during the run" in str(w.message) for w in caught) == 1
    (event,) = event_rows(read_history(tmp_path), "drift")
    assert event["step"] == 2 and event["dataset"] == "easy" and "fingerprint" in event["message"]
