"""Eval-round time with the vLLM engine vs `HFPolicy.generate`, one process, the same round.

A random-weight Llama of about 24M parameters (8 layers, width 512, 8 heads of 64; the tests' tiny
tokenizer) evaluated by the default evaluation (`rollout_evaluate`) on a GSM8K-format eval set:
`--prompts` prompts x `--n-samples` completions of up to `--max-new-tokens` tokens, temperature 1.
Both backends run the same `run_round`, interleaved and repeated so that a busy spell on a shared
box hits both alike. The first vLLM round includes the engine's start-up (reported apart); later
rounds push changed weights first (a training step in between, as in a run), so the weight push
and the prefix-cache reset are part of every timed vLLM round.

    .venv-vllm/bin/python benchmarks/vllm_eval.py [--prompts 32] [--n-samples 4] [--max-new-tokens 48] \
        [--repeats 3] [--threads 2] [--json]

Runs in the vLLM environment (`make vllm-env`); the script needs its `__main__` guard (vLLM spawns).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from statistics import median
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

LAYERS, WIDTH, HEADS, KV_HEADS = 8, 512, 8, 4


def _save_model(path: Path) -> int:
    import torch
    from hf_models import tiny_tokenizer  # the tests' tokenizer: nothing downloaded
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = tiny_tokenizer()
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=WIDTH,
        intermediate_size=int(2.75 * WIDTH),
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        max_position_embeddings=512,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        initializer_range=0.02,
    )
    model = LlamaForCausalLM(config)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return sum(p.numel() for p in model.parameters())


def _nudge(module: Any) -> None:
    """A stand-in for a training step: every weight changes a little, in place."""
    import torch

    with torch.no_grad():
        for p in module.policy.parameters():
            p.mul_(1.0 + 1e-4)


def build_bench(args: argparse.Namespace, prefix: str) -> tuple[Any, Any, list[Any], int]:
    """The benchmark's module (a random-weight Llama saved to a temporary directory, the vLLM eval
    engine), its eval sets (a GSM8K-format file of `args.prompts` problems, one batch) and the model's
    parameter count; torch on `args.threads` threads."""
    import torch
    from hf_models import write_gsm8k

    from areal_lightning.app.builders import build_eval_sets, build_module
    from areal_lightning.app.config import load_config
    from areal_lightning.rl.engines.vllm.evaluator import VLLMEvaluator

    torch.set_num_threads(args.threads)
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    tmp = Path(tempfile.mkdtemp(prefix=prefix))
    params = _save_model(tmp / "model")
    data = write_gsm8k(tmp / "test.jsonl", args.prompts)
    cfg = load_config(
        None,
        [
            "policy.kind=hf",
            f"policy.path={tmp / 'model'}",
            "policy.eval_engine=vllm",
            "policy.vllm.max_model_len=512",
            "task.name=math",
            f"task.path={data}",
            "task.verifier=numeric",
            f"eval_sets.bench.path={data}",
            f"eval_sets.bench.n_samples={args.n_samples}",
            "eval_sets.bench.temperature=1.0",
            f"eval_sets.bench.max_new_tokens={args.max_new_tokens}",
            f"eval_sets.bench.batch_size={args.prompts}",
            "logger.wandb.mode=disabled",
            f"output_dir={tmp / 'run'}",
        ],
    )
    module = build_module(cfg)
    evaluator = module.engine_evaluate_fn
    assert isinstance(evaluator, VLLMEvaluator)
    return module, evaluator, build_eval_sets(cfg), params


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--n-samples", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    from areal_lightning.eval_round import run_round
    from areal_lightning.rl.rollout_eval import rollout_evaluate

    module, evaluator, eval_sets, params = build_bench(args, "vllm_eval_")
    step = 0

    def round_secs(evaluate_fn: Any) -> float:
        nonlocal step
        step += 1
        _nudge(module)
        start = time.perf_counter()
        run_round(module, eval_sets, evaluate_fn, seed=0, global_step=step, epoch=0)
        return time.perf_counter() - start

    first_vllm = round_secs(evaluator)
    hf, vllm = [], []
    for _ in range(args.repeats):
        hf.append(round_secs(rollout_evaluate))
        vllm.append(round_secs(evaluator))
    evaluator.close()
    result = {
        "params_M": round(params / 1e6, 1),
        "prompts": args.prompts,
        "n_samples": args.n_samples,
        "max_new_tokens": args.max_new_tokens,
        "threads": args.threads,
        "hf_round_s": [round(s, 2) for s in hf],
        "vllm_round_s": [round(s, 2) for s in vllm],
        "vllm_first_round_s": round(first_vllm, 2),
        "vllm_startup_s": round(first_vllm - median(vllm), 2),
        "speedup_hf_over_vllm": round(median(hf) / median(vllm), 2),
        "load": os.getloadavg()[0],
    }
    if args.json:
        print(json.dumps(result))
        return
    print(
        f"{result['params_M']}M-parameter Llama, {args.prompts} prompts x {args.n_samples} samples x "
        f"{args.max_new_tokens} new tokens, {args.threads} threads (load {result['load']:.1f})"
    )
    print(f"  HFPolicy round   {result['hf_round_s']} s")
    print(f"  vLLM round       {result['vllm_round_s']} s (weights pushed before each)")
    print(f"  vLLM first round {first_vllm:.2f} s, of which start-up ~{result['vllm_startup_s']} s")
    print(f"  HF / vLLM round time (medians): {result['speedup_hf_over_vllm']}x")


if __name__ == "__main__":
    main()
