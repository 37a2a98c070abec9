"""The config's ``graders`` section: what it accepts, what it refuses before any model loads (the
model directories here are a config.json and a tokenizer file: enough for the checks, no weights)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from areal_lightning.app.config import ConfigError, load_config, save_config

BASE = "eval_sets: {easy: {size: 4}}\n"


def model_dir(path: Path, architecture: str, *, tokenizer: bool = True) -> Path:
    """A directory that looks like `save_pretrained`'s output to the config's checks."""
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"architectures": [architecture]}))
    if tokenizer:
        (path / "tokenizer.json").write_text("{}")
    return path


@pytest.fixture
def dirs(tmp_path: Path) -> dict[str, Path]:
    return {
        "rm": model_dir(tmp_path / "rm", "LlamaForSequenceClassification"),
        "judge": model_dir(tmp_path / "judge", "LlamaForCausalLM"),
    }


def _config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "c.yaml"
    path.write_text(BASE + text)
    return path


def test_a_graders_section_loads_and_a_saved_config_loads_back(tmp_path: Path, dirs: dict[str, Path]) -> None:
    text = f"""graders:
  reward_model: {{path: {dirs["rm"]}, batch_size: 4}}
  judge:
    path: {dirs["judge"]}
    template: "Q: {{prompt}}\\nA: {{completion}}\\nVerdict?"
    verdict_pattern: '(YES|NO)'
    correct_word: 'yes'
"""
    cfg = load_config(_config(tmp_path, text), [f"output_dir={tmp_path}/run"])
    assert cfg.graders.reward_model is not None and cfg.graders.judge is not None
    assert (cfg.graders.reward_model.batch_size, cfg.graders.reward_model.max_length) == (4, 1024)
    assert cfg.graders.judge.template == "Q: {prompt}\nA: {completion}\nVerdict?"
    judge = cfg.graders.judge
    assert (judge.verdict_pattern, judge.correct_word, judge.max_new_tokens) == ("(YES|NO)", "yes", 16)
    again = load_config(save_config(cfg, tmp_path / "run"))  # what `evaluate -c <run>/config.yaml` reads
    assert again.graders == cfg.graders


def test_graders_are_off_by_default_and_can_be_given_on_the_command_line(tmp_path: Path, dirs) -> None:
    assert not load_config(_config(tmp_path, "")).graders.given
    cfg = load_config(_config(tmp_path, ""), [f"graders.reward_model.path={dirs['rm']}"])
    assert cfg.graders.reward_model is not None and cfg.graders.reward_model.path == str(dirs["rm"])
    assert cfg.graders.judge is None
    text = f"graders: {{judge: {{path: {dirs['judge']}}}}}\n"
    assert load_config(_config(tmp_path, text), ["graders.judge=null"]).graders.judge is None


@pytest.mark.parametrize(
    ("section", "match"),
    [
        (
            "reward_model: {path: JUDGE}",
            r"graders.reward_model.path '.*judge': its config.json names \['LlamaForCausalLM'\], so the score head "
            r"would be random; give a local directory of a model with a sequence-classification head .*"
            r"\(a causal LM can be a judge: graders.judge\)",
        ),
        ("reward_model: {path: EMPTY}", r"graders.reward_model.path '.*empty': the directory has no config.json"),
        ("judge: {path: NOTOK}", r"graders.judge.path '.*notok': the directory holds no tokenizer \(none of tokeniz"),
        ("judge: {path: RM, correct_word: ' '}", r"graders.judge.correct_word must be a word of the verdict"),
        (
            "judge: {path: JUDGE, verdict_pattern: '(YES|NO)', correct_word: yes}",
            r"graders.judge.correct_word is 'True', which graders.judge.verdict_pattern '\(YES\|NO\)' never finds: "
            r"YAML reads yes, no, on and off unquoted as true and false; quote the word",
        ),
    ],
    ids=["causal-lm-as-reward-model", "no-config-json", "no-tokenizer", "empty-correct-word", "unquoted-yes"],
)
def test_a_grader_directory_that_holds_no_usable_model_is_refused(tmp_path: Path, dirs, section: str, match) -> None:
    (tmp_path / "empty").mkdir()
    model_dir(tmp_path / "notok", "LlamaForCausalLM", tokenizer=False)
    names = {"JUDGE": dirs["judge"], "RM": dirs["rm"], "EMPTY": tmp_path / "empty", "NOTOK": tmp_path / "notok"}
    for word, path in names.items():
        section = section.replace(word, str(path))
    with pytest.raises(ConfigError, match=match):
        load_config(_config(tmp_path, f"graders: {{{section}}}\n"))


def test_graders_and_episodes_are_refused_together(tmp_path: Path, dirs) -> None:
    with pytest.raises(ConfigError, match="graders grade single-turn evaluation rollouts, and an episodes section"):
        load_config(_config(tmp_path, f"graders: {{reward_model: {{path: {dirs['rm']}}}}}\nepisodes: {{max_turns: 2}}"))


def test_a_metric_of_the_judge_can_be_named_only_when_there_is_a_judge(tmp_path: Path, dirs) -> None:
    decisions = "evaluator: {best_metrics: {judge/correct_share: max}}\n"
    judged = load_config(_config(tmp_path, decisions + f"graders: {{judge: {{path: {dirs['judge']}}}}}\n"))
    assert judged.evaluator.decisions.best_metrics == {"judge/correct_share": "max"}
    with pytest.raises(ConfigError, match=r"best_metrics.judge/correct_share names a metric the evaluation does not"):
        load_config(_config(tmp_path, decisions + f"graders: {{reward_model: {{path: {dirs['rm']}}}}}\n"))


@pytest.mark.parametrize(
    ("override", "match"),
    [
        ("task.judge.path=models/judge", r"unknown config key `task.judge`.*top-level section.*`graders.judge`"),
        ("judge.path=models/judge", r"unknown config key `judge`.*top-level section of their own: `graders.judge`"),
        ("graders.judge.model=models/judge", r"unknown config key `graders.judge.model`.*Did you mean `path`\?"),
        ("graders.reward_model.bach_size=4", r"`graders.reward_model.bach_size`.*Did you mean `batch_size`\?"),
    ],
)
def test_a_grader_key_in_the_wrong_place_is_refused_with_where_it_goes(tmp_path: Path, override, match) -> None:
    with pytest.raises(ConfigError, match=match):
        load_config(_config(tmp_path, ""), [override])
