"""An evaluation-time budget: rounds are deferred while they would push evaluation over a share
of the run's wall time. Pure Python, driven by a clock the caller owns (tests inject one)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from typing import Any

from areal_lightning.errors import ArgumentError

_KEY_EVAL = "eval_secs"
_KEY_WALL = "wall_secs"
_KEY_LAST = "last_round_secs"
_KEY_DEFERRED = "deferred"


class EvalBudget:
    """Keeps evaluation time at or under `share` of the wall time since training started.

    A round is allowed when, with the cost of the previous round as the estimate of this one,
    evaluation would still be at most `share` of the wall time afterwards; the first round is
    always allowed (nothing to estimate from). The caller never defers the final round.

    Args:
        share: the largest share of wall time spent evaluating, in (0, 1].
        clock: seconds from a monotonic clock.

    Raises:
        ArgumentError: for a share outside (0, 1].

    Example:
        >>> now = [0.0]
        >>> budget = EvalBudget(0.1, clock=lambda: now[0])
        >>> budget.start()
        >>> budget.allows()
        True
        >>> now[0] = 1.0; budget.add_round(1.0)   # a 1 s round after no training; none deferred before it
        0
        >>> now[0] = 10.0; budget.allows()        # 2 s of 11 would be 18%
        False
        >>> now[0] = 19.0; budget.allows(), round(budget.spent_share(), 3)  # 2 of 20 s: 10%
        (True, 0.053)
    """

    def __init__(self, share: float, clock: Callable[[], float] = time.monotonic) -> None:
        if (
            isinstance(share, bool)
            or not isinstance(share, (int, float))
            or not 0 < share <= 1
            or not math.isfinite(share)
        ):
            raise ArgumentError("EvaluationCallback", "budget", share, "a share of wall time in (0, 1] or None")
        self.share = float(share)
        self._clock = clock
        self._eval_secs = 0.0
        self._banked_wall = 0.0
        self._running_since: float | None = None
        self._last_round: float | None = None
        self._deferred = 0

    def start(self) -> None:
        """Training (re)starts: wall time counts from now (the downtime of a resume does not)."""
        self.stop()
        self._running_since = self._clock()

    def stop(self) -> None:
        if self._running_since is not None:
            self._banked_wall += self._clock() - self._running_since
            self._running_since = None

    def wall_secs(self) -> float:
        running = self._clock() - self._running_since if self._running_since is not None else 0.0
        return self._banked_wall + running

    def allows(self) -> bool:
        """A round now would keep evaluation within the budget."""
        if self._last_round is None:
            return True
        estimate = self._last_round
        return self._eval_secs + estimate <= self.share * (self.wall_secs() + estimate)

    def defer(self) -> None:
        """A round fell due and `allows` said no."""
        self._deferred += 1

    def add_round(self, secs: float) -> int:
        """A round took `secs` seconds (of the same wall clock); returns how many rounds were
        deferred since the previous one (a resumed run counts on from its checkpoint)."""
        self._eval_secs += float(secs)
        self._last_round = float(secs)
        deferred, self._deferred = self._deferred, 0
        return deferred

    def spent_share(self) -> float:
        """Evaluation seconds over wall seconds since training started (0 before any time passed)."""
        wall = self.wall_secs()
        return self._eval_secs / wall if wall > 0 else 0.0

    def state_dict(self) -> dict[str, Any]:
        return {
            _KEY_EVAL: self._eval_secs,
            _KEY_WALL: self.wall_secs(),
            _KEY_LAST: self._last_round,
            _KEY_DEFERRED: self._deferred,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self._eval_secs = float(state.get(_KEY_EVAL, 0.0))
        self._banked_wall = float(state.get(_KEY_WALL, 0.0))
        last = state.get(_KEY_LAST)
        self._last_round = None if last is None else float(last)
        self._deferred = int(state.get(_KEY_DEFERRED, 0))
        if self._running_since is not None:
            self._running_since = self._clock()
