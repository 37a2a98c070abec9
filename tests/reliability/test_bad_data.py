"""Bad data: what a round does with an empty eval set, a set smaller than the world, an empty
prompt, NaN or infinite rewards, a reward function that raises, and a completion far longer than
expected. Each either evaluates with exact counts or fails with a message that names the cause,
and none hangs or kills training (with ``on_error="log"``).

The default GRPO evaluation runs for real (`GRPOModule` with a `TinyPolicy`); only the task's
reward function is replaced, as a user's task would replace it.
"""

from __future__ import annotations

import logging
import math
import re
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch
from callback_helpers import QUIET_WARNINGS, CountingModule, make_trainer, quiet
from ddp_utils import run_ddp

from areal_lightning.app.builders import build_module
from areal_lightning.app.config import ConfigError, load_config
from areal_lightning.callbacks.evaluation_callback import EvaluationCallback
from areal_lightning.eval_round import EvalRoundError, EvalSet, run_round
from areal_lightning.metrics import RewardMetric
from areal_lightning.rl.grpo.config import GRPOConfig
from areal_lightning.rl.grpo.module import GRPOModule
from areal_lightning.rl.policy import TinyPolicy
from areal_lightning.rl.rollout_eval import NON_FINITE_KEY
from areal_lightning.tasks.arithmetic import ArithmeticTask, Sample
from areal_lightning.tracking.history import eval_rows, event_rows, read_history

pytestmark = [pytest.mark.filterwarnings(w) for w in QUIET_WARNINGS]

N_SAMPLES = 3
MAX_LEN = 48
DDP_TIMEOUT_S = 180.0
SEVEN = "7"


def _module(task: ArithmeticTask | None = None, seed: int = 3) -> GRPOModule:
    task = task or ArithmeticTask(seed=seed)
    tok = task.tokenizer
    torch.manual_seed(seed)
    policy = TinyPolicy(
        tok.vocab_size, d_model=32, n_layers=1, n_heads=2, max_len=MAX_LEN, pad_id=tok.pad_id, eos_id=tok.eos_id
    )
    return GRPOModule(policy, task, GRPOConfig(warmup_steps=0), seed=seed)


def _eval_set(samples: list[Sample], max_new_tokens: int = 4, **kwargs: Any) -> EvalSet:
    return EvalSet(
        "probe",
        samples,
        options={"n_samples": N_SAMPLES, "temperature": 1.0, "max_new_tokens": max_new_tokens},
        **kwargs,
    )


def _round(module: GRPOModule, eval_set: EvalSet, rows: int = 0) -> Any:
    (result,) = run_round(module, [eval_set], GRPOModule.evaluate, seed=7, global_step=0, epoch=0, max_table_rows=rows)
    return result


def _always_seven(module: GRPOModule) -> None:
    """The policy's head always prefers the digit 7 and never ends: every completion runs to max_new_tokens."""
    tok = module.task.tokenizer
    with torch.no_grad():
        module.policy.head.weight.zero_()
        module.policy.head.bias.fill_(0.0)
        module.policy.head.bias[tok.encode(SEVEN, bos=False)[0]] = 1e4


# ---- empty eval sets --------------------------------------------------------------------------


@pytest.mark.parametrize("samples", [[], ()])
def test_an_empty_eval_set_is_refused_when_the_callback_is_built(samples: Any) -> None:
    with pytest.raises(ValueError, match=r"`EvalSet\(name='easy'\)` has no samples; give at least one"):
        EvaluationCallback({"easy": samples}, schedule={"freq_steps": 1}, evaluate_fn=lambda m, b, c: {})


def test_samples_without_indexing_are_refused_naming_what_is_accepted() -> None:
    with pytest.raises(
        ValueError,
        match=r"`EvalSet\(samples=...\)` must be a sequence with a length and indexing .*"
        r"got 'generator'",
    ):
        EvalSet("easy", (i for i in range(3)))


def test_an_empty_eval_set_is_refused_when_the_config_loads() -> None:
    with pytest.raises(ConfigError, match=r"eval_sets.easy.size must be a positive integer, got 0"):
        load_config(None, ["eval_sets.easy.size=0"])
    with pytest.raises(ConfigError, match=r"eval_sets is empty; define at least one"):
        load_config(None, [])


# ---- a set smaller than the number of ranks ---------------------------------------------------


