"""Wilson score intervals of a share: of independent trials (`wilson_interval`), and of samples that
come in prompts, each prompt counted once (`prompt_wilson_interval`)."""

from __future__ import annotations

import torch
from torch import Tensor

from areal_lightning.metrics.checks import _check_confidence


def wilson_interval(
    successes: float | Tensor, total: float | Tensor, confidence: float = 0.95
) -> tuple[Tensor, Tensor]:
    """Wilson score interval for a proportion ``successes / total`` (float64, elementwise).

    Unlike the normal approximation it stays inside [0, 1] and behaves at 0 and ``total``
    successes. ``total == 0`` gives the uninformative interval (0.0, 1.0). Both arguments are
    counts: a fraction (e.g. a proportion passed instead of a count) is rejected, not rounded.

    Args:
        successes: whole number of successes, ``0 <= successes <= total``.
        total: whole number of trials, ``>= 0``.
        confidence: two-sided confidence level in (0, 1).

    Returns:
        ``(low, high)``, float64 tensors of the broadcast shape of the inputs.

    Raises:
        ValueError: if ``confidence`` is outside (0, 1), ``total`` is not a whole number >= 0, or
            ``successes`` is not a whole number in [0, total].

    Example:
        >>> low, high = wilson_interval(8, 10)
        >>> round(low.item(), 4), round(high.item(), 4)
        (0.4902, 0.9433)
    """
    confidence = _check_confidence(confidence, "wilson_interval")
    s = torch.as_tensor(successes, dtype=torch.float64)
    t = torch.as_tensor(total, dtype=torch.float64, device=s.device)
    s, t = torch.broadcast_tensors(s, t)  # type: ignore[no-untyped-call]  # torch leaves it unannotated
    bad_t = ~(torch.isfinite(t) & (t >= 0) & (t == t.floor()))
    if bad_t.any():  # report the first offending value, not a whole tensor
        raise ValueError(
            f"`wilson_interval(total=...)` must be a whole number >= 0 (a count of trials), got {t[bad_t][0].item()}"
        )
    bad_s = ~(torch.isfinite(s) & (s >= 0) & (s <= t) & (s == s.floor()))
    if bad_s.any():
        raise ValueError(
            f"`wilson_interval(successes=...)` must be a whole number in [0, total], "
            f"got successes={s[bad_s][0].item()}, total={t[bad_s][0].item()}"
        )
    return _wilson_bounds(s, t, t, confidence)


def prompt_wilson_interval(
    successes: float | Tensor, total: float | Tensor, prompts: float | Tensor, confidence: float = 0.95
) -> tuple[Tensor, Tensor]:
    """Wilson score interval for the share ``successes / total`` of samples drawn from `prompts`
    prompts, counting each prompt once: the samples of one prompt are not independent trials (a
    prompt the policy always solves is solved by all its samples), so the interval is as wide as
    that of ``prompts`` trials with the same share. With one sample a prompt it is
    `wilson_interval`.

    Args:
        successes: whole number of successful samples, ``0 <= successes <= total``.
        total: whole number of samples.
        prompts: whole number of distinct prompts they came from, ``<= total`` (0 with no sample).
        confidence: two-sided confidence level in (0, 1).

    Raises:
        ValueError: as `wilson_interval`, or if ``prompts`` is not a whole number in [0, total]
            (and > 0 where ``total`` is).

    Example:
        >>> low, high = prompt_wilson_interval(4, 8, 2)  # two prompts, one always solved, one never
        >>> [round(v, 4) for v in (low.item(), high.item())] == [round(v.item(), 4) for v in wilson_interval(1, 2)]
        True
    """
    confidence = _check_confidence(confidence, "prompt_wilson_interval")
    s = torch.as_tensor(successes, dtype=torch.float64)
    t = torch.as_tensor(total, dtype=torch.float64, device=s.device)
    n = torch.as_tensor(prompts, dtype=torch.float64, device=s.device)
    s, t, n = torch.broadcast_tensors(s, t, n)  # type: ignore[no-untyped-call]  # torch leaves it unannotated
    wilson_interval(s, t, confidence)  # the same checks of the counts
    bad_n = ~(torch.isfinite(n) & (n >= 0) & (n <= t) & (n == n.floor()) & ((n > 0) | (t == 0)))
    if bad_n.any():
        raise ValueError(
            "`prompt_wilson_interval(prompts=...)` must be a whole number in [1, total] (0 with no sample), "
            f"got prompts={n[bad_n][0].item()}, total={t[bad_n][0].item()}"
        )
    return _wilson_bounds(s, t, n, confidence)


def _wilson_bounds(s: Tensor, t: Tensor, n: Tensor, confidence: float) -> tuple[Tensor, Tensor]:
    """The Wilson bounds of the share ``s / t`` with ``n`` trials (``n == t``: the classic interval)."""
    z = torch.special.ndtri(torch.tensor(0.5 + confidence / 2, dtype=torch.float64, device=s.device))
    p = s / t.clamp_min(1)  # changes total == 0 only, whose interval is replaced below
    safe_t = n.clamp_min(1)
    z2n = z * z / safe_t
    center = (p + z2n / 2) / (1 + z2n)
    half = z * torch.sqrt(p * (1 - p) / safe_t + z2n / (4 * safe_t)) / (1 + z2n)
    # The bounds are exactly 0 / 1 at 0 / total successes; pin them so rounding does not leak.
    low = torch.where(s == 0, torch.zeros_like(p), (center - half).clamp(0, 1))
    high = torch.where(s == t, torch.ones_like(p), (center + half).clamp(0, 1))
    empty = t == 0
    return torch.where(empty, 0.0, low), torch.where(empty, 1.0, high)
