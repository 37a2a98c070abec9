"""load_config: YAML over defaults, then overrides; every mistake is a clear ConfigError."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from areal_lightning.app.config import Config, ConfigError, load_config, save_config

EXAMPLE = Path(__file__).resolve().parents[1] / "areal_lightning" / "app" / "configs" / "arithmetic_grpo.yaml"
MINIMAL = ["eval_sets.easy.size=4"]


def test_example_config_loads_with_interpolated_output_dir():
    cfg = load_config(EXAMPLE, [])
    assert cfg.output_dir == f"runs/{cfg.experiment_name}/{cfg.trial_name}"
    assert set(cfg.eval_sets) == {"easy", "hard"}
    assert cfg.evaluator.schedule.eval_before_train and cfg.evaluator.schedule.freq_steps == 100


def test_overrides_win_over_the_yaml_file_and_interpolation_follows_them():
    cfg = load_config(EXAMPLE, ["trainer.max_steps=50", "trial_name=t9", "evaluator.metric_thresholds.reward=0.5"])
    assert cfg.trainer.max_steps == 50
    assert cfg.output_dir.endswith("/t9")
    assert cfg.evaluator.decisions.metric_thresholds == {"accuracy": 0.7, "reward": 0.5}


def test_saved_config_loads_back_to_the_same_config(tmp_path):
    cfg = load_config(EXAMPLE, ["trainer.max_steps=7"])
    path = save_config(cfg, tmp_path)
    assert path == tmp_path / "config.yaml"
    assert load_config(path, []) == cfg


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        (
            ["evaluator.freq_stpes=5"],
            r"unknown config key `evaluator.freq_stpes`.*Did you mean `freq_steps`\?"
            r".*freq_epochs, freq_steps, freq_secs",
        ),
        (["trainer.max_steps=abc"], r"`trainer.max_steps`.*wrong type.*'abc'.*Integer"),
        (["trainer.max_steps=2.5"], r"`trainer.max_steps`.*wrong type.*'2.5'"),
        (["evaluator.freq_steps=-5"], r"evaluator.freq_steps must be a positive integer or null, got -5"),
        (
            ["evaluator.freq_secs=-1.0"],
            r"evaluator.freq_secs must be a positive finite number of seconds or null, got -1.0",
        ),
        (["grpo.group_size=1"], r"grpo.group_size must be at least 2 .* got 1"),
        (["evaluator.mode=later"], r"evaluator.mode must be one of sync, async; got 'later'"),
        (["policy.kind=gpt"], r"policy.kind must be one of tiny, hf; got 'gpt'"),
        (["logger.wandb.mode=maybe"], r"logger.wandb.mode must be one of online, offline, disabled; got 'maybe'"),
        (["eval_sets.easy.sise=3"], r"unknown config key `eval_sets.easy.sise`.*Did you mean `size`"),
        (["eval_sets.easy.size=0"], r"eval_sets.easy.size must be a positive integer, got 0"),
        (["policy.n_heads=3"], r"policy.n_heads must divide policy.d_model, got d_model=64, n_heads=3"),
        (["output_dir=${nope}"], r"`output_dir`.*Interpolation key 'nope' not found"),
        (["trainer.max_steps"], r"override 'trainer.max_steps' is not of the form key=value"),
        (["evaluator.freq_steps=null", "evaluator.eval_at_end=false"], r"evaluator would never evaluate"),
    ],
)
def test_each_bad_value_names_the_key_the_value_and_what_is_accepted(overrides, match):
    with pytest.raises(ConfigError, match=match):
        load_config(None, MINIMAL + overrides)


def test_no_eval_set_is_an_error():
    with pytest.raises(ConfigError, match=r"eval_sets is empty"):
        load_config(None, [])


def test_missing_file_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match=r"config file '.*nope.yaml' does not exist"):
        load_config(tmp_path / "nope.yaml", [])


def test_malformed_yaml_names_the_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("trainer:\n  max_steps: [1, 2\nseed: 3\n")
    with pytest.raises(ConfigError, match=r"is not valid YAML at line \d+, column \d+"):
        load_config(bad, [])


def test_unknown_key_in_yaml_names_the_file(tmp_path):
    bad = tmp_path / "typo.yaml"
    bad.write_text("eval_sets: {easy: {size: 3}}\nevaluator: {freq_stpes: 5}\n")
    with pytest.raises(ConfigError, match=r"unknown config key `evaluator.freq_stpes` \(from file '.*typo.yaml'\)"):
        load_config(bad, [])


def test_yaml_that_is_not_a_mapping_is_an_error(tmp_path):
    bad = tmp_path / "list.yaml"
    bad.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match=r"must hold a mapping of keys to values, got a list"):
        load_config(bad, [])


def test_defaults_are_a_valid_config():
    assert isinstance(load_config(None, MINIMAL), Config)


def test_a_removed_key_says_why_it_went_and_what_to_do(tmp_path):
    old = tmp_path / "old.yaml"
    old.write_text("grpo:\n  lr: 0.001\n  clip_eps: 0.2\neval_sets: {easy: {size: 3}}\n")
    with pytest.raises(
        ConfigError, match=r"`grpo.clip_eps` \(from file .*old.yaml'\) was removed: .*ratio exactly 1.*delete"
    ):
        load_config(old, [])
    with pytest.raises(
        ConfigError, match=r"`grpo.clip_eps` \(from the command line\) was removed: .*drop the override"
    ):
        load_config(None, [*MINIMAL, "grpo.clip_eps=0.1"])


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("evaluator.adaptive.dataset=easy", "evaluator.adaptive.eval_set"),
        ("evaluator.reward_watch.eval_metric=accuracy", "evaluator.reward_watch.metric"),
        ("evaluator.max_snapshot_mb=64", "evaluator.max_snapshot_mib"),
        ("evaluator.prompt_story.max_file_mb=8", "evaluator.prompt_story.max_file_mib"),
        ("policy.stop_strings=[x]", "policy.stop"),
    ],
)
def test_a_renamed_key_names_its_new_name(old, new):
    key = old.split("=")[0]
    with pytest.raises(ConfigError, match=rf"`{key}` \(from the command line\) was renamed to `{new}`"):
        load_config(None, [*MINIMAL, old])


def test_the_flat_evaluator_keys_load_the_same_config_as_the_groups(tmp_path):
    # config.yaml holds the four groups; every one of their keys written flat loads the same config.
    cfg = load_config(
        EXAMPLE,
        [
            "evaluator.freq_secs=30",
            "evaluator.adaptive={metric: accuracy, min_steps: 5}",
            "evaluator.max_table_rows=3",
            "evaluator.best_metrics={accuracy: max}",
        ],
    )
    grouped = yaml.safe_load(save_config(cfg, tmp_path).read_text())
    assert list(grouped["evaluator"]) == ["schedule", "execution", "rounds", "decisions"]
    flat = {**grouped, "evaluator": {k: v for group in grouped["evaluator"].values() for k, v in group.items()}}
    assert len(flat["evaluator"]) == sum(len(g) for g in grouped["evaluator"].values())  # no name in two groups
    (tmp_path / "flat.yaml").write_text(yaml.safe_dump(flat))
    assert load_config(tmp_path / "flat.yaml", []) == cfg == load_config(tmp_path / "config.yaml", [])


@pytest.mark.parametrize(
    ("override", "match"),
    [
        ("evaluator.freq_steps=0", r"^evaluator.freq_steps must be a positive integer or null, got 0$"),
        ("evaluator.schedule.freq_steps=0", r"^evaluator.schedule.freq_steps must be a positive integer or null"),
        ("evaluator.adaptive.min_steps=0", r"^evaluator.adaptive.min_steps must be a positive integer, got 0$"),
        ("evaluator.on_error=ignore", r"^evaluator.on_error must be one of log, raise; got 'ignore'"),
        ("evaluator.rounds.on_eror=log", r"unknown config key `evaluator.rounds.on_eror`.*Did you mean `on_error`"),
        ("evaluator.adaptive.eval_st=easy", r"unknown config key `evaluator.adaptive.eval_st`.*mean `eval_set`"),
    ],
)
def test_errors_name_the_key_as_the_user_wrote_it(override, match):
    with pytest.raises(ConfigError, match=match):
        load_config(None, [*MINIMAL, override])


def test_an_option_given_flat_and_grouped_in_one_file_is_refused(tmp_path):
    both = tmp_path / "both.yaml"
    both.write_text("eval_sets: {easy: {size: 3}}\nevaluator:\n  freq_steps: 5\n  schedule: {freq_steps: 10}\n")
    with pytest.raises(ConfigError, match=r"`evaluator.freq_steps` .* also given as `evaluator.schedule.freq_steps`"):
        load_config(both, [])
