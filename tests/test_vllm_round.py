"""The vLLM backend inside evaluation rounds: the metrics and each sample's completion are the
same on 1 process (an in-process engine) and on 2 DDP processes (each rank its own engine, in a
process of its own); an engine killed mid-round gives the round an ``error`` record and the next
round succeeds with a new engine, under a Trainer with Lightning's defaults (and such an engine
builds no precompiled C++ header into its own directory, thrown away with it); the trainer's RNG
state is the same with and without a round."""

from __future__ import annotations

import math
import os
import random
import signal
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import pytest
import torch
from ddp_utils import run_ddp
from hf_models import save_tiny_llama, write_gsm8k
from vllm_helpers import HIDDEN, require_vllm

from areal_lightning.rl.engines.vllm.evaluator import WEIGHTS_STEP_KEY, VLLMEngine
from areal_lightning.tracking.history import eval_rows, event_rows, read_history

require_vllm()

PROMPTS = 7  # odd: the two ranks get different numbers of samples
TIMEOUT_S = 400.0


def _overrides(tmp: Path, *extra: str) -> list[str]:
    model = tmp / "model"
    if not model.exists():
        save_tiny_llama(model, hidden=HIDDEN, digit_bias=2.0)
    data = write_gsm8k(tmp / "test.jsonl", PROMPTS)
    return [
        "policy.kind=hf",
        f"policy.path={model}",
        "policy.eval_engine=vllm",
        "policy.vllm.max_model_len=256",
        "policy.vllm.max_num_seqs=32",
        "task.name=math",
        f"task.path={data}",
        "task.verifier=numeric",
        f"eval_sets.gsm8k.path={data}",
        "eval_sets.gsm8k.n_samples=3",
        "eval_sets.gsm8k.temperature=1.0",
        "eval_sets.gsm8k.max_new_tokens=8",
        "logger.wandb.mode=disabled",
        f"output_dir={tmp / 'run'}",
        *extra,
    ]


def _round(rank: int, world_size: int, overrides: list[str]) -> list[Any]:
    from areal_lightning.app.builders import build_eval_sets, build_module
    from areal_lightning.app.config import load_config
    from areal_lightning.callbacks.async_evaluator import module_evaluate
    from areal_lightning.eval_round import run_round

    torch.set_num_threads(1)
    cfg = load_config(None, overrides)
    module = build_module(cfg)
    try:
        return run_round(
            module, build_eval_sets(cfg), module_evaluate, seed=cfg.seed, global_step=0, epoch=0, max_table_rows=PROMPTS
        )
    finally:
        module.engine_evaluate_fn.close()


@pytest.mark.ddp
@pytest.mark.slow
# Two engines on two ranks beside the suite and the server tests: past the 300 s default on a 2-core box.
@pytest.mark.timeout(900)
def test_metrics_and_completions_are_the_same_on_one_and_two_processes(tmp_path: Path) -> None:
    overrides = _overrides(tmp_path)
    (one,) = _round(0, 1, [*overrides, f"eval_sets.gsm8k.batch_size={PROMPTS}"])
    double = run_ddp(_round, 2, [*overrides, "eval_sets.gsm8k.batch_size=2"], timeout_s=TIMEOUT_S)
    (two,) = double[0]
    assert one.num_prompts == two.num_prompts == PROMPTS and one.num_samples == two.num_samples == 3 * PROMPTS
    completions = [(r["index"], r["completion"]) for r in one.table_rows]
    assert len({c for _, c in completions}) > PROMPTS // 2  # sampled text, not one string repeated
    assert completions == [(r["index"], r["completion"]) for r in two.table_rows]
    assert one.metrics.keys() == two.metrics.keys()
    assert one.metrics[WEIGHTS_STEP_KEY] == 0
    for name, value in one.metrics.items():
        assert math.isclose(value, two.metrics[name], rel_tol=0, abs_tol=1e-12), name
    assert double[0][0].metrics == double[1][0].metrics


class _RngProbe(L.Callback):
    """The global RNG states at the end of each training batch (after any round at that step)."""

    def __init__(self) -> None:
        self.states: list[tuple[torch.Tensor, np.ndarray, Any]] = []

    def on_train_batch_end(self, *args: Any) -> None:
        self.states.append((torch.get_rng_state(), np.random.get_state()[1].copy(), random.getstate()))


