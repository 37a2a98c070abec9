"""What a person reads on the terminal: one line per round, on a line of its own (never glued to the
progress bar's last characters), under the Python API as under the CLI; the CLI without third-party
noise and with a sane epoch display when no max_epochs is set."""

from __future__ import annotations

import logging
import re
import sys
from pathlib import Path

import pytest
import yaml
from doc_blocks import ROOT, blocks
from procs import ANSI, on_a_terminal, round_lines_glued

from areal_lightning.app.builders import build_module
from areal_lightning.app.config import load_config
from areal_lightning.tracking.history import eval_rows, read_history

TIMEOUT_S = 300.0
MARKER = "evaluation at step"


def _readme_script(tmp_path: Path) -> Path:
    """The README's example as a user copies it into a file, run twice: as written, then with
    ``rounds={"verbose": False}`` (after a line the test finds)."""
    code = [b.text for b in blocks(ROOT / "README.md") if b.is_python]
    quiet = code[1].replace("decisions=", 'rounds={"verbose": False},\n    decisions=').replace("Adder())", "Adder())")
    assert quiet != code[1]
    script = tmp_path / "example.py"
    script.write_text("\n".join([*code, "print('QUIET RUN STARTS', flush=True)", quiet]))
    return script


@pytest.mark.process
def test_the_python_api_shows_one_line_per_round_on_a_terminal_and_verbose_false_none(tmp_path: Path) -> None:
    status, shown = on_a_terminal([sys.executable, str(_readme_script(tmp_path))], TIMEOUT_S, tmp_path)
    assert status == 0, shown[-3000:]
    loud, quiet = shown.split("QUIET RUN STARTS")
    rounds = eval_rows(read_history(tmp_path))
    first_run = len({r["step"] for r in rounds})  # both runs wrote the same steps into this history
    assert loud.count(MARKER) == first_run >= 3, loud[-3000:]
    assert round_lines_glued(loud) == []
    assert MARKER not in quiet


def _tiny_config(tmp_path: Path) -> Path:
    config = {
        "policy": {"d_model": 16, "n_layers": 1, "n_heads": 2},
        "grpo": {"warmup_steps": 2, "prompts_per_step": 8, "group_size": 2},
        "task": {"train_size": 16},  # two steps an epoch
        "trainer": {"max_steps": 6, "log_every_n_steps": 1},
        "eval_sets": {"easy": {"digits": 1, "size": 8, "n_samples": 2}},
        "evaluator": {"freq_steps": 2, "eval_before_train": True},
        "logger": {"wandb": {"mode": "offline"}},
        "output_dir": str(tmp_path / "run"),
    }
    path = tmp_path / "grpo.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.mark.process
def test_fit_on_a_terminal_shows_each_epoch_without_minus_two_and_no_third_party_noise(tmp_path: Path) -> None:
    argv = [str(Path(sys.executable).parent / "areal-lightning"), "fit", "-c", str(_tiny_config(tmp_path))]
    status, shown = on_a_terminal(argv, TIMEOUT_S, tmp_path)
    assert status == 0, shown[-3000:]
    steps = {r["step"] for r in eval_rows(read_history(tmp_path / "run"))}
    assert steps == {0, 2, 4, 6}
    assert shown.count(MARKER) == len(steps) and round_lines_glued(shown) == []
    assert re.search(r"Epoch 2\b", shown) and "/-2" not in shown  # max_epochs unset (Lightning shows 2/-2)
    wandb_noise = ("Tracking run with wandb", "Run history:", "Run summary:", "wandb sync", "wandb: ")
    for noise in ("litlogger", "litmodels", "LeafSpec", "GPU available", "TPU available", *wandb_noise):
        assert noise not in shown.replace("upload it with: wandb sync", ""), noise
    plain = [line for line in re.split(r"[\r\n]+", ANSI.sub("", shown)) if line.strip()]
    (sync,) = [line for line in plain if line.startswith("W&B: ")] or [shown[-2000:]]  # W&B's one line
    assert re.fullmatch(r"W&B: offline run in (\S+); upload it with: wandb sync \1", sync), sync
    assert Path(sync.split()[-1]).is_dir()
    # The round lines: the task's metrics (arithmetic: accuracy and reward), within the pty's 80 columns.
    starts = [i for i, line in enumerate(plain) if line.startswith(MARKER)]
    for i in starts:
        assert "easy: accuracy=" in plain[i] + plain[i + 1] and "reward/mean=" in plain[i] + plain[i + 1], plain[i]
        assert len(plain[i]) <= 80 and "completion/entropy" not in plain[i]


def test_a_run_shorter_than_its_warm_up_says_so(watch_log: list[logging.LogRecord], tmp_path: Path) -> None:
    import lightning as L

    module = build_module(load_config(_tiny_config(tmp_path), ["grpo.warmup_steps=8"]))
    trainer = L.Trainer(max_steps=3, logger=False, enable_checkpointing=False, enable_progress_bar=False)
    trainer.fit(module)
    warned = [r.getMessage() for r in watch_log if r.levelno == logging.WARNING]
    assert any(
        "grpo.warmup_steps=8 format-only steps (no answers learned) run before GRPO step 1, and "
        "trainer.max_steps=3 counts GRPO steps only" in m
        for m in warned
    ), warned
    assert trainer.global_step == 3  # the three GRPO steps ran after the warm-up
