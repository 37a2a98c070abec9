"""GPU check: train a GPT-2-small-sized random-weight `HFPolicy` for a few GRPO steps and evaluate it.

Prints, measured side by side in one run: eval tokens/s of `HFPolicy.generate` (our decode loop,
per-row seeds) and of transformers' `generate` with the dynamic and with the static cache, the
evaluation round's samples/s (and, where vLLM is installed, the same round through the vLLM
backend: its first round with the engine's start-up, then samples/s), GRPO train steps/s and peak
GPU memory; an async fit on the device (when its first round began after falling due, rounds
skipped) and a round on 2 ranks reduced in one gather (`gpu_check_paths.py`). Nothing is downloaded: the
model is built from a config and the tokenizer from a word list. `--cpu-smoke` runs the same code
at tiny sizes on the CPU (a check that the script works, not a measurement).

Run: benchmarks/gpu_check.sh [--cpu-smoke]
"""

from __future__ import annotations

import argparse
import atexit
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from gpu_check_paths import async_fit, packed_round

from areal_lightning.callbacks.worker_launch import prestart

WORDS = ["Question:", "Answer:", "Tom", "has", "apples", "and", "buys", "more.", "How", "many", "?", "####"]


def _tokenizer(vocab: int) -> Any:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    names = ["<pad>", "<bos>", "<eos>", "<unk>", *WORDS, *map(str, range(100))]
    names += [f"w{i}" for i in range(vocab - len(names))]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(names)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>", unk_token="<unk>"
    )


def _save_model(path: Path, sizes: dict[str, int]) -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    tok = _tokenizer(sizes["vocab"])
    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=sizes["vocab"],
        n_embd=sizes["width"],
        n_layer=sizes["layers"],
        n_head=sizes["heads"],
        n_positions=1024,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    GPT2LMHeadModel(config).save_pretrained(path)
    tok.save_pretrained(path)


