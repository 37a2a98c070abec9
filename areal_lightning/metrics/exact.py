"""Exact sums of float64 values in a metric state: the result does not depend on how the values
were split between ranks and updates.

A float64 running sum rounds at every addition, so its last bits depend on the order and the
grouping of the additions: the same eval set on 1 and on 2 ranks gives a mean reward of
5.000000000000001e-05 and 5.0000000000000016e-05. Here every finite float64 is an integer times a
power of two, and the sum is kept as an integer in fixed point, in base-2**32 digits stored in a
float64 tensor (each digit a whole number far below 2**53, so float64 holds it exactly). Integer
addition is exact and associative, so the state after any split of the values, and its sum over
ranks, is the same integer; ``compute`` rounds it once. The digits span the whole float64 range
and that of the squares (``2**-2272`` to ``2**2080``): no value is ever out of range.

"Exact" means: the mean (and sum) returned is the float64 nearest to the exact mean of the float64
values added (round half to even), and the std the float64 nearest to the exact population std.
Values that are not float64 are converted first (float32 and integers up to 2**53 exactly).

A state is a 1-D float64 tensor of ``SUM_SIZE``: the digits, then the numbers of NaN, +inf and
-inf values, then the number of values. A metric declares it with
``add_state(name, new_sum(), dist_reduce_fx=merge_sums)``; it must stay float64 (a narrower type
would round the digits): a metric built on `Float64StateMetric` keeps it float64 through
``set_dtype``, ``.to(dtype)`` and a precision plugin converting the module that holds it.

Example:
    >>> values = torch.tensor([1e16, 0.1, -1e16, 0.2], dtype=torch.float64)
    >>> sum(values.tolist()), sum(values[[0, 2, 1, 3]].tolist())  # a float sum depends on the order
    (0.2, 0.30000000000000004)
    >>> first, rest = add_values(new_sum(), values[:1]), add_values(new_sum(), values[1:])
    >>> sum_float(merge_sums(torch.stack([first, rest]))), sum_float(add_values(new_sum(), values.flip(0)))
    (0.30000000000000004, 0.30000000000000004)
"""

from __future__ import annotations

import math
from fractions import Fraction

import torch
from torch import Tensor

DIGIT_BITS: int = 32
_DIGIT_MASK = (1 << DIGIT_BITS) - 1
_LOWEST_EXPONENT = -2272
"""Weight ``2**-2272`` of the lowest digit: below the lowest bit of a subnormal's square (2**-2252)."""
NUM_DIGITS: int = 137
"""Up to 2**2080: above the largest square (2**2048), with room for the carries of 2**32 of them."""
_MANTISSA_BITS = 53
_HALF_MANTISSA = 27  # squares: a 53-bit mantissa is split 26 + 27 so that each partial product fits int64
_CHUNK = 1 << 24  # values per pass: each digit gets < 2**35 per value, so int64 digits do not overflow
SUM_SIZE: int = NUM_DIGITS + 4
"""The digits, then the numbers of NaN, +inf and -inf values, then the number of values."""
_COUNT = NUM_DIGITS + 3
_MIN_ROOT_BITS = 110  # an integer square root of >= 55 bits leaves 2 bits below float64's 53 for a sticky bit


def new_sum(device: torch.device | str | None = None) -> Tensor:
    """An empty exact-sum state (zeros), float64, on ``device``."""
    return torch.zeros(SUM_SIZE, dtype=torch.float64, device=device)


def _carry(digits: Tensor) -> Tensor:
    """Moves each int64 digit's bits above ``DIGIT_BITS`` into the next digit (same value), along
    the last dimension.

    Afterwards every digit but the last lies in ``[-2**31, 2**32 + 2**31)`` whatever it held
    (below 2**63); the last one keeps the sign of the total.
    """
    carry = digits[..., :-1] >> DIGIT_BITS  # arithmetic shift: floor, also for negative digits
    out = digits.clone()
    out[..., :-1] -= carry << DIGIT_BITS
    out[..., 1:] += carry
    return out


def _digits_of_terms(mantissas: Tensor, exponents: Tensor, device: torch.device) -> Tensor:
    """Int64 digits (not carried) of ``sum(mantissa * 2**exponent)``, ``|mantissa| < 2**55``."""
    position = exponents - _LOWEST_EXPONENT
    index, scale = position.div(DIGIT_BITS, rounding_mode="floor"), 2 ** (position % DIGIT_BITS)
    # mantissa = high * 2**32 + low with 0 <= low < 2**32 (>> floors, also for negative mantissas)
    low = (mantissas & _DIGIT_MASK) * scale  # < 2**63
    high = (mantissas >> DIGIT_BITS) * scale  # |high| < 2**54
    pieces = torch.cat([low & _DIGIT_MASK, low >> DIGIT_BITS, high & _DIGIT_MASK, high >> DIGIT_BITS])
    where = torch.cat([index, index + 1, index + 1, index + 2])
    # Integer additions: exact and order-free, also where index_add_ runs in parallel (CUDA).
    return torch.zeros(NUM_DIGITS, dtype=torch.int64, device=device).index_add_(0, where, pieces)


