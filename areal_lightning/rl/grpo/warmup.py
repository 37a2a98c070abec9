"""A supervised warm-up that teaches the answer format only, never the answers.

Targets are random digits of the task's fixed answer width, then end-of-sequence, after real
prompts: the policy learns to write that many digits and stop, so every sum is reachable; the
digits carry no information about the correct answer.
"""

from __future__ import annotations

import torch

from areal_lightning.rl.policy import TinyPolicy, completion_mask
from areal_lightning.tasks.arithmetic import ArithmeticTask

WARMUP_BATCH_SIZE = 64


def random_format_targets(
    batch_size: int,
    max_answer_len: int,
    width: int,
    eos_id: int,
    pad_id: int,
    first_digit_id: int,
    generator: torch.Generator,
) -> torch.Tensor:
    """[B, width] rows of `max_answer_len` random digit ids, then EOS, then pads."""
    lengths = torch.full((batch_size,), max_answer_len)
    digits = torch.randint(first_digit_id, first_digit_id + 10, (batch_size, width), generator=generator)
    cols = torch.arange(width)[None, :]
    targets = torch.where(cols < lengths[:, None], digits, torch.full_like(digits, pad_id))
    return targets.scatter(1, lengths[:, None], eos_id)


def format_warmup(policy: TinyPolicy, task: ArithmeticTask, *, steps: int, lr: float, seed: int) -> list[float]:
    """Trains `policy` in place for `steps` steps on format-only targets; returns the losses."""
    generator = torch.Generator().manual_seed(seed)
    tok = task.tokenizer
    samples = task.train_samples()
    max_answer_len = task.max_answer_len(task.train_digits)
    device = next(policy.parameters()).device
    optimizer = torch.optim.Adam(policy.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        picks = torch.randint(len(samples), (WARMUP_BATCH_SIZE,), generator=generator).tolist()
        ids, mask = tok.pad_left([tok.encode(samples[i].prompt) for i in picks])
        targets = random_format_targets(
            WARMUP_BATCH_SIZE,
            max_answer_len,
            max_answer_len + 1,
            tok.eos_id,
            tok.pad_id,
            tok.encode("0", bos=False)[0],
            generator,
        )
        ids, mask, targets = ids.to(device), mask.to(device), targets.to(device)
        logp, _ = policy.completion_logprobs(ids, mask, targets)
        keep = completion_mask(targets, tok.eos_id).float()
        loss = -(logp * keep).sum() / keep.sum()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    return losses
