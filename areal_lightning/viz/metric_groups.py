"""A group of metrics in one figure: ``plot --metric accuracy/bucket`` draws every
``accuracy/bucket/<b>`` (the prompt story's difficulty buckets), a line per eval set and member.

A name that is a metric of the history is drawn as that metric alone; a name that is not, but
prefixes metrics (``<name>/<member>``, with no further ``/``), is drawn as their group.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from areal_lightning.tracking.history import eval_rows


def group_members(records: Sequence[Mapping[str, Any]], prefix: str) -> list[str]:
    """The members of group `prefix` in eval records: ``<prefix>/<member>`` names (one level, their
    ``/ci_*`` bounds left out) with a value somewhere (an empty bucket is null throughout), in first-seen order.

    Example:
        >>> metrics = {"accuracy/bucket/hard": 0.1, "accuracy/bucket/easy": 0.9}
        >>> recs = [{"step": 0, "dataset": "easy", "metrics": metrics}]
        >>> group_members(recs, "accuracy/bucket")
        ['hard', 'easy']
    """
    members: dict[str, None] = {}
    head = f"{prefix}/"
    for row in eval_rows(records):
        for name, value in row.get("metrics", {}).items():
            rest = name[len(head) :] if name.startswith(head) else ""
            if rest and "/" not in rest and value is not None:  # a member without a value has no line
                members.setdefault(rest, None)
    return list(members)


def group_records(records: Sequence[Mapping[str, Any]], prefix: str) -> list[dict[str, Any]]:
    """`records` recast so that each member of group `prefix` is an eval set of its own, named
    ``<set>: <member>``, holding the member's value under `prefix` (its interval too, where it has one):
    the single-metric drawing then draws the group.

    Example:
        >>> recs = [{"step": 0, "dataset": "easy", "metrics": {"accuracy/bucket/hard": 0.1}}]
        >>> group_records(recs, "accuracy/bucket")
        [{'step': 0, 'dataset': 'easy: hard', 'metrics': {'accuracy/bucket': 0.1}}]
    """
    out = []
    members = group_members(records, prefix)
    for row in eval_rows(records):
        metrics = row.get("metrics", {})
        for member in members:
            name = f"{prefix}/{member}"
            if name not in metrics:
                continue
            values = {prefix: metrics[name]}
            values.update(
                {prefix + bound: metrics[name + bound] for bound in ("/ci_low", "/ci_high") if name + bound in metrics}
            )
            out.append({**row, "dataset": f"{row.get('dataset')}: {member}", "metrics": values})
    return out
