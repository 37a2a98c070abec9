"""What the engines' own scores cost: `generate_scored(scores=True)` (log-probability and entropy of
every sampled token) against `scores=False`, side by side in one run.

Each case generates the same batch with the same seeds, alternating the two settings (A, B, A, B
...) so that the machine's load hits both alike; the median of each is compared. Cases: the demo's
TinyPolicy evaluation batch (15-token vocabulary), and `transformers` Llamas built from a config
(random weights, nothing downloaded) with a 32k and a 152k vocabulary (Qwen2.5's), where the
entropy's pass over the vocabulary weighs most against a small model.

Run: ``.venv/bin/python benchmarks/completion_scores.py [--repeats 7] [--device cpu|cuda]``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from areal_lightning.rl.policy import TinyPolicy


def _time(fn: Callable[[], object], device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def _tiny(device: torch.device) -> tuple[object, torch.Tensor, torch.Tensor, int]:
    torch.manual_seed(0)
    policy = TinyPolicy(vocab_size=15, d_model=64, n_layers=2, n_heads=4, max_len=32).to(device).eval()
    ids = torch.randint(3, 15, (800, 6), device=device)  # 200 prompts x 4 samples, as the demo's eval sets
    return policy, ids, torch.ones_like(ids, dtype=torch.bool), 4


def _llama(vocab: int, hidden: int, rows: int, device: torch.device) -> tuple[object, torch.Tensor, torch.Tensor, int]:
    from transformers import LlamaConfig, LlamaForCausalLM

    from areal_lightning.rl.engines.hf.policy import HFPolicy

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    model = LlamaForCausalLM(config).to(device).eval()

    class _Tok:  # what HFPolicy reads of its tokenizer during generate
        eos_id, pad_id, stop = 2, 0, ()
        tokenizer = None

    policy = HFPolicy.__new__(HFPolicy)
    torch.nn.Module.__init__(policy)
    policy.model, policy.tokenizer = model, _Tok()
    policy.eos_id, policy.pad_id = 2, 0
    policy._cache_key, policy._logits_to_keep = "past_key_values", True
    ids = torch.randint(3, vocab, (rows, 16), device=device)
    return policy, ids, torch.ones_like(ids, dtype=torch.bool), 32


def measure(
    name: str, case: tuple[object, torch.Tensor, torch.Tensor, int], repeats: int, device: torch.device
) -> None:
    policy, ids, mask, new = case
    times: dict[bool, list[float]] = {False: [], True: []}

    def run(scores: bool) -> None:
        gens = [torch.Generator(device=device).manual_seed(i) for i in range(ids.shape[0])]
        policy.generate_scored(  # type: ignore[attr-defined]
            ids, mask, max_new_tokens=new, temperature=1.0, generators=gens, stop_at_eos=False, scores=scores
        )

    run(True)  # warm-up
    for _ in range(repeats):
        for scores in (False, True):
            times[scores].append(_time(lambda s=scores: run(s), device))
    off, on = statistics.median(times[False]), statistics.median(times[True])
    print(f"| {name} | {off * 1e3:.1f} | {on * 1e3:.1f} | {100 * (on / off - 1):+.1f} % |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    device = torch.device(args.device)
    print(f"device {device}, {torch.get_num_threads()} threads, median of {args.repeats} alternating runs")
    print("| case | scores off (ms) | scores on (ms) | cost |\n| --- | --- | --- | --- |")
    measure("TinyPolicy, 800 rows x 4 tokens (the demo's eval batch)", _tiny(device), args.repeats, device)
    measure("Llama h=256, vocab 32k, 64 rows x 32 tokens", _llama(32_000, 256, 64, device), args.repeats, device)
    measure("Llama h=128, vocab 152k, 64 rows x 32 tokens", _llama(151_936, 128, 64, device), args.repeats, device)


if __name__ == "__main__":
    main()
