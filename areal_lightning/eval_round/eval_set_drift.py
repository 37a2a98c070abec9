"""Drift checks: an eval set whose content changed during a run (e.g. a data file edited between
resumes) makes the curves before and after it incomparable; say so once, and record it."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from areal_lightning.eval_round.eval_set import EvalSet
from areal_lightning.eval_round.fingerprint import eval_set_fingerprint
from areal_lightning.eval_round.subsample import sample_stratum


def eval_set_summary(eval_set: EvalSet) -> dict[str, Any]:
    """``{"fingerprint": ..., "strata": {stratum: count}}`` of an eval set (plain values, for a checkpoint).

    Example:
        >>> eval_set_summary(EvalSet("easy", [{"stratum": "a"}, {"stratum": "b"}, {"stratum": "a"}]))["strata"]
        {'a': 2, 'b': 1}
    """
    strata = Counter(sample_stratum(s) for s in eval_set.samples)
    return {"fingerprint": eval_set_fingerprint(eval_set), "strata": dict(sorted(strata.items()))}


def drift_message(name: str, before: Mapping[str, Any], now: Mapping[str, Any]) -> str | None:
    """Why eval set `name` is not the one summarised in `before`, or None when it is.

    Example:
        >>> drift_message("easy", {"fingerprint": "ab", "strata": {"a": 2}}, {"fingerprint": "cd", "strata": {"a": 3}})
        "eval set 'easy' changed during the run (fingerprint ab -> cd; strata {'a': 2} -> {'a': 3}): ..."
    """
    parts = []
    if before.get("fingerprint") != now.get("fingerprint"):
        parts.append(f"fingerprint {before.get('fingerprint')} -> {now.get('fingerprint')}")
    if dict(before.get("strata", {})) != dict(now.get("strata", {})):
        parts.append(f"strata {dict(before.get('strata', {}))} -> {dict(now.get('strata', {}))}")
    if not parts:
        return None
    return (
        f"eval set {name!r} changed during the run ({'; '.join(parts)}): its metrics before and after "
        "this point are not comparable"
    )


class DriftMonitor:
    """Remembers each eval set's summary; `check` reports the sets that changed since, once per change.

    Example:
        >>> monitor = DriftMonitor()
        >>> monitor.check([EvalSet("easy", [1, 2])])
        {}
        >>> list(monitor.check([EvalSet("easy", [1, 3])]))
        ['easy']
    """

    def __init__(self) -> None:
        self._seen: dict[str, dict[str, Any]] = {}

    def check(self, eval_sets: Sequence[EvalSet]) -> dict[str, str]:
        """``{name: message}`` for each eval set that differs from the one seen before; the new
        content becomes the reference (so each change is reported once)."""
        out: dict[str, str] = {}
        for eval_set in eval_sets:
            now = eval_set_summary(eval_set)
            before = self._seen.get(eval_set.name)
            message = drift_message(eval_set.name, before, now) if before is not None else None
            if message is not None:
                out[eval_set.name] = message
            self._seen[eval_set.name] = now
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"eval_sets": {k: dict(v) for k, v in self._seen.items()}}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self._seen = {k: dict(v) for k, v in state.get("eval_sets", {}).items()}