def _write_gsm8k(path: Path, n: int) -> None:
    rows = [
        {
            "question": f"Tom has {i % 50} apples and buys {i % 7} more. How many apples ?",
            "answer": f"#### {i % 50 + i % 7}",
        }
        for i in range(n)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _tokens_per_s(fn: Any, device: torch.device, repeats: int = 2) -> tuple[float, int]:
    fn()  # warm-up (kernels, static cache allocation)
    _sync(device)
    start, tokens = time.perf_counter(), 0
    for _ in range(repeats):
        tokens += fn()
    _sync(device)
    return tokens / (time.perf_counter() - start), tokens // repeats


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu-smoke", action="store_true", help="tiny sizes on the CPU: checks the script runs")
    parser.add_argument("--steps", type=int, default=None, help="GRPO steps (default: 8 on GPU, 3 smoke)")
    args = parser.parse_args()
    # As `fit` does for an async config: the async worker's imports start now.
    prestart(
        [
            "areal_lightning.rl.grpo.module",
            "areal_lightning.rl.rollout_eval",
            "areal_lightning.rl.engines.hf.policy",
            "transformers",
        ]
    )
    smoke = args.cpu_smoke
    if not smoke and not torch.cuda.is_available():
        raise SystemExit("gpu_check: no CUDA device; use --cpu-smoke to check the script on the CPU")
    sizes = (
        dict(vocab=512, width=64, layers=2, heads=2, batch=4, new=8, prompts=8, group=2, per_step=2)
        if smoke
        else dict(vocab=50257, width=768, layers=12, heads=12, batch=64, new=128, prompts=128, group=8, per_step=8)
    )
    steps = args.steps or (3 if smoke else 8)
    device = torch.device("cpu" if smoke else "cuda")
    import lightning as L

    from areal_lightning.app.builders import build_eval_sets, build_module
    from areal_lightning.app.config import load_config
    from areal_lightning.eval_round import run_round
    from areal_lightning.rl.protocols import seeded_generators
    from areal_lightning.rl.rollout_eval import rollout_evaluate

    tmp = Path(tempfile.mkdtemp(prefix="gpu_check_"))
    atexit.register(shutil.rmtree, tmp, ignore_errors=True)  # scratch: the model, the data, the run
    _save_model(tmp / "model", sizes)
    _write_gsm8k(tmp / "gsm8k.jsonl", max(sizes["prompts"], sizes["per_step"] * steps))
    cfg = load_config(
        None,
        [
            "policy.kind=hf",
            f"policy.path={tmp / 'model'}",
            f"policy.dtype={'float32' if smoke else 'bfloat16'}",
            "task.name=math",
            f"task.path={tmp / 'gsm8k.jsonl'}",
            "task.verifier=numeric",
            f"eval_sets.gsm8k.path={tmp / 'gsm8k.jsonl'}",
            f"eval_sets.gsm8k.size={sizes['prompts']}",
            "eval_sets.gsm8k.n_samples=1",
            "eval_sets.gsm8k.temperature=1.0",
            f"eval_sets.gsm8k.batch_size={sizes['batch']}",
            f"eval_sets.gsm8k.max_new_tokens={sizes['new']}",
            f"grpo.group_size={sizes['group']}",
            f"grpo.prompts_per_step={sizes['per_step']}",
            f"grpo.max_new_tokens={sizes['new']}",
            "grpo.lr=1e-5",
            f"output_dir={tmp / 'run'}",
        ],
    )
    module = build_module(cfg)
    policy = module.policy.to(device)
    model, tok = policy.model, policy.tokenizer
    prompts = [s.prompt for s in build_eval_sets(cfg)[0].samples[: sizes["batch"]]]
    ids, mask = tok.encode_batch(prompts)
    ids, mask = ids.to(device), mask.to(device)
    new = sizes["new"]
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)

    def ours() -> int:
        out = policy.generate(
            ids, mask, max_new_tokens=new, temperature=1.0, generators=seeded_generators(range(len(prompts)), device)
        )
        return int((out != policy.pad_id).sum())

    def hf(cache: str | None) -> Any:
        def run() -> int:
            kwargs = {"cache_implementation": cache} if cache else {}
            out = model.generate(
                input_ids=ids,
                attention_mask=mask.long(),
                max_new_tokens=new,
                min_new_tokens=new,
                do_sample=True,
                top_k=0,
                top_p=1.0,
                pad_token_id=policy.pad_id,
                **kwargs,
            )
            return int(out[:, ids.shape[1] :].numel())

        return run

    results: dict[str, Any] = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (smoke)",
        "params_M": round(sum(p.numel() for p in model.parameters()) / 1e6, 1),
        "batch": len(prompts),
        "max_new_tokens": new,
    }
    with torch.no_grad():
        model.eval()
        results["eval_tok_s_hfpolicy"], _ = _tokens_per_s(ours, device)
        results["eval_tok_s_hf_dynamic"], _ = _tokens_per_s(hf(None), device)
        results["eval_tok_s_hf_static"], _ = _tokens_per_s(hf("static"), device)

    module.to(device)
    start = time.perf_counter()
    (round_result,) = run_round(module, build_eval_sets(cfg), rollout_evaluate, seed=cfg.seed, global_step=0, epoch=0)
    _sync(device)
    results["eval_round_samples_s"] = round_result.num_samples / (time.perf_counter() - start)
    results.update(_vllm_round(module, cfg, device, smoke))
    results.update(packed_round(device))  # 2 ranks, one gather a round
    results.update(async_fit(module, cfg, device, smoke))  # the worker ready when the first round falls due

    class StepClock(L.Callback):
        def __init__(self) -> None:
            self.times: list[float] = []

        def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
            _sync(device)
            self.times.append(time.perf_counter())

    clock = StepClock()
    trainer = L.Trainer(
        max_steps=steps,
        accelerator="cpu" if smoke else "gpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[clock],
        default_root_dir=str(tmp / "run"),
    )
    trainer.fit(module)
    timed = clock.times[1:]  # the first step pays for kernel selection and the optimizer's state
    results["train_steps_s"] = (len(timed) - 1) / (timed[-1] - timed[0]) if len(timed) > 1 else float("nan")
    results["train_samples_per_step"] = sizes["group"] * sizes["per_step"]
    if device.type == "cuda":
        results["peak_gpu_mem_GiB"] = torch.cuda.max_memory_allocated(device) / 2**30
    width = max(map(len, results))
    for key, value in results.items():
        print(f"{key:<{width}}  {value:.2f}" if isinstance(value, float) else f"{key:<{width}}  {value}")
    return 0


def _vllm_round(module: Any, cfg: Any, device: torch.device, smoke: bool) -> dict[str, Any]:
    """The same round through the vLLM backend (docs/vllm.md), where vLLM is installed: its first
    round (engine start-up included) and a second one after the weights changed (pushed in place).
    Eager mode keeps the start-up inside the script's time limit (CUDA graphs would be faster)."""
    try:
        import vllm  # noqa: F401
    except ImportError:
        print("vllm: not installed here; the vLLM figures are skipped (make vllm-env, or pip install vllm)")
        return {}
    from areal_lightning.app.builders import build_eval_sets
    from areal_lightning.eval_round import run_round
    from areal_lightning.rl.engines.vllm.evaluator import VLLMEvaluator, VLLMOptions

    max_len = 256 if smoke else 1024
    evaluator = VLLMEvaluator(VLLMOptions(max_model_len=max_len, extra={"enforce_eager": True}))
    times = []
    try:
        for step in (1, 2):
            with torch.no_grad():
                for p in module.policy.parameters():
                    p.mul_(1.0 + 1e-3)  # a training step's worth of change: pushed before the round
            start = time.perf_counter()
            (result,) = run_round(module, build_eval_sets(cfg), evaluator, seed=cfg.seed, global_step=step, epoch=0)
            _sync(device)
            times.append(time.perf_counter() - start)
    finally:
        evaluator.close()
    return {
        "vllm_first_round_s": times[0],
        "eval_round_samples_s_vllm": result.num_samples / times[1],
        "vllm_pushes": evaluator.engine.pushes,
    }


if __name__ == "__main__":
    raise SystemExit(main())