def _fit(tmp: Path, rounds: bool, *extra: str, steps: int = 2) -> tuple[Any, _RngProbe, Any]:
    from areal_lightning.app.builders import build_callback, build_module
    from areal_lightning.app.config import load_config

    cfg = load_config(
        None,
        _overrides(
            tmp,
            "grpo.group_size=2",
            "grpo.prompts_per_step=2",
            "grpo.max_new_tokens=4",
            f"trainer.max_steps={steps}",
            "evaluator.freq_steps=1",
            "evaluator.freq_epochs=null",
            "evaluator.freq_secs=null",
            "evaluator.eval_at_end=false",
            *extra,
        ),
    )
    L.seed_everything(0)
    module = build_module(cfg)
    probe = _RngProbe()
    callbacks: list[L.Callback] = [build_callback(cfg), probe] if rounds else [probe]
    # Lightning's defaults: progress bar, logger, checkpointing, model summary.
    trainer = L.Trainer(max_steps=steps, accelerator="cpu", devices=1, default_root_dir=str(tmp), callbacks=callbacks)
    trainer.fit(module)
    return module, probe, cfg


@pytest.mark.slow
def test_the_trainers_rng_state_is_the_same_with_and_without_a_round(tmp_path: Path) -> None:
    module, with_rounds, cfg = _fit(tmp_path / "rounds", rounds=True)
    module.engine_evaluate_fn.close()
    records = eval_rows(read_history(cfg.output_dir))
    assert [r["step"] for r in records] == [1, 2] and all(r["metrics"][WEIGHTS_STEP_KEY] for r in records)
    _, without, _ = _fit(tmp_path / "none", rounds=False)
    assert len(with_rounds.states) == len(without.states) == 2
    for (t1, n1, r1), (t2, n2, r2) in zip(with_rounds.states, without.states, strict=True):
        assert torch.equal(t1, t2) and np.array_equal(n1, n2) and r1 == r2


@pytest.mark.slow
@pytest.mark.timeout(600)  # two engines in processes of their own start here (15-60 s each)
def test_an_engine_killed_mid_round_gives_an_error_record_and_the_next_round_succeeds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []
    headers: list[Path] = []
    generate = VLLMEngine.generate

    def kill_then_generate(self: VLLMEngine, prompts: list[list[int]], params: list[Any]) -> list[Any]:
        calls.append(len(prompts))
        if len(calls) == 2:  # the second round (the sanity pass generates with the policy, not the engine)
            # After a scored round: what torch precompiled in the engine's own temporary directory.
            headers.extend(Path(self._dir).rglob("*.gch"))
            os.kill(self.llm.llm_engine.engine_core.resources.engine_manager.processes[0].pid, signal.SIGKILL)
        return generate(self, prompts, params)

    monkeypatch.setattr(VLLMEngine, "generate", kill_then_generate)
    module, _, cfg = _fit(tmp_path, True, "policy.vllm.in_process=false", steps=3)
    engine = module.engine_evaluate_fn.engine
    try:
        errors = event_rows(read_history(cfg.output_dir), "error")
        records = eval_rows(read_history(cfg.output_dir))
        assert len(calls) == 3 and engine.builds == 2
        assert [e["step"] for e in errors] == [2] and "VLLMEngineError" in errors[0]["message"]
        assert [r["step"] for r in records] == [1, 3] and records[1]["metrics"][WEIGHTS_STEP_KEY] == 3
        # The first round was scored (vLLM compiled its ranks' kernel, or found it in torch's cache),
        # and the engine built no precompiled header into its directory, to be thrown away with it.
        assert "completion/logprob" in records[0]["metrics"] and headers == []
    finally:
        engine.close()


@pytest.mark.slow
def test_async_rounds_build_their_engine_in_the_worker_and_record_the_snapshots_step(tmp_path: Path) -> None:
    module, _, cfg = _fit(tmp_path, True, "evaluator.mode=async", "evaluator.on_busy=wait")
    records = eval_rows(read_history(cfg.output_dir))
    # Every round generated with the weights of the step it is recorded at (the worker's engine
    # was fed each snapshot); the training process never built an engine of its own.
    assert [r["step"] for r in records] == [1, 2]
    assert [r["metrics"][WEIGHTS_STEP_KEY] for r in records] == [1.0, 2.0]
    assert module.engine_evaluate_fn.engine.llm is None and module.engine_evaluate_fn.engine.builds == 0
