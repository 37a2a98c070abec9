"""A path the command cannot write to is refused before any work: exit 2, one line naming the
option and why, nothing written; for `fit`, `evaluate`, `evaluate --watch` and `plot`."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

from areal_lightning.app.cli import main
from areal_lightning.tracking.history import EvalHistory
from areal_lightning.tracking.records import eval_record
from areal_lightning.tracking.writable import directory_problem, file_problem

CONFIG = {
    "policy": {"d_model": 16, "n_layers": 1},
    "trainer": {"max_steps": 1, "enable_progress_bar": False},
    "grpo": {"warmup_steps": 0},
    "eval_sets": {"easy": {"digits": 1, "size": 4}},
}
# /proc refuses mkdir even to root (permissions would not stop root, so the tests use it).
PROC = "/proc/forbidden/run"


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty current directory holding only the config (and a file to put paths under)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(CONFIG))
    (tmp_path / "afile").write_text("not a directory\n")
    return tmp_path


def _refused(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("areal-lightning") and err.count("\n") == 1, err  # one line, no traceback
    return err


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.mark.parametrize(
    ("override", "names", "why"),
    [
        (f"output_dir={PROC}", f"output_dir '{PROC}'", "/proc does not accept new entries"),
        ("output_dir=afile/run", "output_dir 'afile/run'", "afile is a file, not a directory"),
    ],
)
def test_fit_refuses_an_output_dir_it_cannot_create(
    workdir: Path, capsys: pytest.CaptureFixture[str], override: str, names: str, why: str
) -> None:
    before = _files(workdir)
    err = _refused(capsys, ["fit", "-c", "cfg.yaml", override])
    assert names in err and why in err and "pass a writable output_dir=" in err
    assert _files(workdir) == before  # nothing written, not even lightning_logs


def test_fit_refuses_a_wandb_save_dir_it_cannot_create(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    err = _refused(capsys, ["fit", "-c", "cfg.yaml", "logger.wandb.mode=offline", "logger.wandb.save_dir=afile/wandb"])
    assert "logger.wandb.save_dir 'afile/wandb'" in err and "afile is a file" in err
    assert not (workdir / "runs").exists()


@pytest.fixture
def ckpt(workdir: Path) -> Path:
    """A checkpoint of the config's (untrained) model, as `evaluate` reads one."""
    from areal_lightning.app.builders import build_module
    from areal_lightning.app.config import load_config

    module = build_module(load_config(workdir / "cfg.yaml"))
    path = workdir / "w.ckpt"
    torch.save({"state_dict": module.state_dict(), "global_step": 3, "epoch": 0}, path)
    return path


@pytest.mark.parametrize(
    ("extra", "names", "why"),
    [
        ([f"output_dir={PROC}"], f"output_dir '{PROC}'", "/proc does not accept new entries"),
        (["--history", "afile/h.jsonl"], "--history 'afile/h.jsonl'", "afile is a file, not a directory"),
        (["--history", "."], "--history '.'", "is a directory, not a file"),
    ],
)
@pytest.mark.parametrize("what", ["--ckpt", "--watch"])
def test_evaluate_refuses_a_history_it_cannot_write(
    workdir: Path, ckpt: Path, capsys: pytest.CaptureFixture[str], what: str, extra: list[str], names: str, why: str
) -> None:
    target = str(ckpt) if what == "--ckpt" else str(workdir)
    before = _files(workdir)
    err = _refused(capsys, ["evaluate", "-c", "cfg.yaml", what, target, "--idle-timeout", "1", *extra])
    assert names in err and why in err
    assert _files(workdir) == before


def test_plot_refuses_an_out_file_it_cannot_write(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = workdir / "run"
    EvalHistory.in_run_dir(run).append(
        eval_record(0, 0, "easy", {"accuracy": 0.5}, trigger=["steps"], num_samples=4, num_prompts=4,
                    eval_secs=0.1, mode="sync", world_size=1)
    )  # fmt: skip
    before = _files(workdir)
    for out, why in ((f"{PROC}/a.png", "/proc does not accept new entries"), ("afile/a.png", "afile is a file")):
        assert main(["plot", str(run), "--out", out]) == 2
        err = capsys.readouterr().err
        assert f"--out '{out}' cannot be written" in err and why in err and "Traceback" not in err
    assert _files(workdir) == before


def test_the_probe_leaves_nothing_behind_and_accepts_what_can_be_written(tmp_path: Path) -> None:
    assert directory_problem(tmp_path / "new" / "deeper") is None
    assert file_problem(tmp_path / "new" / "h.jsonl") is None
    (tmp_path / "h.jsonl").write_text("{}\n")
    assert file_problem(tmp_path / "h.jsonl") is None
    assert _files(tmp_path) == ["h.jsonl"] and (tmp_path / "h.jsonl").read_text() == "{}\n"
