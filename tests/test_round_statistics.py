"""What a round of the default evaluation reads off the completions, on 1, 2 and 3 gloo processes:
completion statistics and every k, bit for bit the same numbers whatever the number of ranks."""

from __future__ import annotations

import math
from typing import Any

import pytest
from ddp_utils import run_ddp

from areal_lightning.rl.rollout_eval import metric_names

OVERRIDES = [
    "seed=3",
    "grpo.max_new_tokens=3",  # short enough that some completions are truncated
    "eval_sets.easy.size=7",
    "eval_sets.easy.batch_size=2",  # 4 batches: dealt unevenly to 2 and 3 ranks
    "eval_sets.easy.n_samples=4",
    "eval_sets.easy.ks=[1,2,4]",
    "eval_sets.easy.stop=['9']",  # the tiny policy does not stop at it: its texts do
    "eval_sets.hard.size=5",
    "eval_sets.hard.n_samples=3",
    "eval_sets.hard.batch_size=4",
    "eval_sets.hard.temperature=0",
]


def _first_digit_task() -> Any:
    """The arithmetic task graded by a rule an untrained policy often meets (its first character is
    a digit below 4), so that correctness, and with it every k, varies between prompts."""
    from areal_lightning.scoring import Score
    from areal_lightning.tasks.arithmetic import NO_ANSWER_ID, ArithmeticTask

    class FirstDigitTask(ArithmeticTask):
        def reward(self, completion: str, answer: str) -> float:
            return 1.0 if completion[:1] in ("0", "1", "2", "3") else 0.0

        def score_many(self, completions: list[str], answers: list[str]) -> list[Score]:
            return [Score(self.reward(c, a)) for c, a in zip(completions, answers, strict=True)]

        def answer_id(self, completion: str) -> int:
            return int(completion[0]) if completion[:1].isdigit() else NO_ANSWER_ID

    return FirstDigitTask()


def _round(rank: int, world_size: int) -> dict[str, dict[str, float]]:
    from areal_lightning.app.builders import build_eval_sets, build_module
    from areal_lightning.app.config import load_config
    from areal_lightning.eval_round import run_round
    from areal_lightning.rl.rollout_eval import rollout_evaluate

    cfg = load_config(None, OVERRIDES)
    module = build_module(cfg)  # the same seeded weights on every rank
    module.task = _first_digit_task()
    results = run_round(
        module, build_eval_sets(cfg, module.task), rollout_evaluate, seed=cfg.seed, global_step=0, epoch=0
    )
    return {r.dataset: r.metrics for r in results}


@pytest.fixture(scope="module")
def one_process() -> dict[str, dict[str, float]]:
    return _round(0, 1)


def _same(a: dict[str, float], b: dict[str, float]) -> bool:
    return a.keys() == b.keys() and all(a[k] == b[k] or (math.isnan(a[k]) and math.isnan(b[k])) for k in a)


def test_a_round_reports_completions_and_every_k(one_process: dict[str, dict[str, Any]]) -> None:
    easy, hard = one_process["easy"], one_process["hard"]
    assert set(easy) >= set(metric_names(4, ks=[1, 2, 4])) and set(hard) >= set(metric_names(3))
    assert 0 < easy["completion/truncated"] < 1 and 0 < easy["completion/stopped"] < 1  # both kinds of end occur
    assert hard["completion/stopped"] == 0  # no stop strings
    assert easy["completion/length/p50"] <= easy["completion/length/p95"] <= easy["completion/length/max"] <= 3
    assert easy["completion/logprob"] < 0 < easy["completion/entropy"]
    assert 0 <= easy["completion/no_answer"] <= 1
    assert 0 < easy["pass@1"] < easy["pass@2"] < easy["pass@4"] < 1  # prompts differ: every k is tested
    assert 0 < easy["pass^4"] < easy["pass^2"] < easy["pass^1"] == easy["pass@1"]
    assert all(easy[f"{m}{k}/stderr"] > 0 for m in ("pass@", "pass^", "maj@") for k in (1, 2, 4))


