"""Pure RL evaluation math: group advantages, pass@k, maj@k, mean@n, Wilson intervals.

Shapes: ``P`` prompts, ``G`` samples per group (training) or ``n`` samples per prompt (evaluation).
Everything here is stateless; the ``torchmetrics`` classes in this package only accumulate what
these functions return. Per-prompt results are float64; the classes sum them exactly (see
``exact``), so their averages do not depend on the number of devices.
"""

from __future__ import annotations

import math
import numbers

import torch
from torch import Tensor

from areal_lightning.metrics.checks import (
    _as_2d,
    _check_binary,
    _check_k,
    _check_k_le_n,
    _check_rewards_2d,
)
from areal_lightning.metrics.constants import NO_ANSWER, AdvantageStd
from areal_lightning.metrics.intervals import (
    prompt_wilson_interval as prompt_wilson_interval,
    wilson_interval as wilson_interval,
)

ADVANTAGE_EPS: float = 1e-6
"""Added to a group's std before dividing, so that near-constant groups do not explode."""


# ----------------------------------------------------------------------------- group advantages
def _check_std(std: AdvantageStd | str, where: str) -> AdvantageStd:
    try:
        return AdvantageStd(std)
    except (ValueError, TypeError):
        raise ValueError(f"`{where}(std=...)` must be one of {[s.value for s in AdvantageStd]}, got {std!r}") from None


def _check_eps(eps: float, where: str) -> float:
    if isinstance(eps, bool) or not isinstance(eps, numbers.Real) or not 0 <= eps < math.inf:
        raise ValueError(f"`{where}(eps=...)` must be a finite number >= 0, got {eps!r}")
    return float(eps)


def _zero_std_groups(rewards: Tensor) -> Tensor:
    """:func:`zero_std_groups` of rewards already checked by ``_check_rewards_2d``."""
    rewards = rewards.to(torch.float64)
    if rewards.shape[1] == 0:  # amin/amax refuse empty rows; an empty group has no spread
        return torch.ones(rewards.shape[0], dtype=torch.bool, device=rewards.device)
    finite = ~torch.isnan(rewards)
    inf = torch.full_like(rewards, math.inf)
    low = torch.where(finite, rewards, inf).amin(dim=1)
    high = torch.where(finite, rewards, -inf).amax(dim=1)
    return (low == high) | ~finite.any(dim=1)


def zero_std_groups(rewards: Tensor) -> Tensor:
    """Flag the groups whose finite rewards are all equal (no learning signal for GRPO).

    NaN rewards are missing and ignored; a group with fewer than two finite rewards counts as
    zero-std (it has no spread either).

    Args:
        rewards: ``[P, G]`` rewards, one row per group; NaN marks a missing reward.

    Returns:
        ``[P]`` bool tensor.

    Raises:
        ValueError: if ``rewards`` is not 2-D or holds an infinite value.

    Example:
        >>> zero_std_groups(torch.tensor([[1.0, 1.0, float("nan")], [0.0, 1.0, 1.0]]))
        tensor([ True, False])
    """
    return _zero_std_groups(_check_rewards_2d(rewards, "zero_std_groups"))


def _group_advantages(rewards: Tensor, scale: bool, std: AdvantageStd, eps: float) -> Tensor:
    """:func:`group_advantages` of checked rewards and arguments."""
    out_dtype = rewards.dtype if rewards.is_floating_point() else torch.get_default_dtype()
    r = rewards.to(torch.float64)
    finite = ~torch.isnan(r)
    count = finite.sum(dim=1, keepdim=True)
    mean = torch.where(finite, r, 0.0).sum(dim=1, keepdim=True) / count.clamp_min(1)
    centered = torch.where(finite, r - mean, 0.0)
    if scale:
        dof = count - 1 if std is AdvantageStd.SAMPLE else count
        # A group with dof < 1 has at most one finite reward: it is zero-std and zeroed below.
        group_std = ((centered * centered).sum(dim=1, keepdim=True) / dof.clamp_min(1)).sqrt()
        centered = centered / (group_std + eps)
    # Rounding in the mean would leave tiny non-zero values in constant groups; force exact zeros.
    flat = _zero_std_groups(rewards).unsqueeze(1)
    return torch.where(flat, torch.zeros_like(centered), centered).to(out_dtype)


