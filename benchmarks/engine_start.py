"""What a vLLM engine in a process of its own costs on the CPU until its first scored round is
back, with torch's precompiled C++ headers on (torch's default) and off (the evaluator's default
since 2026-12-04).

On its first scored round vLLM compiles one small kernel (the sampled tokens' ranks) with torch's
inductor. The kernel is kept in torch's compile cache, shared here by every run (warmed first, as
on any machine after its first engine); the precompiled header is kept in the temporary directory,
which is the engine's own: with headers on, every engine builds it again. Each run is a fresh
interpreter that builds an engine (``in_process=False``: the engine core in a process of its own,
as on DDP ranks) for the tests' tiny Llama, generates one scored batch and closes it; the runs
alternate between the two settings. Reported: the engine processes' CPU seconds (user + sys of
the run's children) and the wall time of build + first round, medians over repeats, and their
ratio on / off.

    PYTHONPATH=$PWD .venv-vllm/bin/python benchmarks/engine_start.py [--repeats 3] [--json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import median

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = {"headers on (torch's default)": "1", "headers off (ours)": "0"}


def one_engine(directory: str) -> None:
    """In a fresh interpreter: builds the engine, generates one scored batch, closes it."""
    sys.path.insert(0, str(ROOT / "tests"))
    import torch
    from hf_models import save_tiny_llama
    from vllm_helpers import CPU_OPTIONS, HIDDEN

    from areal_lightning.rl.engines.hf.policy import HFPolicy
    from areal_lightning.rl.engines.vllm.evaluator import VLLMEngine
    from areal_lightning.rl.engines.vllm.policy import _EnginePolicy

    policy = HFPolicy.from_pretrained(save_tiny_llama(Path(directory) / "model", hidden=HIDDEN))
    engine = VLLMEngine(dataclasses.replace(CPU_OPTIONS, in_process=False))
    try:
        engine.ensure(policy.model, policy.tokenizer.tokenizer, step=0)
        ids, mask = policy.encode_prompts(["What is 1 + 2?", "Tom has"] * 4)
        generators = [torch.Generator().manual_seed(s) for s in range(8)]
        out = _EnginePolicy(engine, policy, stop=[]).generate_scored(
            ids, mask, max_new_tokens=8, temperature=1.0, generators=generators, scores=True
        )
        assert out.scored is not None and bool(out.scored.any()), "the round asked for scores and got none"
    finally:
        engine.close()


def run(headers: str, cache: str) -> tuple[float, float]:
    """(CPU seconds of the run's processes, wall seconds) of one fresh engine and its first scored round."""
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache, TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS=headers)
    env.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    with tempfile.TemporaryDirectory(prefix="engine_start_") as directory:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        argv = [sys.executable, __file__, "--one-engine-in", directory]
        subprocess.run(argv, env=env, check=True, capture_output=True, timeout=600)
        wall = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--one-engine-in", help=argparse.SUPPRESS)  # a run's own interpreter
    args = parser.parse_args()
    if args.one_engine_in:
        one_engine(args.one_engine_in)
        return
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in SETTINGS}
    with tempfile.TemporaryDirectory(prefix="engine_start_cache_") as cache:
        run("0", cache)  # the kernel compiled once, as on any machine after its first engine
        for i in range(args.repeats):
            order = list(SETTINGS.items()) if i % 2 == 0 else list(reversed(SETTINGS.items()))
            for name, headers in order:
                results[name].append(run(headers, cache))
    cpu = {name: median(c for c, _ in runs) for name, runs in results.items()}
    wall = {name: median(w for _, w in runs) for name, runs in results.items()}
    on, off = SETTINGS
    ratio = {"cpu": cpu[on] / cpu[off], "wall": wall[on] / wall[off]}
    if args.json:
        print(json.dumps({"cpu_s": cpu, "wall_s": wall, "runs": results, "ratio_on_off": ratio}))
        return
    print(f"an engine in a process of its own, built, fed and one scored round, {args.repeats} runs each (medians):")
    for name in SETTINGS:
        print(f"  {name:<30} {cpu[name]:6.1f} CPU-s  {wall[name]:6.1f} s wall")
    print(f"  on / off: {ratio['cpu']:.2f}x CPU, {ratio['wall']:.2f}x wall")


if __name__ == "__main__":
    main()
