"""Memory flat in the eval set's size: a round's Python allocations per prompt stay bounded (the
samples, the deal, the per-prompt outcomes kept for paired deltas, the fingerprint), measured with
tracemalloc in a process of its own for each of two set sizes (forked from the fork server, which has
imported torch and Lightning: tracemalloc starts after the imports either way); no timing."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest
from cli_server import run_cli

# 100,000 prompts at this many bytes each stay within 10 % of a 1,000-prompt round's peak memory
# (about 450 MB, most of it torch and Lightning: benchmarks/eval_memory.py). Measured: about 210;
# before the eval set, the deal and the outcomes were made compact, about 720.
MAX_BYTES_PER_PROMPT = 320
SMALL, LARGE = 2_000, 20_000

_CHILD = """
import sys, tracemalloc
import torch
from areal_lightning.app.builders import build_eval_sets
from areal_lightning.app.config import load_config
from areal_lightning.eval_round import run_round
from areal_lightning.eval_round.fingerprint import eval_set_fingerprint
from areal_lightning.metrics.mean import ExactMean
from areal_lightning.metrics.paired import PairedRounds


def evaluate(module, batches, ctx):
    # What the default evaluation keeps per prompt, without generating: a metric, two outcomes
    # (paired deltas), table rows.
    accuracy = ctx.metric("accuracy", ExactMean)
    for batch in batches:
        values = torch.tensor([float(len(s.prompt) % 2) for s in batch.samples], dtype=torch.float64)
        accuracy.update(values)
        ctx.record_outcomes("accuracy", batch.indices, values)
        ctx.record_outcomes("reward/mean", batch.indices, values)
        for index, sample in zip(batch.indices, batch.samples):
            ctx.record_sample(index, prompt=sample.prompt)
    return {}


cfg = load_config(None, [f"eval_sets.easy.size={sys.argv[1]}", "eval_sets.easy.digits=3"])  # 810,000 problems
tracemalloc.start()
(easy,) = [s for s in build_eval_sets(cfg) if s.name == "easy"]
eval_set_fingerprint(easy)
pairs = PairedRounds()  # keeps the previous and the best round's outcomes, as a fit does
for step in range(3):
    (result,) = run_round(torch.nn.Identity(), [easy], evaluate, seed=1, global_step=step, epoch=0, max_table_rows=50)
    pairs.update("easy", result.outcomes, result.outcome_names, result.metrics)
    del result
print(tracemalloc.get_traced_memory()[1])
"""


def _peak(script: Path, size: int) -> int:
    proc = run_cli([str(size)], 300, script.parent, dict(os.environ), script=script)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return int(proc.stdout.split()[-1])


@pytest.mark.process
@pytest.mark.slow
def test_an_eval_set_ten_times_larger_costs_a_bounded_few_bytes_a_prompt(tmp_path: Path) -> None:
    script = tmp_path / "round_memory.py"
    script.write_text(textwrap.dedent(_CHILD))
    small, large = _peak(script, SMALL), _peak(script, LARGE)
    per_prompt = (large - small) / (LARGE - SMALL)
    assert per_prompt < MAX_BYTES_PER_PROMPT, f"{per_prompt:.0f} bytes a prompt (peaks {small} and {large})"


def test_pairing_many_prompts_chunk_by_chunk_gives_the_change_of_one_update() -> None:
    # The paired change adds its pairs a chunk at a time (bounded memory for any set's size);
    # exact sums make that the change of adding them all at once, bit for bit.
    import torch

    from areal_lightning.metrics.exact import sum_fraction
    from areal_lightning.metrics.paired import PairedChange, PairedRounds

    n = 10_000
    current = torch.rand(n, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    reference = torch.rand(n, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    whole = PairedChange()
    whole.update(current, reference)
    chunked = PairedRounds()._paired(dict(enumerate(current.tolist())), dict(enumerate(reference.tolist())), None)
    # The digits may carry differently; the sums they hold are the same numbers.
    assert [sum_fraction(s) for s in chunked.sums] == [sum_fraction(s) for s in whole.sums]
    assert chunked.compute() == whole.compute()