def group_advantages(
    rewards: Tensor, scale: bool = True, std: AdvantageStd | str = AdvantageStd.SAMPLE, eps: float = ADVANTAGE_EPS
) -> Tensor:
    """Group-relative advantages (GRPO): each reward minus its group's mean, optionally scaled.

    ``A[p, g] = (r[p, g] - mean_p) / (std_p + eps)`` with ``scale=True``, else ``r[p, g] - mean_p``.
    ``std_p`` is the group's *sample* std by default (divide by ``n - 1``, ``n`` its number of
    finite rewards), the convention of TRL's ``GRPOTrainer`` and verl's
    ``compute_grpo_outcome_advantage``; ``std="population"`` divides by ``n`` instead, which
    makes advantages larger by ``sqrt(n / (n - 1))``. NaN rewards are missing: left out of the
    group's mean and std, and their own advantage is 0. A group whose finite rewards are all equal
    gets exactly zero advantage; so does a group with a single finite reward (``G == 1``, or all
    but one missing), which has no sample std (verl returns that reward unchanged instead).
    Computed in float64, returned in the input's dtype (integer or bool rewards give the default
    float dtype).

    Args:
        rewards: ``[P, G]`` rewards, one row per group of samples of the same prompt.
        scale: divide by ``std + eps``.
        std: ``"sample"`` (``n - 1``) or ``"population"`` (``n``), see :class:`AdvantageStd`;
            used only with ``scale=True``.
        eps: non-negative, added to the std before dividing.

    Returns:
        ``[P, G]`` advantages.

    Raises:
        ValueError: if ``rewards`` is not 2-D or holds an infinite value, ``std`` is not one of
            the two conventions, or ``eps`` is negative.

    Example:
        >>> group_advantages(torch.tensor([[1.0, 0.0], [1.0, 1.0]]), scale=False)
        tensor([[ 0.5000, -0.5000],
                [ 0.0000,  0.0000]])
        >>> group_advantages(torch.tensor([[0.0, 1.0, 2.0]]), eps=0.0)  # sample std 1.0
        tensor([[-1.,  0.,  1.]])
    """
    return _group_advantages(
        _check_rewards_2d(rewards, "group_advantages"),
        scale,
        _check_std(std, "group_advantages"),
        _check_eps(eps, "group_advantages"),
    )


# ----------------------------------------------------------------------------- pass@k, maj@k, mean@n
def _pass_at_k_per_prompt(correct: Tensor, k: int, where: str, name: str = "k") -> Tensor:
    correct = _check_binary(_as_2d(correct, "correct", where), "correct", where)
    n = correct.shape[1]
    _check_k_le_n(k, n, where, name)
    # 1 - C(n-c, k) / C(n, k) for c = 0 .. n, each the float64 nearest to the exact value: integer
    # binomials, one correctly rounded division (a float product, as in Chen et al. 2021, is off by
    # up to 11 units in the last place for n <= 32).
    total = math.comb(n, k)
    table = [(total - math.comb(n - c, k)) / total for c in range(n + 1)]
    return torch.tensor(table, dtype=torch.float64, device=correct.device)[correct.sum(dim=1)]


