"""The paired change's state stays on the metric's device whatever device the reference rounds'
outcomes come from. The `meta` device stands in for a GPU: a tensor moved to the wrong device
would land on the CPU."""

from __future__ import annotations

import pytest
import torch

from areal_lightning.metrics.paired import PairedChange

META = torch.device("meta")


@pytest.mark.parametrize("reference_on", ["meta", "cpu"])
def test_updates_keep_the_paired_sums_on_the_metrics_device(reference_on: str) -> None:
    metric = PairedChange().to(META)
    assert metric.sums.device == META
    for _ in range(2):
        metric.update(torch.ones(4, device=META), torch.zeros(4, device=reference_on))
        assert (metric.sums.device, metric.sums.dtype) == (META, torch.float64)
