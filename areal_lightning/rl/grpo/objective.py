"""The per-token terms of the GRPO loss, shared by single-turn and episode training."""

from __future__ import annotations

from torch import Tensor


def policy_gradient(logp: Tensor, advantages: Tensor) -> Tensor:
    """Per-token policy-gradient loss ``-ratio * advantage`` of one update per rollout.

    The weights that sampled are the weights being updated, so the sampling policy's log-probs are
    `logp` without its graph: the ratio ``exp(logp - logp.detach())`` is 1 in value and carries the
    gradient of ``logp`` (a clip range would never act; see docs/decisions.md).

    Example:
        >>> import torch
        >>> logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
        >>> policy_gradient(logp, torch.tensor([[0.5]])).sum().backward()
        >>> logp.grad
        tensor([[-0.5000, -0.5000]])
    """
    ratio = (logp - logp.detach()).exp()
    return -ratio * advantages


def k3_kl(ref_logp: Tensor, logp: Tensor) -> Tensor:
    """Per-token KL estimate to the reference policy (Schulman's k3: unbiased, non-negative)."""
    log_ratio = ref_logp - logp
    return log_ratio.exp() - log_ratio - 1