def pass_at_k_per_prompt(correct: Tensor, k: int) -> Tensor:
    """Unbiased pass@k of each prompt: ``1 - C(n - c, k) / C(n, k)``, ``c`` correct out of ``n``.

    The probability that at least one of ``k`` samples drawn without replacement from the ``n``
    is correct (Chen et al. 2021), each value the float64 nearest to the exact ratio (computed from
    integer binomials).

    Args:
        correct: ``[P, n]`` bool or 0/1 tensor, whether each sample is correct.
        k: positive integer, ``k <= n``.

    Returns:
        ``[P]`` float64.

    Raises:
        ValueError: if ``correct`` is not 2-D or not 0/1, ``k`` is not a positive integer, or ``k > n``.

    Example:
        >>> pass_at_k_per_prompt(torch.tensor([[1, 0, 0, 0], [0, 0, 0, 0]]), k=2)
        tensor([0.5000, 0.0000], dtype=torch.float64)
    """
    return _pass_at_k_per_prompt(correct, _check_k(k, "pass_at_k_per_prompt"), "pass_at_k_per_prompt")


def pass_at_k(correct: Tensor, k: int) -> Tensor:
    """Unbiased pass@k averaged over prompts (see :func:`pass_at_k_per_prompt`); NaN when ``P == 0``.

    Example:
        >>> pass_at_k(torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0]]), k=2)
        tensor(0.6667, dtype=torch.float64)
    """
    return _pass_at_k_per_prompt(correct, _check_k(k, "pass_at_k"), "pass_at_k").mean()


def _pass_hat_k_per_prompt(correct: Tensor, k: int, where: str, name: str = "k") -> Tensor:
    correct = _check_binary(_as_2d(correct, "correct", where), "correct", where)
    n = correct.shape[1]
    _check_k_le_n(k, n, where, name)
    # C(c, k) / C(n, k) for c = 0 .. n, each the float64 nearest to the exact ratio (integer binomials).
    total = math.comb(n, k)
    table = [math.comb(c, k) / total for c in range(n + 1)]
    return torch.tensor(table, dtype=torch.float64, device=correct.device)[correct.sum(dim=1)]


def pass_hat_k_per_prompt(correct: Tensor, k: int) -> Tensor:
    """Unbiased pass^k of each prompt: the probability that ``k`` samples drawn without replacement
    from the ``n`` are all correct, ``C(c, k) / C(n, k)`` with ``c`` correct out of ``n``.

    Each value is the float64 nearest to the exact ratio. pass^1 is the share of correct samples;
    pass^k falls with k where pass@k rises: together they tell reliability from coverage.

    Args:
        correct: ``[P, n]`` bool or 0/1 tensor, whether each sample is correct.
        k: positive integer, ``k <= n``.

    Returns:
        ``[P]`` float64.

    Raises:
        ValueError: if ``correct`` is not 2-D or not 0/1, ``k`` is not a positive integer, or ``k > n``.

    Example:
        >>> pass_hat_k_per_prompt(torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]]), k=2)  # C(3,2)/C(4,2) = 1/2
        tensor([0.5000, 1.0000], dtype=torch.float64)
    """
    return _pass_hat_k_per_prompt(correct, _check_k(k, "pass_hat_k_per_prompt"), "pass_hat_k_per_prompt")


def _maj_at_k_per_prompt(answer_ids: Tensor, correct: Tensor, k: int, where: str, name: str = "k") -> Tensor:
    answer_ids = _as_2d(answer_ids, "answer_ids", where)
    correct = _check_binary(_as_2d(correct, "correct", where), "correct", where)
    if answer_ids.dtype == torch.bool or answer_ids.is_floating_point() or answer_ids.is_complex():
        raise ValueError(
            f"`{where}(answer_ids=...)` must be an integer tensor of answer ids, got dtype {answer_ids.dtype}"
        )
    if answer_ids.shape != correct.shape:
        raise ValueError(
            f"`{where}(correct=...)` must have the shape of answer_ids {tuple(answer_ids.shape)}, "
            f"got {tuple(correct.shape)}"
        )
    if answer_ids.numel() and int(answer_ids.min()) < NO_ANSWER:
        raise ValueError(
            f"`{where}(answer_ids=...)` must be >= {NO_ANSWER} ({NO_ANSWER} means no answer), "
            f"got {int(answer_ids.min())}"
        )
    _check_k_le_n(k, answer_ids.shape[1], where, name)
    ids, ok = answer_ids[:, :k], correct[:, :k]
    valid = ids != NO_ANSWER
    same = ids.unsqueeze(2) == ids.unsqueeze(1)  # [P, k, k]: sample j and sample l give the same answer
    votes = (same & valid.unsqueeze(1)).sum(dim=2)
    votes = torch.where(valid, votes, torch.zeros_like(votes))
    # argmax returns the first maximal index, i.e. the tied answer that appears first wins.
    winner = (votes == votes.amax(dim=1, keepdim=True)).int().argmax(dim=1, keepdim=True)
    winner_ok = (same.gather(1, winner.unsqueeze(2).expand(-1, 1, k)).squeeze(1) & ok).any(dim=1)
    return (winner_ok & valid.any(dim=1)).to(torch.float64)


