"""Config of a Hugging Face policy, the math task and file eval sets: each mistake is a ConfigError
naming the key, raised at load, before any model or Trainer is built."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hf_models import save_tiny_llama, write_gsm8k

from areal_lightning.app.builders import build_eval_sets
from areal_lightning.app.config import ConfigError, load_config


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    pytest.importorskip("transformers")
    tmp = tmp_path_factory.mktemp("hfcfg")
    return {
        "model": save_tiny_llama(tmp / "model"),
        "train": write_gsm8k(tmp / "train.jsonl", 4),
        "test": write_gsm8k(tmp / "test.jsonl", 5, offset=4),
        "tmp": tmp,
    }


def _math(files: dict[str, Path], *extra: str) -> list[str]:
    return [
        "policy.kind=hf",
        f"policy.path={files['model']}",
        "task.name=math",
        f"task.path={files['train']}",
        f"eval_sets.gsm8k.path={files['test']}",
        *extra,
    ]


def test_a_math_config_loads_and_builds_its_file_eval_sets(files) -> None:
    cfg = load_config(None, _math(files, "eval_sets.gsm8k.size=3", "eval_sets.gsm8k.stratum_field=level"))
    (eval_set,) = build_eval_sets(cfg)
    assert eval_set.name == "gsm8k" and len(eval_set.samples) == 3  # the first `size` rows
    first = eval_set.samples[0]
    assert first.prompt.startswith("Question: Tom has 2 apples and buys 1 more") and first.answer == "3"
    assert [s.stratum for s in eval_set.samples] == ["L0", "L1", "L0"]
    assert len(build_eval_sets(load_config(None, _math(files)))[0].samples) == 5  # size null: every row


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        (["policy.kind=hf"], r"policy.path is required for policy.kind: hf"),
        (
            ["policy.kind=hf", "policy.path=Qwen/Qwen2.5-0.5B"],
            r"policy.path 'Qwen/Qwen2.5-0.5B' is not a local directory",
        ),
        (["policy.kind=hf", "policy.path=."], r"policy.path '.' has no config.json"),
        (["policy.dtype=float8"], r"policy.dtype must be one of float32, bfloat16, float16, auto; got 'float8'"),
        (["task.name=math"], r"task.path is required for task.name: math"),
        (["task.name=math", "task.path=nowhere.jsonl"], r"task.path 'nowhere.jsonl' does not exist"),
        (["eval_sets.easy.path=nowhere.jsonl"], r"eval_sets.easy.path 'nowhere.jsonl' does not exist"),
    ],
)
def test_each_missing_model_or_file_names_its_key(overrides: list[str], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        load_config(None, ["eval_sets.easy.size=4", *overrides])


def test_a_missing_field_names_its_key_and_the_fields_present(files) -> None:
    with pytest.raises(
        ConfigError,
        match=r"eval_sets.gsm8k.question_field 'problem' is not a field of row 1 of .*"
        r"test.jsonl; fields present: answer, level, question",
    ):
        load_config(None, _math(files, "eval_sets.gsm8k.question_field=problem"))
    with pytest.raises(ConfigError, match=r"task.answer_field 'solution' is not a field"):
        load_config(None, _math(files, "task.answer_field=solution"))
    with pytest.raises(ConfigError, match=r"eval_sets.gsm8k.stratum_field 'level2' is not a field"):
        load_config(None, _math(files, "eval_sets.gsm8k.stratum_field=level2"))


def test_a_file_without_answers_of_the_format_names_the_row(files) -> None:
    with pytest.raises(ConfigError, match=r"eval_sets.gsm8k.answer_format boxed: row 1 of .* has no such answer"):
        load_config(None, _math(files, "eval_sets.gsm8k.answer_format=boxed"))


def test_kinds_must_agree(files) -> None:
    with pytest.raises(ConfigError, match=r"task.name: math needs policy.kind: hf"):
        load_config(None, [f"task.path={files['train']}", "task.name=math", f"eval_sets.gsm8k.path={files['test']}"])
    with pytest.raises(ConfigError, match=r"eval_sets.easy has no path \(an arithmetic set\), but task.name is math"):
        load_config(None, _math(files, "eval_sets.easy.digits=1"))
    with pytest.raises(ConfigError, match=r"eval_sets.gsm8k has path .* \(a file set\), but task.name is arithmetic"):
        load_config(None, [f"eval_sets.gsm8k.path={files['test']}"])
    with pytest.raises(ConfigError, match=r"eval_sets.gsm8k has both digits .* and path"):
        load_config(None, _math(files, "eval_sets.gsm8k.digits=2"))


def test_chat_prompts_need_a_chat_template(files) -> None:
    bare = files["tmp"] / "bare"
    save_tiny_llama(bare)
    config = json.loads((bare / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (bare / "tokenizer_config.json").write_text(json.dumps(config))
    (bare / "chat_template.jinja").unlink(missing_ok=True)
    chat = _math(files, f"policy.path={bare}", "task.prompt_style=chat")
    with pytest.raises(
        ConfigError,
        match=r"task.prompt_style: chat needs a chat template, and the tokenizer in "
        r"policy.path .* has none",
    ):
        load_config(None, chat)
    load_config(None, [*chat, "policy.chat_template='{{ messages[0].content }}'"])  # a template given in the config
    load_config(None, _math(files, "task.prompt_style=chat"))  # the tokenizer's own
    with pytest.raises(ConfigError, match=r"policy.system_prompt is used only with chat prompts"):
        load_config(None, _math(files, "policy.system_prompt=Be brief."))
