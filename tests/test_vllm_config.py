"""`policy.eval_engine: vllm` in the config (no vLLM needed): wrong combinations and values are
refused naming the key; the module gets a `VLLMEvaluator` whose pickled copy (the async worker's)
carries no engine, so that it builds its own."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from areal_lightning.app.config import ConfigError, load_config

pytest.importorskip("transformers")
from hf_models import save_tiny_llama, write_gsm8k

from areal_lightning.app.builders import build_module
from areal_lightning.rl.engines.vllm.evaluator import VLLMEvaluator


def _hf(tmp: Path) -> list[str]:
    data = write_gsm8k(tmp / "d.jsonl", 4)
    return [
        "policy.kind=hf",
        f"policy.path={save_tiny_llama(tmp / 'model', hidden=128)}",
        "task.name=math",
        f"task.path={data}",
        f"eval_sets.gsm8k.path={data}",
        "logger.wandb.mode=disabled",
    ]


def test_eval_engine_vllm_needs_an_hf_policy() -> None:
    with pytest.raises(ConfigError, match=r"policy.eval_engine: vllm needs policy.kind: hf .*got kind: tiny"):
        load_config(None, ["eval_sets.easy.size=4", "policy.eval_engine=vllm"])


@pytest.mark.parametrize(
    ("override", "match"),
    [
        ("policy.vllm.kv_cache_gib=0", r"policy.vllm.kv_cache_gib must be a positive integer \(GiB\), got 0"),
        ("policy.vllm.max_model_len=0", r"policy.vllm.max_model_len must be a positive integer or null, got 0"),
        ("policy.vllm.gpu_memory_utilization=1.5", r"policy.vllm.gpu_memory_utilization must be a number in \(0, 1\]"),
        ("policy.eval_engine=sglang", r"policy.eval_engine"),
    ],
)
def test_a_bad_vllm_setting_names_its_key(override: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        load_config(None, ["eval_sets.easy.size=4", override])


def test_the_module_gets_an_evaluator_whose_pickled_copy_builds_its_own_engine(tmp_path: Path) -> None:
    cfg = load_config(None, [*_hf(tmp_path), "policy.eval_engine=vllm", "policy.vllm.max_model_len=128"])
    module = build_module(cfg)
    evaluator = module.engine_evaluate_fn
    assert isinstance(evaluator, VLLMEvaluator) and evaluator.engine.options.max_model_len == 128
    evaluator.engine._llm, evaluator.engine.weights_step = object(), 7  # as after a round
    copy = pickle.loads(pickle.dumps(module))
    assert copy.engine_evaluate_fn.engine.llm is None and copy.engine_evaluate_fn.engine.weights_step is None
    assert copy.engine_evaluate_fn.engine.options == evaluator.engine.options
    assert build_module(load_config(None, _hf(tmp_path))).engine_evaluate_fn is None