def _mantissas(finite: Tensor) -> tuple[Tensor, Tensor]:
    """``(m, e)`` int64 with ``finite == m * 2**e`` exactly, ``|m| < 2**53`` (subnormals too)."""
    fraction, exponent = torch.frexp(finite)  # finite = fraction * 2**exponent, 0.5 <= |fraction| < 1
    return (fraction * 2.0**_MANTISSA_BITS).to(torch.int64), exponent.to(torch.int64) - _MANTISSA_BITS


def _add(state: Tensor, values: Tensor, squares: bool) -> Tensor:
    x = values.detach().flatten().to(device=state.device, dtype=torch.float64)
    total = state[:NUM_DIGITS].to(torch.int64)  # whole numbers below 2**53: converted exactly
    for start in range(0, x.numel(), _CHUNK):
        chunk = x[start : start + _CHUNK]
        # Non-finite values are counted apart; masking with where (not indexing) avoids a device sync.
        mantissa, exponent = _mantissas(torch.where(torch.isfinite(chunk), chunk, 0.0))
        if squares:
            magnitude = mantissa.abs()
            high, low = magnitude >> _HALF_MANTISSA, magnitude & ((1 << _HALF_MANTISSA) - 1)
            # m**2 = high**2 * 2**54 + 2 * high * low * 2**27 + low**2, each product below 2**55.
            terms = torch.cat([high * high, 2 * high * low, low * low])
            shifts = torch.cat([2 * exponent + 2 * _HALF_MANTISSA, 2 * exponent + _HALF_MANTISSA, 2 * exponent])
            digits = _digits_of_terms(terms, shifts, state.device)
        else:
            digits = _digits_of_terms(mantissa, exponent, state.device)
        total = _carry(total + digits)
    nan, pos_inf, neg_inf = torch.isnan(x).sum(), (x == math.inf).sum(), (x == -math.inf).sum()
    if squares:  # the square of an infinite value is +inf
        pos_inf, neg_inf = pos_inf + neg_inf, torch.zeros_like(neg_inf)
    counts = torch.stack([nan, pos_inf, neg_inf, nan.new_tensor(x.numel())]).to(torch.float64)
    return torch.cat([total.to(torch.float64), state[NUM_DIGITS:] + counts])


def add_values(state: Tensor, values: Tensor) -> Tensor:
    """The state after adding ``values`` (any shape, flattened, converted to float64).

    Example:
        >>> sum_float(add_values(new_sum(), torch.tensor([1e100, 1.0, -1e100], dtype=torch.float64)))
        1.0
    """
    return _add(state, values, squares=False)


def add_squares(state: Tensor, values: Tensor) -> Tensor:
    """The state after adding the exact squares of ``values`` (no rounding of ``x * x``).

    Example:
        >>> sum_fraction(add_squares(new_sum(), torch.tensor([0.1], dtype=torch.float64))) == Fraction(0.1) ** 2
        True
    """
    return _add(state, values, squares=True)


def merge_sums(states: Tensor) -> Tensor:
    """The sum of states stacked along dimension 0 (``[k, ..., SUM_SIZE]``): the ``dist_reduce_fx``.

    torchmetrics calls it with the states of all ranks (and, in ``forward``, with the accumulated
    and the batch state); their digits are whole numbers below 2**34, so the float64 sum of up to
    2**18 states is exact. A state may itself be a stack of sums (``[..., SUM_SIZE]``).
    """
    total = _carry(states[..., :NUM_DIGITS].sum(dim=0).to(torch.int64))
    return torch.cat([total.to(torch.float64), states[..., NUM_DIGITS:].sum(dim=0)], dim=-1)


def sum_count(state: Tensor) -> int:
    """How many values were added (NaN and infinite ones included)."""
    return int(state[_COUNT].item())


def _read(state: Tensor) -> tuple[int, float | None, int]:
    """``(scaled, special, count)``: the exact finite sum is ``scaled * 2**-2272``; ``special`` is
    the IEEE sum (NaN or +-inf) when a non-finite value was added, else None."""
    words = state.tolist()
    scaled = sum(int(digit) << (DIGIT_BITS * i) for i, digit in enumerate(words[:NUM_DIGITS]))
    nan, pos_inf, neg_inf, count = words[NUM_DIGITS:]
    special = math.nan if nan or (pos_inf and neg_inf) else math.inf if pos_inf else -math.inf if neg_inf else None
    return scaled, special, int(count)


def _ratio(numerator: int, denominator: int) -> float:
    """``numerator / denominator`` correctly rounded (Python's integer division is); +-inf past float64."""
    try:
        return numerator / denominator
    except OverflowError:
        return math.inf if numerator > 0 else -math.inf  # the denominator is positive


