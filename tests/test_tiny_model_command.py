"""`areal-lightning tiny-model DIR`: a random model a config can use at once (a policy, a judge, a
reward model), the same weights for the same seed, and never over a directory that holds files."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from areal_lightning.app.cli import main
from areal_lightning.app.console import USAGE_ERROR


def _weights(directory: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(directory / "model.safetensors")


def test_the_model_is_a_policy_that_generates(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from areal_lightning.rl.engines.hf.policy import HFPolicy

    assert main(["tiny-model", str(tmp_path / "tiny")]) == 0
    assert f"policy.path={tmp_path / 'tiny'}" in capsys.readouterr().out
    policy = HFPolicy.from_pretrained(tmp_path / "tiny")
    tok = policy.tokenizer
    ids, mask = tok.pad_left([tok.encode("def f():\n    return "), tok.encode("3+4=")])
    out = policy.generate(ids, mask, max_new_tokens=5, temperature=1.0, generators=torch.Generator().manual_seed(0))
    assert out.shape[0] == 2 and 1 <= out.shape[1] <= 5


def test_the_same_seed_writes_the_same_weights_and_another_seed_others(tmp_path: Path) -> None:
    for name, seed in (("a", "0"), ("b", "0"), ("c", "3")):
        assert main(["tiny-model", str(tmp_path / name), "--seed", seed]) == 0
    a, b, c = (_weights(tmp_path / n) for n in "abc")
    assert a.keys() == b.keys() == c.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)


def test_a_reward_model_is_accepted_by_the_reward_model_grader(tmp_path: Path) -> None:
    from areal_lightning.rl.model_graders import RewardModelGrader

    assert main(["tiny-model", str(tmp_path / "rm"), "--reward-model"]) == 0
    scores = RewardModelGrader(tmp_path / "rm", batch_size=2).score(["1+1=", "2+2="], ["2", "5"])
    assert len(scores) == 2 and scores[0] != scores[1]  # a continuous score per pair


def test_a_directory_that_holds_files_and_a_file_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "config.json").write_text("{}")
    assert main(["tiny-model", str(mine)]) == USAGE_ERROR
    assert f"'{mine}' is not empty; give a new directory" in capsys.readouterr().err
    assert [p.name for p in mine.iterdir()] == ["config.json"] and (mine / "config.json").read_text() == "{}"
    afile = tmp_path / "model.txt"
    afile.write_text("x")
    assert main(["tiny-model", str(afile)]) == USAGE_ERROR
    assert "is a file" in capsys.readouterr().err and afile.read_text() == "x"
    (tmp_path / "empty").mkdir()  # an empty directory is a new one
    assert main(["tiny-model", str(tmp_path / "empty")]) == 0