def maj_at_k_per_prompt(answer_ids: Tensor, correct: Tensor, k: int) -> Tensor:
    """Majority vote over each prompt's first ``k`` samples: 1.0 when the winning answer is correct.

    Votes count the samples per answer id among the first ``k``; ``-1`` (no answer) never gets
    votes, and a prompt whose first ``k`` samples are all ``-1`` is incorrect. Ties are broken
    deterministically: among the answers with the most votes, the one that appears first (lowest
    sample index) wins. The winning answer is correct when any of the first ``k`` samples with that
    id is marked correct.

    Args:
        answer_ids: ``[P, n]`` integer tensor, one id per distinct final answer, ``-1`` for none.
        correct: ``[P, n]`` bool or 0/1 tensor, whether each sample is correct.
        k: positive integer, ``k <= n``.

    Returns:
        ``[P]`` float64 of 0.0 / 1.0.

    Raises:
        ValueError: on non-2-D or mismatched shapes, non-integer or < -1 ids, non-0/1 ``correct``,
            a non-positive ``k`` or ``k > n``.

    Example:
        >>> ids = torch.tensor([[3, 5, 5, 3], [-1, -1, 2, 2]])
        >>> ok = torch.tensor([[1, 0, 0, 1], [0, 0, 1, 1]])
        >>> maj_at_k_per_prompt(ids, ok, k=4)  # row 0: 3 and 5 tie, 3 appears first
        tensor([1., 1.], dtype=torch.float64)
    """
    k = _check_k(k, "maj_at_k_per_prompt")
    return _maj_at_k_per_prompt(answer_ids, correct, k, "maj_at_k_per_prompt")


def maj_at_k(answer_ids: Tensor, correct: Tensor, k: int) -> Tensor:
    """maj@k averaged over prompts (see :func:`maj_at_k_per_prompt`); NaN when ``P == 0``.

    Example:
        >>> maj_at_k(torch.tensor([[3, 5, 5], [1, 2, 2]]), torch.tensor([[1, 0, 0], [1, 0, 0]]), k=3)
        tensor(0., dtype=torch.float64)
    """
    return _maj_at_k_per_prompt(answer_ids, correct, _check_k(k, "maj_at_k"), "maj_at_k").mean()


def mean_at_n(values: Tensor) -> Tensor:
    """mean@n: the mean over each prompt's ``n`` samples, averaged over prompts (float64).

    Each prompt weighs the same whatever its ``n``; NaN when ``P == 0``.

    Args:
        values: ``[P, n]`` per-sample values (rewards, or 0/1 correctness), ``n >= 1``.

    Raises:
        ValueError: if ``values`` is not 2-D or has no samples per prompt.

    Example:
        >>> mean_at_n(torch.tensor([[1.0, 0.0], [1.0, 1.0]]))
        tensor(0.7500, dtype=torch.float64)
    """
    values = _as_2d(values, "values", "mean_at_n")
    if values.shape[1] == 0:
        raise ValueError(f"`mean_at_n(values=...)` needs n >= 1 samples per prompt, got shape {tuple(values.shape)}")
    return values.to(torch.float64).mean(dim=1).mean()


# ----------------------------------------------------------------------------- Wilson interval