@pytest.mark.ddp
@pytest.mark.parametrize("world_size", [2, 3])
def test_the_same_numbers_on_more_ranks(world_size: int, one_process: dict[str, dict[str, float]]) -> None:
    per_rank = run_ddp(_round, world_size, timeout_s=240)
    for rank, got in enumerate(per_rank):
        for dataset, metrics in one_process.items():
            assert _same(got[dataset], metrics), (
                rank,
                dataset,
                {k: (v, got[dataset].get(k)) for k, v in metrics.items()},
            )


# ----------------------------------------------------------------------------- training rollouts
ROLLOUTS, MAX_NEW = 11, 5


def _rollouts() -> tuple[Any, ...]:
    """A step's rollouts of every rank together: tokens (EOS = 2), stop flags, answer ids, scores."""
    import torch

    g = torch.Generator().manual_seed(4)
    tokens = torch.randint(3, 9, (ROLLOUTS, MAX_NEW), generator=g)
    ends = torch.randint(0, MAX_NEW + 3, (ROLLOUTS,), generator=g)  # >= MAX_NEW: no EOS, truncated
    for row, end in enumerate(ends.tolist()):
        if end < MAX_NEW:
            tokens[row, end], tokens[row, end + 1 :] = 2, 0
    stopped = torch.rand(ROLLOUTS, generator=g) < 0.2
    answers = torch.randint(-1, 3, (ROLLOUTS,), generator=g).tolist()
    logp = -torch.rand(ROLLOUTS, MAX_NEW, generator=g, dtype=torch.float64)
    entropy = torch.rand(ROLLOUTS, MAX_NEW, generator=g, dtype=torch.float64)
    return tokens, stopped, answers, logp, entropy


def _train_stats(rank: int, world_size: int) -> dict[str, float]:
    import torch

    from areal_lightning.rl.completion_stats import completion_metrics, step_completion_stats
    from areal_lightning.rl.engines.generation import Generation
    from areal_lightning.rl.policy import completion_mask

    tokens, stopped, answers, logp, entropy = _rollouts()
    mine = [i for i in range(ROLLOUTS) if i % world_size == rank]  # rank 2 of 3 gets fewer rows
    metrics = {name: make() for name, make in completion_metrics(MAX_NEW).items()}
    out = {}
    for _ in range(2):  # a second step: the first one's counts are gone (reset), the sync runs again
        rows = torch.tensor(mine)
        mask = completion_mask(tokens[rows], 2)
        values = step_completion_stats(
            metrics,
            Generation(tokens[rows], stopped[rows]),
            2,
            [answers[i] for i in mine],
            (logp[rows], entropy[rows], mask),
        )
        out = {name: value.item() for name, value in values.items()}
    return out


@pytest.mark.ddp
def test_training_statistics_are_the_steps_over_every_rank() -> None:
    alone = _train_stats(0, 1)
    assert set(alone) == {f"train/{name}" for name in metric_names(1) if name.startswith("completion/")}
    assert 0 < alone["train/completion/truncated"] < 1
    for world_size in (2, 3):
        for rank, got in enumerate(run_ddp(_train_stats, world_size, timeout_s=120)):
            assert _same(got, alone), (world_size, rank, got, alone)


def test_token_scores_can_be_switched_off_per_eval_set() -> None:
    from areal_lightning.app.builders import build_eval_sets, build_module
    from areal_lightning.app.config import load_config
    from areal_lightning.eval_round import run_round
    from areal_lightning.rl.rollout_eval import rollout_evaluate

    cfg = load_config(None, ["eval_sets.easy.size=4", "eval_sets.hard.size=4", "eval_sets.hard.token_scores=false"])
    module = build_module(cfg)
    easy, hard = run_round(module, build_eval_sets(cfg, module.task), rollout_evaluate, seed=0, global_step=0, epoch=0)
    assert math.isfinite(easy.metrics["completion/entropy"]) and math.isfinite(easy.metrics["completion/logprob"])
    assert math.isnan(hard.metrics["completion/entropy"]) and math.isnan(hard.metrics["completion/logprob"])
    assert math.isfinite(hard.metrics["completion/length/mean"])
