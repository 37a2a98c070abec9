"""Model graders in a real evaluation round: a tiny random reward model (sequence classification)
and a tiny random causal LM as judge, both built in the test; exact on 1 and 2 gloo ranks."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("transformers")
from ddp_utils import run_ddp
from hf_models import save_tiny_llama, save_tiny_reward_model, write_gsm8k

from areal_lightning.errors import ArgumentError

PROMPTS, SAMPLES = 4, 3


def build(tmp: Path, grader: str) -> tuple[Any, Any]:
    """A GRPOModule whose task is graded by `grader` (``rm``, ``judge`` or ``none``), and its eval set."""
    from areal_lightning.eval_round import EvalSet, SamplingParams
    from areal_lightning.rl.engines.hf.policy import HFPolicy
    from areal_lightning.rl.grpo.module import GRPOModule
    from areal_lightning.rl.model_graders import GradedTask, JudgeGrader, RewardModelGrader
    from areal_lightning.tasks.math import MathTask

    task = MathTask(tmp / "test.jsonl", verifier="numeric")
    graded: Any = task  # "none": the verifier alone
    if grader == "rm":
        graded = GradedTask(task, reward_model=RewardModelGrader(tmp / "rm", batch_size=2))
    elif grader.startswith("judge"):
        judge = HFPolicy.from_pretrained(tmp / grader, attn_implementation="eager")
        # A random model never writes "VERDICT: ...": its digits are the verdict (3 means correct).
        graded = GradedTask(task, judge=JudgeGrader(judge, verdict_pattern=r"(\d)", correct_word="3", max_new_tokens=3))
    policy = HFPolicy.from_pretrained(tmp / "policy", attn_implementation="eager")
    module = GRPOModule(policy, graded)
    sampling = SamplingParams(n_samples=SAMPLES, temperature=1.0, max_new_tokens=4)
    eval_set = EvalSet("gsm8k", task.samples(), batch_size=2, sampling=sampling, key_fn=lambda s: s.key)
    return module, eval_set


def evaluate(rank: int, world_size: int, tmp: Path, grader: str) -> dict[str, float]:
    from areal_lightning.eval_round import run_round

    torch.set_num_threads(1)
    module, eval_set = build(tmp, grader)
    (result,) = run_round(module, [eval_set], lambda m, b, c: m.evaluate(b, c), seed=1, global_step=0, epoch=0)
    return dict(result.metrics)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("graders")
    save_tiny_llama(tmp / "policy", digit_bias=2.0)
    save_tiny_llama(tmp / "judge", seed=3, digit_bias=1.0)  # replies without a digit: unparsed
    save_tiny_llama(tmp / "judge_digits", seed=3, digit_bias=2.0)  # replies with digits: parsed
    save_tiny_reward_model(tmp / "rm")
    write_gsm8k(tmp / "test.jsonl", PROMPTS)
    return tmp


@pytest.mark.ddp
@pytest.mark.slow
def test_a_reward_model_gives_the_reward_and_the_verifier_the_correctness(models: Path) -> None:
    one = evaluate(0, 1, models, "rm")
    two = run_ddp(evaluate, 2, models, "rm")
    assert two[0] == two[1] and set(two[0]) == set(one)
    for name, value in one.items():  # bit for bit on 1 and 2 ranks
        assert value == two[0][name] or (math.isnan(value) and math.isnan(two[0][name])), name
    extremes = {one["reward/min"], one["reward/max"]}
    assert not extremes & {0.0, 1.0} and one["reward/std"] > 0  # the model's continuous scores, not a verifier's 0/1
    plain = evaluate(0, 1, models, "none")  # the same completions scored by the verifier alone
    assert one["accuracy"] == plain["accuracy"] and one["pass@1"] == plain["pass@1"]


@pytest.mark.slow
def test_a_judge_decides_correctness_and_its_unparsed_share_is_recorded(models: Path) -> None:
    n = PROMPTS * SAMPLES
    shares = []
    for judge in ("judge", "judge_digits"):
        metrics = evaluate(0, 1, models, judge)
        counts = {w: metrics[f"judge/{w}"] for w in ("correct", "incorrect", "unparsed")}
        assert sum(counts.values()) == n
        assert metrics["judge/unparsed_share"] == counts["unparsed"] / n
        assert metrics["accuracy"] == counts["correct"] / n  # correctness is the judge's verdict
        assert metrics["scoring/parse_failures"] >= counts["unparsed"]  # the verifier's own parse failures too
        shares.append(metrics["judge/unparsed_share"])
    assert shares == [1.0, 0.0]  # these random judges: one never writes a verdict, one always does


def test_the_graders_weights_key_the_result_cache(models: Path) -> None:
    from areal_lightning.eval_round.cache import weights_digest

    module, _ = build(models, "rm")
    before = weights_digest(module)
    with torch.no_grad():
        next(module.task.reward_model.parameters()).add_(1.0)
    assert weights_digest(module) != before


def test_grader_arguments_are_checked(models: Path) -> None:
    from areal_lightning.rl.engines.hf.policy import HFPolicy
    from areal_lightning.rl.model_graders import GradedTask, JudgeGrader, RewardModelGrader

    with pytest.raises(ArgumentError, match=r"`JudgeGrader\(template=...\)` must be a string containing \{prompt\}"):
        JudgeGrader(HFPolicy.from_pretrained(models / "judge"), template="Grade: {completion}")
    with pytest.raises(ArgumentError, match=r"`JudgeGrader\(verdict_pattern=...\)` must be a regular expression"):
        JudgeGrader(HFPolicy.from_pretrained(models / "judge"), verdict_pattern="VERDICT")
    with pytest.raises(ArgumentError, match=r"`RewardModelGrader\(batch_size=...\)` must be a positive integer"):
        RewardModelGrader(models / "rm", batch_size=0)
    with pytest.raises(ArgumentError, match="`GradedTask"):
        GradedTask(object())


def test_a_reward_model_path_must_be_a_local_classification_model(models: Path, tmp_path: Path) -> None:
    import json

    from areal_lightning.rl.model_graders import RewardModelGrader

    never = r"no such local directory; graders never download models"
    with pytest.raises(ArgumentError, match=r"`RewardModelGrader\(path='.*nowhere'\)`: " + never):
        RewardModelGrader(tmp_path / "nowhere")
    with pytest.raises(ArgumentError, match=r"`RewardModelGrader\(path='OpenAssistant/reward-model'\)`: " + never):
        RewardModelGrader("OpenAssistant/reward-model")  # a hub name: refused here, not looked up
    (tmp_path / "empty").mkdir()
    with pytest.raises(ArgumentError, match=r"the directory has no config.json, so it holds no saved model"):
        RewardModelGrader(tmp_path / "empty")
    head = r"head \(`...ForSequenceClassification`\); its config.json names \['LlamaForCausalLM'\]"
    with pytest.raises(ArgumentError, match=head):
        RewardModelGrader(models / "policy")  # a plain language model
    # A causal LM's weights under a config that claims a classification head: the head would be random.
    relabelled = tmp_path / "relabelled"
    save_tiny_llama(relabelled)
    config = json.loads((relabelled / "config.json").read_text())
    (relabelled / "config.json").write_text(json.dumps({**config, "architectures": ["LlamaForSequenceClassification"]}))
    with pytest.raises(ArgumentError, match=r"its weights lack \['score.weight'\], which would be random"):
        RewardModelGrader(relabelled)


def test_a_judge_is_a_policy_or_the_path_of_a_local_model(models: Path, tmp_path: Path) -> None:
    from areal_lightning.rl.engines.hf.policy import HFPolicy
    from areal_lightning.rl.model_graders import JudgeGrader

    judge = JudgeGrader(str(models / "judge"))  # loaded as an HFPolicy, its weights frozen
    assert isinstance(judge.policy, HFPolicy) and not any(p.requires_grad for p in judge.policy.parameters())
    assert judge.judge(["Q"], ["8"], ["8"]) == [None]  # this random judge writes no verdict
    with pytest.raises(ArgumentError, match=r"`JudgeGrader\(policy='.*nowhere'\)`: no such local directory"):
        JudgeGrader(tmp_path / "nowhere")
    with pytest.raises(ArgumentError, match=r"`JudgeGrader\(policy=...\)` must be an HFPolicy or the path of a local"):
        JudgeGrader(42)  # type: ignore[arg-type]


def test_the_gold_check_grades_with_the_grader_that_decides_correctness(models: Path) -> None:
    from areal_lightning.callbacks.integrity_checks import grade_references

    plain, _ = build(models, "none")
    judged, _ = build(models, "judge")  # a judge that never writes a verdict: nothing is correct
    samples = plain.task.samples()
    by_verifier = grade_references(samples, plain.integrity_reference, plain.integrity_grade, plain.integrity_prompt)
    by_judge = grade_references(samples, judged.integrity_reference, judged.integrity_grade, judged.integrity_prompt)
    assert by_verifier.graded == by_judge.graded == PROMPTS
    assert by_verifier.failed == [] and by_judge.failed == list(range(PROMPTS))
