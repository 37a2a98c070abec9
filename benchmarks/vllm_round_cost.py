"""What a vLLM eval round costs beyond vLLM: the round against a plain `llm.generate` of the same
prompts and sampling, the weight push reported apart.

The model and eval set of `vllm_eval.py` (a random-weight Llama of about 24M parameters, the
default evaluation on a GSM8K-format set, one batch). Each repeat changes every weight a little (a
training step), pushes the weights into the engine (timed apart), then, in alternating order, runs
the round (`run_round` with `VLLMEvaluator`: its push finds the weights already there) and a plain
`llm.generate` of the very requests the round made (captured: the same token prompts and
per-completion `SamplingParams`); the prefix cache is reset before each, so neither reuses the
other's. Target: round / generate <= 1.05.

    PYTHONPATH=$PWD .venv-vllm/bin/python benchmarks/vllm_round_cost.py [--prompts 16] [--n-samples 4] \\
        [--max-new-tokens 32] [--repeats 3] [--threads 2] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from statistics import median
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--n-samples", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    from vllm import TokensPrompt
    from vllm_eval import _nudge, build_bench

    from areal_lightning.eval_round import run_round

    module, evaluator, eval_sets, _ = build_bench(args, "vllm_round_cost_")
    engine = evaluator.engine
    requests: list[tuple[list[list[int]], list[Any]]] = []
    generate = engine.generate

    def captured(prompts: list[list[int]], params: list[Any]) -> list[Any]:
        requests.append((prompts, params))
        return generate(prompts, params)

    engine.generate = captured  # type: ignore[method-assign]
    run_round(module, eval_sets, evaluator, seed=0, global_step=0, epoch=0)  # builds the engine
    push, rounds, plain = [], [], []
    for step in range(1, args.repeats + 1):
        _nudge(module)
        start = time.perf_counter()
        engine.ensure(module.policy.model, module.policy.tokenizer.tokenizer, step)
        push.append(time.perf_counter() - start)
        for kind in ("round", "generate") if step % 2 else ("generate", "round"):
            engine.llm.reset_prefix_cache()
            start = time.perf_counter()
            if kind == "round":
                requests.clear()
                run_round(module, eval_sets, evaluator, seed=0, global_step=step, epoch=0)
                rounds.append(time.perf_counter() - start)
            else:
                if not requests:  # the first repeat times the plain call first: the round's requests of step 0
                    continue
                for prompts, params in requests:
                    engine.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
                plain.append(time.perf_counter() - start)
    evaluator.close()
    result = {
        "prompts": args.prompts,
        "n_samples": args.n_samples,
        "max_new_tokens": args.max_new_tokens,
        "push_s": [round(s, 3) for s in push],
        "round_s": [round(s, 3) for s in rounds],
        "generate_s": [round(s, 3) for s in plain],
        "round_over_generate": round(median(rounds) / median(plain), 3),
        "load": os.getloadavg()[0],
    }
    if args.json:
        print(json.dumps(result))
        return
    print(
        f"{args.prompts} prompts x {args.n_samples} samples x {args.max_new_tokens} new tokens, "
        f"{args.threads} threads (load {result['load']:.1f})"
    )
    print(f"  weight push        {result['push_s']} s (apart)")
    print(f"  round              {result['round_s']} s")
    print(f"  plain llm.generate {result['generate_s']} s")
    print(f"  round / generate (medians): {result['round_over_generate']}x (target <= 1.05)")


if __name__ == "__main__":
    main()
