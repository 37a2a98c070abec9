"""An exact-sum state stays on its device: updates from values on another device, squares and
merges all return a state on the state's device. The `meta` device stands in for a GPU here: a
tensor made without the state's device would land on the CPU."""

from __future__ import annotations

import pytest
import torch

from areal_lightning.metrics.exact import SUM_SIZE, add_squares, add_values, merge_sums, new_sum

META = torch.device("meta")


def test_a_new_sum_is_made_on_the_device_asked_for() -> None:
    state = new_sum(META)
    assert (state.device, state.dtype, state.shape) == (META, torch.float64, (SUM_SIZE,))
    assert new_sum().device == torch.device("cpu")


@pytest.mark.parametrize("add", [add_values, add_squares])
@pytest.mark.parametrize("values_on", ["meta", "cpu"])
def test_an_update_keeps_the_state_on_its_device(add, values_on: str) -> None:
    state = add(new_sum(META), torch.tensor([1.5, -2.0, float("nan")], device=values_on))
    state = add(state, torch.ones(3, 2, device=values_on))
    assert (state.device, state.dtype, state.shape) == (META, torch.float64, (SUM_SIZE,))


def test_merging_stacked_states_keeps_their_device() -> None:
    merged = merge_sums(torch.stack([new_sum(META), new_sum(META)]))
    assert (merged.device, merged.dtype, merged.shape) == (META, torch.float64, (SUM_SIZE,))
