"""The round works however `evaluate_fn` walks its batches, and its progress display never changes
what it computes.

Every way below of going through the batches (plain, wrapped in tqdm or Lightning's Tqdm, copied
into a list first, peeked at before creating the metrics, metrics created inside the loop) must
give the same metrics as the plain loop. A progress display that raises is switched off with a
warning; the round's result does not change.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest
import torch
from lightning.pytorch.callbacks.progress.tqdm_progress import Tqdm
from torch import nn
from tqdm import tqdm
from tqdm.auto import tqdm as auto_tqdm

from areal_lightning.eval_round import EvalSet, run_round
from areal_lightning.metrics import RewardMetric

SAMPLES = [float(i % 7) for i in range(50)]
BATCH_SIZE = 8  # seven batches


def _score(reward: Any, batch: Any) -> None:
    reward.update(torch.tensor(batch.samples, dtype=torch.float64))


def plain(module: Any, batches: Any, ctx: Any) -> dict[str, Any]:
    reward = ctx.metric("reward", RewardMetric)
    for batch in batches:
        _score(reward, batch)
    return {}


def _wrapped_in(wrapper: Callable[[Any], Any]) -> Callable[..., dict[str, Any]]:
    def evaluate(module: Any, batches: Any, ctx: Any) -> dict[str, Any]:
        shown = wrapper(batches)  # a wrapper built before the metrics, as a user would write it
        reward = ctx.metric("reward", RewardMetric)
        for batch in shown:
            _score(reward, batch)
        return {}

    return evaluate


def peeked(module: Any, batches: Any, ctx: Any) -> dict[str, Any]:
    it = iter(batches)
    first = next(it)  # look at the first batch before creating the metric
    reward = ctx.metric("reward", RewardMetric)
    _score(reward, first)
    for batch in it:
        _score(reward, batch)
    return {}


def in_the_loop(module: Any, batches: Any, ctx: Any) -> dict[str, Any]:
    for batch in batches:
        _score(ctx.metric("reward", RewardMetric), batch)
    return {}


def indexed(module: Any, batches: Any, ctx: Any) -> dict[str, Any]:
    reward = ctx.metric("reward", RewardMetric)
    for i in range(len(batches)):
        _score(reward, batches[i])
    return {}


WAYS: dict[str, Callable[..., dict[str, Any]]] = {
    "tqdm.auto": _wrapped_in(lambda b: auto_tqdm(b, desc="mine")),
    "tqdm": _wrapped_in(lambda b: tqdm(b, desc="mine")),
    "lightning Tqdm": _wrapped_in(lambda b: Tqdm(b, desc="mine")),
    "a list first": _wrapped_in(list),
    "a generator": _wrapped_in(lambda b: (x for x in b)),
    "peeked": peeked,
    "metric in the loop": in_the_loop,
    "indexed": indexed,
}


def _round(evaluate_fn: Callable[..., Any], progress: Any = None) -> dict[str, float]:
    eval_set = EvalSet("easy", SAMPLES, batch_size=BATCH_SIZE)
    [result] = run_round(nn.Identity(), [eval_set], evaluate_fn, seed=0, global_step=0, epoch=0, progress=progress)
    assert result.num_prompts == len(SAMPLES)
    return result.metrics


@pytest.mark.parametrize("way", sorted(WAYS))
def test_every_way_of_walking_the_batches_gives_the_plain_loops_metrics(way: str) -> None:
    expected = _round(plain)
    assert expected["reward/mean"] == pytest.approx(sum(SAMPLES) / len(SAMPLES))
    assert _round(WAYS[way]) == expected


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def start(self, dataset: str, total: int) -> None:
        self.calls.append(("start", (dataset, total)))

    def advance(self) -> None:
        self.calls.append(("advance", None))

    def close(self) -> None:
        self.calls.append(("close", None))


@pytest.mark.parametrize("way", ["plain", "tqdm.auto"])
def test_progress_sees_each_batch_finish_once(way: str) -> None:
    recorder = Recorder()
    _round(plain if way == "plain" else WAYS[way], recorder)
    batches = -(-len(SAMPLES) // BATCH_SIZE)
    assert recorder.calls == [("start", ("easy", batches)), *[("advance", None)] * batches, ("close", None)]


class Broken(Recorder):
    def advance(self) -> None:
        raise OSError("the terminal went away")


def test_a_progress_display_that_raises_is_switched_off_and_the_round_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    broken = Broken()
    with caplog.at_level(logging.WARNING):
        assert _round(plain, broken) == _round(plain)
    assert "evaluation progress display switched off: OSError: the terminal went away" in caplog.text
    assert broken.calls == [("start", ("easy", 7))]  # nothing called after the failure, close included


def test_a_failing_evaluate_fn_still_closes_the_progress_display() -> None:
    recorder = Recorder()

    def fails(module: Any, batches: Any, ctx: Any) -> dict[str, Any]:
        for _ in batches:
            raise ValueError("broken")
        return {}

    with pytest.raises(Exception, match="broken"):
        _round(fails, recorder)
    assert recorder.calls[-1] == ("close", None)