def _one_sample_on_two_ranks(rank: int, world_size: int) -> tuple[dict[str, float], int, int]:
    quiet()
    task = ArithmeticTask(seed=5)
    result = _round(_module(task), _eval_set(task.make_samples("tiny", 1, 1), batch_size=1))
    return result.metrics, result.num_prompts, result.num_samples


@pytest.mark.process
def test_a_set_smaller_than_the_world_counts_each_sample_once_and_matches_one_process() -> None:
    task = ArithmeticTask(seed=5)
    alone = _round(_module(task), _eval_set(task.make_samples("tiny", 1, 1), batch_size=1))
    # run_ddp ends every rank's process group when it runs past its timeout: a hang fails here.
    results = run_ddp(_one_sample_on_two_ranks, 2, timeout_s=DDP_TIMEOUT_S)
    for rank, (metrics, num_prompts, num_samples) in enumerate(results):
        assert (num_prompts, num_samples) == (1, N_SAMPLES), f"rank {rank}"
        assert metrics == pytest.approx(alone.metrics, nan_ok=True), f"rank {rank}"


# ---- empty prompts ----------------------------------------------------------------------------


def test_an_empty_prompt_is_evaluated_and_counted_like_any_other() -> None:
    samples = [Sample(0, "", "03"), Sample(1, "1+2=", "03"), Sample(2, "", "05")]
    result = _round(_module(), _eval_set(samples, batch_size=2), rows=3)
    assert (result.num_prompts, result.num_samples) == (3, 3 * N_SAMPLES)
    assert [(r["index"], r["prompt"]) for r in result.table_rows] == [(0, ""), (1, "1+2="), (2, "")]
    assert all(len(r["completion"]) <= 4 for r in result.table_rows)
    assert result.metrics[NON_FINITE_KEY] == 0.0


# ---- NaN and infinite rewards -----------------------------------------------------------------


class _BrokenRewardTask(ArithmeticTask):
    """The reward of a sample depends only on its answer: NaN, +inf, -inf or a finite value below success."""

    BY_ANSWER: ClassVar[dict[str, float]] = {"03": math.nan, "05": math.inf, "07": -math.inf, "08": 0.25, "09": 0.75}

    def reward(self, completion: str, answer: str) -> float:
        return self.BY_ANSWER[answer]


def test_nan_and_infinite_rewards_are_counted_reported_and_never_averaged_in(caplog: pytest.LogCaptureFixture) -> None:
    samples = [
        Sample(i, f"{a}+{b}=", s)
        for i, (a, b, s) in enumerate([(1, 2, "03"), (2, 3, "05"), (3, 4, "07"), (4, 4, "08"), (4, 5, "09")])
    ]
    module = _module(_BrokenRewardTask(seed=3))
    _always_seven(module)  # every completion is a number: the task's reward scores each one
    with caplog.at_level(logging.WARNING, logger="areal_lightning"):
        result = _round(module, _eval_set(samples, batch_size=5))
    finite = [0.25] * N_SAMPLES + [0.75] * N_SAMPLES  # samples 3 and 4
    assert result.metrics[NON_FINITE_KEY] == 3 * N_SAMPLES
    assert result.metrics["reward/mean"] == pytest.approx(sum(finite) / len(finite))
    assert (result.metrics["reward/min"], result.metrics["reward/max"]) == (0.25, 0.75)
    assert result.metrics["reward/std"] == pytest.approx(0.25)
    # +inf is no success: no sample is correct (the finite rewards are below the 0.8 of accuracy).
    assert result.metrics["accuracy"] == 0.0 and result.metrics["pass@1"] == 0.0
    (warning,) = [r.getMessage() for r in caplog.records if "NaN or infinite" in r.getMessage()]
    assert f"{3 * N_SAMPLES} NaN or infinite reward(s) on samples 0, 1, 2" in warning and NON_FINITE_KEY in warning


def _nan_rewards(module: Any, batches: Any, ctx: Any) -> dict[str, Any]:
    reward = ctx.metric("reward", RewardMetric)  # the default nan_strategy: "error"
    for batch in batches:  # a NaN reward from step 4 on (the first round, at step 2, is clean)
        reward.update(torch.tensor([math.nan if s == 2 and ctx.global_step >= 4 else float(s) for s in batch.samples]))
    return {}


