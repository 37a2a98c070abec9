"""What a harness eval set's round costs against a plain eval set of the same prompts.

One config, two eval sets over the same GSM8K-format file, run side by side: ``plain``, our default
evaluation (math task, `PLAIN_TEMPLATE` "Question: {question}\\nAnswer:", greedy, one sample per
prompt), and ``harness``, an lm-evaluation-harness task YAML over the same file whose ``doc_to_text``
is the same template (``num_fewshot: 0``: the same prompt strings), the same max tokens, the same stop
strings and batch size. Same tiny random-weight Llama (HF policy). Each repeat runs the two rounds in
alternating order; the median round time of each and their ratio are printed, with the mean
completion length of each (equal when both generated the same tokens).

    PYTHONPATH=$PWD .venv/bin/python benchmarks/harness_cost.py [--prompts 64] [--max-new-tokens 32] \\
        [--batch-size 16] [--repeats 5] [--json]
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

STOP = ["\n\n", "Question:"]
TASK_YAML = """task: bench_gsm
dataset_path: json
dataset_kwargs: {{data_files: {{test: {data}}}, cache_dir: {cache}}}
output_type: generate_until
test_split: test
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_target: "{{{{answer.split('####')[-1].strip()}}}}"
generation_kwargs: {{until: {stop}, do_sample: false, max_gen_toks: {max_new_tokens}}}
metric_list: [{{metric: exact_match, aggregation: mean, higher_is_better: true}}]
filter_list:
  - name: flexible-extract
    filter: [{{function: regex, group_select: -1, regex_pattern: "(-?[0-9]+)"}}, {{function: take_first}}]
num_fewshot: 0
"""


def _evaluate(module, batches, ctx):  # type: ignore[no-untyped-def]
    return module.evaluate(batches, ctx)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    os.environ.update(HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1")

    from areal_lightning.app.builders import build_eval_sets, build_module
    from areal_lightning.app.config import load_config
    from areal_lightning.eval_round import run_round
    from tests.hf_models import save_tiny_llama, write_gsm8k

    with tempfile.TemporaryDirectory(prefix="harness_cost_") as tmp:
        root = Path(tmp)
        model = save_tiny_llama(root / "model", digit_bias=3.0, max_positions=512)
        data = write_gsm8k(root / "problems.jsonl", args.prompts)
        task = root / "bench_gsm.yaml"
        stop = json.dumps(STOP)
        task.write_text(
            TASK_YAML.format(data=data, cache=root / "hf_cache", stop=stop, max_new_tokens=args.max_new_tokens)
        )
        plain = (
            f"{{path: {data}, n_samples: 1, temperature: 0.0, max_new_tokens: {args.max_new_tokens}, "
            f"stop: {stop}, batch_size: {args.batch_size}}}"
        )
        harness = f"{{harness: {{task_file: {task}}}, batch_size: {args.batch_size}}}"
        cfg = load_config(
            None,
            [
                "policy.kind=hf",
                f"policy.path={model}",
                "task.name=math",
                f"task.path={data}",
                f"eval_sets={{plain: {plain}, harness: {harness}}}",
            ],
        )
        module = build_module(cfg)
        sets = {s.name: s for s in build_eval_sets(cfg)}
        times: dict[str, list[float]] = {"plain": [], "harness": []}
        lengths: dict[str, float] = {}
        for name in sets:  # warm-up: the task's first round builds its metrics, caches, first forwards
            run_round(module, [sets[name]], _evaluate, seed=cfg.seed, global_step=0, epoch=0)
        for step in range(args.repeats):
            for name in ("plain", "harness") if step % 2 == 0 else ("harness", "plain"):
                start = time.perf_counter()
                (result,) = run_round(module, [sets[name]], _evaluate, seed=cfg.seed, global_step=step, epoch=0)
                times[name].append(time.perf_counter() - start)
                lengths[name] = result.metrics["completion/length/mean"]
    out = {
        "prompts": args.prompts,
        "max_new_tokens": args.max_new_tokens,
        "batch_size": args.batch_size,
        "repeats": args.repeats,
        "plain_s": median(times["plain"]),
        "harness_s": median(times["harness"]),
        "ratio": median(times["harness"]) / median(times["plain"]),
        "length_plain": lengths["plain"],
        "length_harness": lengths["harness"],
    }
    if args.json:
        print(json.dumps(out))
        return
    print(
        f"{args.prompts} prompts, max {args.max_new_tokens} tokens, batch {args.batch_size}, "
        f"median of {args.repeats}: plain {out['plain_s']:.3f} s, harness {out['harness_s']:.3f} s, "
        f"harness / plain = {out['ratio']:.3f}; mean completion length plain {out['length_plain']:.2f}, "
        f"harness {out['length_harness']:.2f}"
    )


if __name__ == "__main__":
    main()
