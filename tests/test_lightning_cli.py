"""`EvaluationCallback` configured from a LightningCLI YAML file: ``trainer.callbacks`` with
``class_path`` / ``init_args``, `evaluate_fn` and `eval_sets` as dotted paths to a user's module."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("jsonargparse")
from lightning.pytorch.cli import LightningCLI

USER_MODULE = '''
import lightning as L
import torch
from torch.utils.data import DataLoader


class Regressor(L.LightningModule):
    """A user's own module: learns w towards 1."""

    def __init__(self, lr: float = 0.1) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.lr = lr

    def training_step(self, batch, batch_idx):
        return ((self.w - batch) ** 2).mean()

    def train_dataloader(self):
        return DataLoader(torch.ones(16, 1), batch_size=2)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)


def eval_sets():
    return {"targets": [0.5, 1.0, 1.5]}


def evaluate(module, batches, ctx):
    errors = [abs(float(module.w) - x) for batch in batches for x in batch.samples]
    return {"abs_error": torch.tensor(errors)}
'''


def _config(tmp_path: Path, evaluate_fn: str) -> Path:
    config = tmp_path / "cli.yaml"
    config.write_text(
        textwrap.dedent(f"""\
        trainer:
          default_root_dir: {tmp_path}
          max_steps: 4
          logger: false
          enable_checkpointing: false
          enable_progress_bar: false
          callbacks:
            - class_path: areal_lightning.callbacks.EvaluationCallback
              init_args:
                eval_sets: user_evals.eval_sets
                evaluate_fn: {evaluate_fn}
                schedule:
                  freq_steps: 2
                  eval_before_train: true
                decisions:
                  metric_thresholds: {{abs_error: 2.0}}
                output_dir: {tmp_path / "run"}
        model:
          lr: 0.1
        """)
    )
    return config


@pytest.fixture
def user_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "user_evals.py").write_text(USER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))


def test_callback_from_lightning_cli_yaml_evaluates_the_users_module(tmp_path: Path, user_module: None) -> None:
    from user_evals import Regressor

    cli = LightningCLI(Regressor, args=["fit", "-c", str(_config(tmp_path, "user_evals.evaluate"))])
    records = [json.loads(line) for line in (tmp_path / "run" / "eval_history.jsonl").read_text().splitlines()]
    events = {(r["event"], r["check"], r["status"]) for r in records if "event" in r}
    assert events == {("integrity", "duplicates", "ok")}
    rows = [r for r in records if "event" not in r]
    assert [(r["step"], r["dataset"], r["num_prompts"]) for r in rows] == [
        (0, "targets", 3),
        (2, "targets", 3),
        (4, "targets", 3),
    ]
    w = float(cli.model.w)
    assert rows[-1]["metrics"]["abs_error"] == pytest.approx((abs(w - 0.5) + abs(w - 1.0) + abs(w - 1.5)) / 3)
    assert rows[0]["metrics"]["abs_error"] == pytest.approx(1.0)  # w = 0 before training


def test_a_dotted_path_that_does_not_import_is_refused_before_training(tmp_path: Path, user_module: None) -> None:
    from user_evals import Regressor

    with pytest.raises(
        ValueError,
        match=r"`EvaluationCallback\(evaluate_fn='user_evals.evaluat'\)`: "
        r"module 'user_evals' has no attribute 'evaluat'",
    ):
        LightningCLI(Regressor, args=["fit", "-c", str(_config(tmp_path, "user_evals.evaluat"))])
    assert not (tmp_path / "run").exists()


@pytest.mark.process
def test_our_lightning_cli_reports_a_wrong_dotted_path_in_one_line(tmp_path: Path, user_module: None) -> None:
    """As a user runs it: ``python train.py fit -c config.yaml``; usage and one error line, exit 2."""
    import os
    import sys

    from procs import run_in_group

    (tmp_path / "train.py").write_text(
        "from areal_lightning.callbacks.lightning_cli import LightningCLI\n"
        "from user_evals import Regressor\n\n"
        "if __name__ == '__main__':\n"
        "    LightningCLI(Regressor)\n"
    )
    config = _config(tmp_path, "user_evals.evaluat")
    env = dict(os.environ, PYTHONPATH=str(tmp_path), OMP_NUM_THREADS="1")
    done = run_in_group([sys.executable, "train.py", "fit", "-c", str(config)], 120, cwd=tmp_path, env=env)
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert errors == [
        "error: `EvaluationCallback(evaluate_fn='user_evals.evaluat')`: module 'user_evals' has no attribute 'evaluat'"
    ]
    assert "Traceback" not in done.stderr and len(done.stderr.splitlines()) <= 6, done.stderr
    assert not (tmp_path / "run").exists()