def sum_over(state: Tensor, divisor: int) -> float:
    """The float64 nearest to the exact sum divided by the positive integer `divisor` (a mean over
    something else than the values added, e.g. per-token values added as per-completion sums);
    NaN when `divisor` is 0, the IEEE result when a NaN or infinite value was added.

    Example:
        >>> sum_over(add_values(new_sum(), torch.tensor([0.1, 0.2], dtype=torch.float64)), 3) == 0.1
        True
    """
    scaled, special, _ = _read(state)
    if divisor == 0:
        return math.nan
    return special if special is not None else _ratio(scaled, divisor << -_LOWEST_EXPONENT)


def sum_fraction(state: Tensor) -> Fraction | float:
    """The exact sum as a Fraction, or NaN / +-inf when a non-finite value was added."""
    scaled, special, _ = _read(state)
    return special if special is not None else Fraction(scaled, 1 << -_LOWEST_EXPONENT)


def sum_float(state: Tensor) -> float:
    """The float64 nearest to the exact sum (``math.fsum`` of the values); 0.0 when empty."""
    scaled, special, _ = _read(state)
    return special if special is not None else _ratio(scaled, 1 << -_LOWEST_EXPONENT)


def mean_float(state: Tensor) -> float:
    """The float64 nearest to the exact mean; NaN when empty, the IEEE result with NaN / inf values.

    Example:
        >>> mean_float(add_values(new_sum(), torch.tensor([1.0, 2.0, 2.0])))
        1.6666666666666667
    """
    scaled, special, count = _read(state)
    if count == 0:
        return math.nan
    return special if special is not None else _ratio(scaled, count << -_LOWEST_EXPONENT)


def _sqrt_ratio(numerator: int, denominator: int) -> float:
    """``sqrt(numerator / denominator)`` correctly rounded, for integers ``numerator >= 0 < denominator``."""
    if numerator == 0:
        return 0.0
    # Scale by 4**k so that the integer root has at least 55 bits; a root that is not exact gets
    # its last bit set (sticky), which rounds to nearest the same way as the true irrational root.
    k = (_MIN_ROOT_BITS + 2 - numerator.bit_length() + denominator.bit_length()) // 2
    if k >= 0:
        scaled, rest = divmod(numerator << (2 * k), denominator)
    else:
        scaled, rest = divmod(numerator, denominator << (-2 * k))
    root = math.isqrt(scaled)
    if rest or root * root != scaled:
        root |= 1
    return _ratio(root, 1 << k) if k >= 0 else _ratio(root << -k, 1)


def std_float(sums: Tensor, squares: Tensor) -> float:
    """The float64 nearest to the exact population std of the values added to both states.

    ``sums`` holds the values (:func:`add_values`), ``squares`` their squares (:func:`add_squares`).
    Computed from the exact sums as ``sqrt(n * Q - S**2) / n``, without cancellation (it is exact
    until the one rounding). NaN when empty or when a value was NaN or infinite.

    Example:
        >>> values = torch.tensor([1e8 + 0.25, 1e8 + 0.5, 1e8 + 0.75], dtype=torch.float64)
        >>> std_float(add_values(new_sum(), values), add_squares(new_sum(), values)) == (1 / 24) ** 0.5
        True
    """
    scaled, special, count = _read(sums)
    scaled_squares, _, _ = _read(squares)
    if special is not None or count == 0:
        return math.nan
    # S = scaled * 2**L and Q = scaled_squares * 2**L (L = _LOWEST_EXPONENT), so
    # var = Q / n - S**2 / n**2 = (n * scaled_squares * 2**-L - scaled**2) / (n**2 * 2**-2L).
    numerator = count * (scaled_squares << -_LOWEST_EXPONENT) - scaled * scaled
    return _sqrt_ratio(numerator, (count * count) << (-2 * _LOWEST_EXPONENT))


def stderr_float(sums: Tensor, squares: Tensor) -> float:
    """The float64 nearest to the standard error of the mean of the values added to both states:
    their sample std (divisor ``n - 1``) over ``sqrt(n)``, i.e. ``sqrt((n * Q - S**2) / (n**2 * (n - 1)))``.

    Exact until the one rounding, like :func:`std_float`. NaN with fewer than two values or when a
    value was NaN or infinite.

    Example:
        >>> values = torch.tensor([0.0, 1.0, 1.0, 1.0], dtype=torch.float64)
        >>> stderr_float(add_values(new_sum(), values), add_squares(new_sum(), values))  # sample std 0.5, over sqrt(4)
        0.25
    """
    scaled, special, count = _read(sums)
    scaled_squares, _, _ = _read(squares)
    if special is not None or count < 2:
        return math.nan
    numerator = count * (scaled_squares << -_LOWEST_EXPONENT) - scaled * scaled
    return _sqrt_ratio(numerator, (count * count * (count - 1)) << (-2 * _LOWEST_EXPONENT))
