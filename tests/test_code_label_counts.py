"""`LabelCountMetric` (the per-round ``code/<status>`` counts): against a plain count, on one
process and on 2 gloo ranks with uneven updates (a rank without any included)."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from ddp_utils import run_ddp

from areal_lightning.metrics import LabelCountMetric
from areal_lightning.scoring import Score, ScoreLabels

LABELS = ScoreLabels("code", ("passed", "failed", "timeout"), shares=True)


def scores(seed: int, n: int) -> list[Score]:
    rng = random.Random(seed)
    return [Score(1.0, labels=(f"code/{rng.choice(LABELS.labels)}", "other/x")) for _ in range(n)]


def reference(all_scores: list[Score]) -> dict[str, float]:
    counts = Counter(label.split("/")[1] for s in all_scores for label in s.labels if label.startswith("code/"))
    out = {label: float(counts[label]) for label in LABELS.labels}
    return out | {f"{label}_share": counts[label] / len(all_scores) for label in LABELS.labels}


UPDATES = {0: [(1, 7), (2, 0)], 1: [(3, 5)]}  # per rank: (seed, samples) of each update
IDLE = {0: [(1, 7), (3, 5)], 1: []}  # rank 1 never updates: it joins the sync with zeros


def _worker(rank: int, world_size: int) -> list[dict[str, float]]:
    out = []
    for updates in (UPDATES, IDLE):
        metric = LabelCountMetric(LABELS)
        for seed, n in updates[rank]:
            metric.update(scores(seed, n))
        out.append({k: v.item() for k, v in metric.compute().items()})
    return out


def test_counts_and_shares_equal_a_plain_count() -> None:
    metric = LabelCountMetric(LABELS)
    batches = [scores(seed, n) for seed, n in UPDATES[0] + UPDATES[1]]
    for batch in batches:
        metric.update(batch)
    assert {k: v.item() for k, v in metric.compute().items()} == reference([s for b in batches for s in b])


def test_an_undeclared_label_is_refused() -> None:
    with pytest.raises(ValueError, match=r"label 'code/crashed', which is not one of \['code/failed', 'code/passed'"):
        LabelCountMetric(LABELS).update([Score(0.0, labels=("code/crashed",))])
    with pytest.raises(ValueError, match="needs a prefix and distinct labels"):
        ScoreLabels("code", ("passed", "passed"))


@pytest.mark.ddp
def test_two_ranks_give_the_single_process_counts() -> None:
    results = run_ddp(_worker, 2)
    expected = [reference([s for seed, n in u[0] + u[1] for s in scores(seed, n)]) for u in (UPDATES, IDLE)]
    assert results == [expected, expected]