def test_a_nan_reward_in_a_users_reward_metric_fails_the_round_naming_the_count(tmp_path: Path) -> None:
    callback = EvaluationCallback(
        {"probe": [0, 1, 2]}, _nan_rewards, schedule={"freq_steps": 2}, rounds={"on_error": "log"}
    )
    trainer = make_trainer(tmp_path, [callback], max_steps=6)
    trainer.fit(CountingModule(epoch_len=8))
    assert trainer.global_step == 6  # training went on
    records = read_history(tmp_path)
    assert [r["step"] for r in eval_rows(records)] == [2]  # no round record with a NaN in it
    errors = event_rows(records, "error")
    assert [e["step"] for e in errors] == [4, 6]
    assert "`RewardMetric.update(rewards=...)` got 1 NaN value(s) out of 3" in errors[0]["message"]


# ---- a reward function that raises ------------------------------------------------------------


class _RaisingRewardTask(ArithmeticTask):
    """Raises on the answers of two-digit operands (three characters), as a buggy verifier would."""

    def reward(self, completion: str, answer: str) -> float:
        if len(answer) == 3:
            raise KeyError(f"no verifier for {answer!r}")
        return super().reward(completion, answer)


@pytest.mark.parametrize("on_error", ["log", "raise"])
def test_a_reward_function_that_raises_fails_the_round_naming_the_function_and_the_sample(
    on_error: str, tmp_path: Path
) -> None:
    cfg = load_config(
        None,
        [
            "eval_sets.easy.size=3",
            "eval_sets.hard.size=3",
            "eval_sets.hard.digits=2",
            "eval_sets.easy.n_samples=2",
            "eval_sets.hard.n_samples=2",
            "evaluator.freq_steps=1",
            f"evaluator.on_error={on_error}",
            "grpo.warmup_steps=0",
            "grpo.group_size=2",
            "grpo.prompts_per_step=2",
            "policy.d_model=32",
            "policy.n_layers=1",
            "policy.n_heads=2",
            f"output_dir={tmp_path}",
        ],
    )
    from areal_lightning.app.builders import build_callback

    module = build_module(cfg)
    module.task = _RaisingRewardTask(seed=cfg.seed)  # training uses one-digit operands: only the round raises
    _always_seven(module)  # numbers only: the arithmetic task hands a completion to its reward only then
    trainer = make_trainer(tmp_path, [build_callback(cfg)], max_steps=2)
    expected = (
        r"the reward of eval set 'hard' failed on sample 0 \(prompt '\d\d\+\d\d='\): _RaisingRewardTask's "
        r"scoring raised KeyError: \"no verifier for '\d{3}'\" in reward \(test_bad_data.py:\d+\) on "
        r"completion '7777' \(answer '\d{3}'\)"
    )
    # The sanity pass: whatever on_error says, its failure stops training before the first step.
    with pytest.raises(EvalRoundError, match=expected):
        trainer.fit(module)
    assert trainer.global_step == 0
    records = read_history(tmp_path)
    assert eval_rows(records) == []  # the sanity pass records no round
    errors = event_rows(records, "error")
    assert [(e["step"], e["dataset"]) for e in errors] == [(0, "hard")]  # the set that failed, alone
    assert re.search(expected, errors[0]["message"]), errors[0]["message"]


# ---- completions far longer than expected -----------------------------------------------------


def test_a_completion_that_never_ends_stops_at_max_new_tokens_and_still_votes() -> None:
    module = _module()
    _always_seven(module)
    long = MAX_LEN - len("1+2=") - 1  # 43 digits: far beyond what an int64 answer id holds
    result = _round(module, _eval_set([Sample(0, "1+2=", "03"), Sample(1, "2+2=", "04")], max_new_tokens=long), rows=2)
    assert [r["completion"] for r in result.table_rows] == [SEVEN * long] * 2
    assert (result.num_prompts, result.num_samples) == (2, 2 * N_SAMPLES)
    assert result.metrics["accuracy"] == 0.0 and result.metrics[f"maj@{N_SAMPLES}"] == 0.0


def test_a_completion_that_cannot_fit_the_policy_is_refused_before_any_forward() -> None:
    module = _module()
    forwards = []
    module.policy.register_forward_hook(lambda *args: forwards.append(1))
    too_long = MAX_LEN  # plus any prompt: beyond the policy's positions
    with pytest.raises(
        EvalRoundError,
        match=rf"eval set 'probe': its longest prompt \(5 tokens\) plus max_new_tokens="
        rf"{too_long} is {too_long + 5} tokens, more than the policy's "
        rf"max_len={MAX_LEN}; lower the eval set's max_new_tokens",
    ):
        _round(module, _eval_set([Sample(0, "1+2=", "03")], max_new_tokens=too_long))
    assert forwards == []
