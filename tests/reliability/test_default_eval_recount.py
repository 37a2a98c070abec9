"""The default GRPO evaluation's numbers, recounted by hand from the completions it scored.

The policy answers from its per-prompt generators: right, a common wrong answer, a random one or
no answer at all, so that accuracy, pass@1, pass@n and maj@n all differ and none is 0 or 1. The
recount below shares no code with `rollout_evaluate` or the metric classes.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from torch import Tensor, nn

from areal_lightning.eval_round import EvalSet, run_round
from areal_lightning.rl.grpo.config import GRPOConfig
from areal_lightning.rl.grpo.module import GRPOModule
from areal_lightning.tasks.arithmetic import ArithmeticTask

N_SAMPLES = 5
SIZE = 40


class _AnsweringPolicy(nn.Module):
    """A `Policy` that reads the sum off the prompt and answers it right 40% of the time, with a
    common wrong answer 25%, a random two-digit number 20% and nothing (EOS) otherwise."""

    def __init__(self, task: ArithmeticTask) -> None:
        super().__init__()
        self.tok = task.tokenizer
        self.pad_id, self.eos_id = self.tok.pad_id, self.tok.eos_id

    def generate(
        self,
        prompt_ids: Tensor,
        prompt_mask: Tensor,
        *,
        max_new_tokens: int,
        temperature: float,
        generators,
        **_: object,
    ) -> Tensor:
        out = torch.full((len(prompt_ids), max_new_tokens), self.pad_id, dtype=torch.long)
        for row, (ids, mask, gen) in enumerate(zip(prompt_ids, prompt_mask, generators, strict=True)):
            a, b = self.tok.decode(ids[mask].tolist()).rstrip("=").split("+")
            u = float(torch.rand(1, generator=gen))
            if u < 0.40:
                text = str(int(a) + int(b)).zfill(2)
            elif u < 0.65:
                text = "99"
            elif u < 0.85:
                text = str(int(torch.randint(10, 99, (1,), generator=gen)))
            else:
                text = ""
            out[row, : len(text) + 1] = torch.tensor([*self.tok.encode(text, bos=False), self.eos_id])
        return out


def _recount(texts: list[str], answers: list[str]) -> dict[str, float]:
    prompts = [(texts[i : i + N_SAMPLES], answers[i]) for i in range(0, len(texts), N_SAMPLES)]
    accuracy = sum(t == a for group, a in prompts for t in group) / len(texts)
    pass_n = sum(any(t == a for t in group) for group, a in prompts) / len(prompts)
    maj = 0
    for group, answer in prompts:
        votes = Counter(int(t) for t in group if t.isdigit())
        if votes:
            top = max(votes.values())
            winner = next(int(t) for t in group if t.isdigit() and votes[int(t)] == top)  # first to reach the top
            maj += any(t == answer for t in group if t.isdigit() and int(t) == winner)
    return {
        "accuracy": accuracy,
        "reward/mean": accuracy,
        "pass@1": accuracy,
        f"pass@{N_SAMPLES}": pass_n,
        f"maj@{N_SAMPLES}": maj / len(prompts),
    }


def test_accuracy_pass_at_k_and_maj_at_k_match_a_recount_of_the_completions() -> None:
    task = ArithmeticTask(seed=4)
    module = GRPOModule(_AnsweringPolicy(task), task, GRPOConfig(warmup_steps=0), seed=4)  # type: ignore[arg-type]
    scored: list[tuple[list[str], list[str]]] = []
    score_many = task.score_many

    def recording_score_many(texts, answers):  # the texts the evaluation scored, as it scored them
        scored.append((list(texts), list(answers)))
        return score_many(texts, answers)

    task.score_many = recording_score_many  # type: ignore[method-assign]
    eval_set = EvalSet(
        "easy",
        task.make_samples("easy", 1, SIZE),
        batch_size=7,
        options={"n_samples": N_SAMPLES, "temperature": 1.0, "max_new_tokens": 4},
    )
    [result] = run_round(module, [eval_set], lambda m, b, ctx: m.evaluate(b, ctx), seed=4, global_step=0, epoch=0)
    texts = [t for batch, _ in scored for t in batch]
    answers = [a for _, batch in scored for a in batch]
    assert len(texts) == SIZE * N_SAMPLES == result.num_samples
    expected = _recount(texts, answers)
    for name, value in expected.items():
        assert result.metrics[name] == pytest.approx(value, abs=1e-12), name
    # the fixture spreads the metrics apart: a metric computed from the wrong column would show
    assert 0 < expected["accuracy"] < expected[f"maj@{N_SAMPLES}"] < expected[f"pass@{N_SAMPLES}"] < 1
