"""A scripted evaluation for the prompt-story tests: each prompt's share of correct samples at each
step is a fixed function of (prompt, step), so every test knows every outcome, and an independent
reference of the story (gained, lost, buckets, gap) computed from it by plain counting."""

from __future__ import annotations

import math
from typing import Any

import torch

from areal_lightning.eval_round import EvalBatch, EvalContext

SAMPLES = 4
PROMPTS = 13  # odd, in batches of 3: two ranks get different numbers of prompts
BATCH = 3


def share(index: int, step: int) -> float:
    """Prompt `index`'s share of correct samples at `step` (0, 1/4, ..., 1): moves around between rounds."""
    s = step + 1
    return ((index * 5 + s * 3 + (index * s) % 7) % (SAMPLES + 1)) / SAMPLES


def story_evaluate(module: Any, batches: list[EvalBatch], ctx: EvalContext) -> dict[str, Any]:
    """Records each prompt's scripted share as its ``accuracy`` outcome; returns accuracy, pass@1 and pass@4."""
    values = []
    for batch in batches:
        shares = [share(i, ctx.global_step) for i in batch.indices]
        ctx.record_outcomes("accuracy", batch.indices, shares)
        values += shares
    t = torch.tensor(values, dtype=torch.float64)
    return {"accuracy": t, "pass@1": t, "pass@4": (t > 0).double()}


def expected_story(steps: list[int], solved_at: float = 0.5) -> dict[int, dict[str, float]]:
    """The story metrics of the rounds at `steps`, from the script by plain counting."""
    first = {i: share(i, steps[0]) for i in range(PROMPTS)}
    buckets = {
        "hard": [i for i, v in first.items() if v == 0],
        "medium": [i for i, v in first.items() if 0 < v < 1],
        "easy": [i for i, v in first.items() if v == 1],
    }
    out: dict[int, dict[str, float]] = {}
    for k, step in enumerate(steps):
        now = [share(i, step) for i in range(PROMPTS)]
        row = {
            f"accuracy/bucket/{b}": (sum(now[i] for i in members) / len(members) if members else math.nan)
            for b, members in buckets.items()
        }
        row["pass@4/gap"] = sum(v > 0 for v in now) / PROMPTS - sum(now) / PROMPTS
        row["accuracy/gained"] = row["accuracy/lost"] = 0.0  # the first round: nothing to compare with
        if k:
            before = [share(i, steps[k - 1]) for i in range(PROMPTS)]
            row["accuracy/gained"] = float(sum(n >= solved_at > b for n, b in zip(now, before, strict=True)))
            row["accuracy/lost"] = float(sum(b >= solved_at > n for n, b in zip(now, before, strict=True)))
        out[step] = row
    return out
