"""The paired change is reduced on the device it is asked for (the process group's: NCCL gathers
only GPU tensors), whatever device the outcomes come from. The `meta` device stands in for a GPU:
a tensor or metric made without the device asked for would land on the CPU."""

from __future__ import annotations

import pytest
import torch

from areal_lightning.metrics.paired import PairedChange, PairedRounds

META = torch.device("meta")


@pytest.mark.parametrize("reference_on", ["meta", "cpu"])
def test_updates_keep_the_paired_sums_on_the_metrics_device(reference_on: str) -> None:
    metric = PairedChange().to(META)
    assert metric.sums.device == META
    for _ in range(2):
        metric.update(torch.ones(4, device=META), torch.zeros(4, device=reference_on))
        assert (metric.sums.device, metric.sums.dtype) == (META, torch.float64)


def test_two_rounds_are_paired_in_a_metric_on_the_device_asked_for() -> None:
    metric = PairedRounds()._paired({0: 1.0, 1: 0.5, 2: 0.0}, {0: 0.0, 1: 0.5}, META)
    assert (metric.sums.device, metric.sums.dtype) == (META, torch.float64)


@pytest.mark.parametrize("kept", ["previous", "best"])
def test_each_change_of_a_round_is_reduced_on_the_device_asked_for(kept: str) -> None:
    """A change reduced on `meta` cannot be read (it holds no data): `update` fails there, where a
    reduction that ran on the CPU instead would return numbers. A state holding only the previous
    (or only the best) round makes `update` reduce that one change."""
    pairs = PairedRounds()
    pairs.update("easy", {"acc": {0: 1.0, 1: 0.0}}, ["acc"], {"acc": 0.5})
    state = {kept: pairs.state_dict()[kept]}
    pairs.load_state_dict(state)
    with pytest.raises(RuntimeError, match="meta tensors"):
        pairs.update("easy", {"acc": {0: 0.0, 1: 0.0}}, ["acc"], {"acc": 0.0}, device=META)
    pairs.load_state_dict(state)
    key = "acc/delta" if kept == "previous" else "acc/delta_best"
    assert pairs.update("easy", {"acc": {0: 0.0, 1: 0.0}}, ["acc"], {"acc": 0.0}) == {
        key: -0.5,
        f"{key}_ci_low": pytest.approx(-6.853102),
        f"{key}_ci_high": pytest.approx(5.853102),
    }
