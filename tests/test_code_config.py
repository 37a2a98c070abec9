"""Config of the code task and code eval sets: loads and builds, and each mistake is a ConfigError
naming the key, raised at load."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hf_models import save_tiny_llama

from areal_lightning.app.builders import build_eval_sets, build_task
from areal_lightning.app.config import ConfigError, load_config


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    pytest.importorskip("transformers")
    tmp = tmp_path_factory.mktemp("codecfg")
    mbpp = tmp / "mbpp.jsonl"
    mbpp.write_text(json.dumps({"text": "Add two numbers.", "test_list": ["assert add(1, 2) == 3"]}) + "\n")
    bad = tmp / "bad.jsonl"
    bad.write_text(json.dumps({"text": "Add two numbers."}) + "\n")
    return {"model": save_tiny_llama(tmp / "model"), "mbpp": mbpp, "bad": bad}


def _code(files: dict[str, Path], *extra: str) -> list[str]:
    return [
        "policy.kind=hf",
        f"policy.path={files['model']}",
        "task.name=code",
        f"task.path={files['mbpp']}",
        "eval_sets.humaneval.path=humaneval",
        "eval_sets.humaneval.size=3",
        *extra,
    ]


def test_a_code_config_builds_its_task_and_eval_sets(files: dict[str, Path]) -> None:
    cfg = load_config(None, _code(files, f"eval_sets.mine.path={files['mbpp']}", "task.sandbox_wall_s=2.5"))
    task = build_task(cfg)
    assert type(task).__name__ == "CodeTask" and task.sandbox.limits.wall_s == 2.5 and task.sandbox.limits.cpu_s == 3
    sets = {s.name: s for s in build_eval_sets(cfg)}
    assert [s.task_id for s in sets["humaneval"].samples] == ["HumanEval/0", "HumanEval/1", "HumanEval/2"]
    assert len(sets["mine"].samples) == 1


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["policy.kind=tiny", "policy.path=null"], r"task.name: code needs policy.kind: hf"),
        (["task.path=null"], r"task.path is required for task.name: code; give humaneval or a local .jsonl file"),
        (["task.path=nowhere.jsonl"], r"task.path 'nowhere.jsonl' does not exist; give humaneval or a local .jsonl"),
        (["eval_sets.humaneval.path=BAD"], r"eval_sets.humaneval.path: row 1 of .*bad.jsonl lacks tests"),
        (
            ["eval_sets.humaneval.path=null", "eval_sets.humaneval.digits=1"],
            r"eval_sets.humaneval has no path \(an arithmetic set\), but task.name is code",
        ),
        (["task.sandbox_workers=0"], r"task.sandbox_workers must be a positive integer, got 0"),
        (["evaluator.metric_thresholds={code/pased: 3}"], r"Did you mean `code/passed`\?"),
    ],
)
def test_mistakes_are_refused_naming_the_key(files: dict[str, Path], extra: list[str], message: str) -> None:
    extra = [e.replace("BAD", str(files["bad"])) for e in extra]
    with pytest.raises(ConfigError, match=message):
        load_config(None, _code(files, *extra))


def test_a_threshold_on_a_code_status_is_accepted(files: dict[str, Path]) -> None:
    cfg = load_config(None, _code(files, "evaluator.metric_thresholds={code/timeout: 5}"))
    assert dict(cfg.evaluator.decisions.metric_thresholds) == {"code/timeout": 5}
