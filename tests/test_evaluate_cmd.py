"""`areal-lightning evaluate`: the same checkpoint on 1 and 2 CPU processes, and its input errors.

The checkpoint comes from a real, very short `Trainer.fit` (format warm-up plus two GRPO steps),
so the policy emits answers and some are right: the metrics are not all zero.
"""

from __future__ import annotations

import re
import subprocess
from fractions import Fraction
from pathlib import Path

import pytest
import torch
import yaml
from callback_helpers import make_trainer
from cli_server import run_command
from procs import evaluate_command

from areal_lightning.app.cli import main
from areal_lightning.app.evaluate import format_table
from areal_lightning.eval_round import SetResult
from areal_lightning.tracking.history import read_history

ODD_SIZE = 99  # odd: uneven shards; at most the 100 one-digit problems
N_SAMPLES = 3
RUN_TIMEOUT_S = 150  # a hang (ranks waiting on each other) fails the test instead of blocking it
CONFIG = {
    "seed": 3,
    "policy": {"d_model": 32, "n_layers": 1},
    "grpo": {"warmup_steps": 60, "prompts_per_step": 4, "group_size": 4},
    "trainer": {"enable_progress_bar": False},
    "task": {"hold_out_eval": False},  # all but one of the 100 problems are evaluated
    "eval_sets": {"odd": {"digits": 1, "size": ODD_SIZE, "n_samples": N_SAMPLES, "batch_size": 8, "temperature": 1.0}},
}


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(config file, checkpoint) of a run trained for two steps."""
    from areal_lightning.app.builders import build_module
    from areal_lightning.app.config import load_config

    root = tmp_path_factory.mktemp("evaluate")
    config = root / "cfg.yaml"
    config.write_text(yaml.safe_dump(CONFIG))
    module = build_module(load_config(config))
    trainer = make_trainer(root, [], 2)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a width-32 model gains nothing from threads, and a busy box loses a lot
    try:
        trainer.fit(module)
    finally:
        torch.set_num_threads(threads)
    ckpt = root / "step2.ckpt"
    trainer.save_checkpoint(ckpt)
    return config, ckpt


def _evaluate(config: Path, ckpt: Path, out: Path, *overrides: str) -> subprocess.CompletedProcess:
    done = run_command(evaluate_command(config, ckpt, f"output_dir={out}", *overrides), RUN_TIMEOUT_S, cwd=out.parent)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


@pytest.mark.ddp
def test_one_and_two_processes_give_identical_metrics(run: tuple[Path, Path], tmp_path: Path) -> None:
    config, ckpt = run
    one = _evaluate(config, ckpt, tmp_path / "one")
    two = _evaluate(config, ckpt, tmp_path / "two", "trainer.devices=2", "trainer.strategy=ddp")
    (rec1,), (rec2,) = read_history(tmp_path / "one"), read_history(tmp_path / "two")
    assert (rec1["world_size"], rec2["world_size"]) == (1, 2)
    for rec in (rec1, rec2):
        assert rec["num_prompts"] == ODD_SIZE and rec["num_samples"] == ODD_SIZE * N_SAMPLES
        assert (rec["dataset"], rec["step"], rec["trigger"], rec["mode"]) == ("odd", 2, ["evaluate"], "sync")
        # A plain Trainer's checkpoint names no run; the record still says it is a standalone evaluation.
        assert (rec["run_id"], rec["source"]) == (None, "standalone")
    assert rec1["metrics"].keys() == rec2["metrics"].keys()
    for name, value in rec1["metrics"].items():
        assert value == rec2["metrics"][name], name  # bit for bit: the metrics' float sums are exact
    assert 0 < rec1["metrics"]["pass@3"] < 1  # some prompts solved, some not: the comparison has teeth
    for done in (one, two):
        header, *rows = done.stdout.split("\nappended to ")[0].splitlines()[1:]
        table = {row.split()[0]: row.split()[1:] for row in rows}
        assert header.split() == ["metric", "odd"] and list(table)[-3:] == ["num_prompts", "num_samples", "secs"]
        assert table["num_prompts"] == [str(ODD_SIZE)] and table["num_samples"] == [str(ODD_SIZE * N_SAMPLES)]
        assert table["accuracy"] == [f"{rec1['metrics']['accuracy']:.4f}"]


def _fails_with(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("areal-lightning: error: ") and "Traceback" not in err
    return err


def test_missing_checkpoint_file(run: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config, _ = run
    err = _fails_with(capsys, ["evaluate", "-c", str(config), "--ckpt", str(tmp_path / "nope.ckpt")])
    assert "--ckpt" in err and "nope.ckpt' does not exist" in err


def test_file_that_is_not_a_checkpoint(
    run: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config, _ = run
    text = tmp_path / "notes.ckpt"
    text.write_text("not a checkpoint")
    assert "notes.ckpt' is not a Lightning checkpoint: torch.load failed" in _fails_with(
        capsys, ["evaluate", "-c", str(config), "--ckpt", str(text)]
    )
    bare = tmp_path / "weights.pt"
    torch.save({"policy.head.weight": torch.zeros(2)}, bare)
    err = _fails_with(capsys, ["evaluate", "-c", str(config), "--ckpt", str(bare)])
    assert "is not a Lightning checkpoint: expected a dict with 'state_dict' and 'global_step'" in err
    assert "policy.head.weight" in err


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        (
            "policy.d_model=64",
            r"size mismatch for policy.tok.weight: copying a param with shape torch.Size\(\[\d+, 32\]\) "
            r"from checkpoint, the shape in current model is torch.Size\(\[\d+, 64\]\)",
        ),
        ("policy.n_layers=2", r'Missing key\(s\) in state_dict: "policy.blocks.1.'),
        ("grpo.kl_coef=0.1", r'Missing key\(s\) in state_dict: "reference.'),
    ],
)
def test_checkpoint_of_another_model(
    run: tuple[Path, Path], capsys: pytest.CaptureFixture[str], override: str, expected: str
) -> None:
    config, ckpt = run
    err = _fails_with(capsys, ["evaluate", "-c", str(config), "--ckpt", str(ckpt), override])
    assert f"checkpoint {str(ckpt)!r} does not match the model of the config" in err
    assert re.search(expected, err), err


def test_extra_weights_are_named_as_unexpected_keys(
    run: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config, ckpt = run
    data = torch.load(ckpt, weights_only=True)
    data["state_dict"]["policy.extra.weight"] = torch.zeros(1)
    edited = tmp_path / "edited.ckpt"
    torch.save(data, edited)
    err = _fails_with(capsys, ["evaluate", "-c", str(config), "--ckpt", str(edited)])
    assert 'Unexpected key(s) in state_dict: "policy.extra.weight"' in err


def test_config_errors_are_reported(run: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    config, ckpt = run
    err = _fails_with(capsys, ["evaluate", "-c", str(config), "--ckpt", str(ckpt), "trainer.devicez=2"])
    assert "unknown config key `trainer.devicez`" in err and "Did you mean `devices`?" in err
    err = _fails_with(capsys, ["evaluate", "-c", str(config), "--ckpt", str(ckpt), "trainer.strategy=nonsense"])
    assert "trainer.strategy must be one of auto, ddp," in err and "got 'nonsense'" in err


def test_untrusted_objects_need_trust_checkpoint(
    run: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config, ckpt = run
    data = torch.load(ckpt, weights_only=True)
    data["note"] = Fraction(1, 3)  # not on the safe loader's allow-list
    odd = tmp_path / "odd.ckpt"
    torch.save(data, odd)
    err = _fails_with(capsys, ["evaluate", "-c", str(config), "--ckpt", str(odd)])
    assert "holds objects the safe loader refuses" in err and "pass --trust-checkpoint" in err
    out = tmp_path / "trusted"
    assert (
        main(
            [
                "evaluate",
                "-c",
                str(config),
                "--ckpt",
                str(odd),
                "--trust-checkpoint",
                f"output_dir={out}",
                "eval_sets.odd.size=5",
            ]
        )
        == 0
    )
    (record,) = read_history(out)
    assert (record["num_prompts"], record["world_size"], record["trigger"]) == (5, 1, ["evaluate"])
    assert "num_prompts" in capsys.readouterr().out


def test_history_option_chooses_the_file(run: tuple[Path, Path], tmp_path: Path) -> None:
    config, ckpt = run
    path = tmp_path / "elsewhere" / "h.jsonl"
    argv = ["evaluate", "-c", str(config), "--ckpt", str(ckpt), "--history", str(path), "eval_sets.odd.size=4"]
    assert main(argv) == 0 and main(argv) == 0  # appends, never rewrites
    assert [r["num_prompts"] for r in read_history(path)] == [4, 4]


def test_format_table_aligns_columns_and_marks_missing_metrics() -> None:
    results = [
        SetResult("easy", {"accuracy": 0.5, "pass@4": float("nan")}, 8, 2, 1.234, []),
        SetResult("hard_set", {"accuracy": 0.125}, 400, 100, 12.0, []),
    ]
    assert format_table(results).splitlines() == [
        "metric         easy  hard_set",
        "accuracy     0.5000    0.1250",
        "pass@4          nan         -",
        "num_prompts       2       100",
        "num_samples       8       400",
        "secs           1.23     12.00",
    ]


def test_records_say_how_they_were_sampled_and_top_k_one_is_greedy(run: tuple[Path, Path], tmp_path: Path) -> None:
    config, ckpt = run
    base = ["evaluate", "-c", str(config), "--ckpt", str(ckpt), "eval_sets.odd.size=40"]
    assert main([*base, f"output_dir={tmp_path / 'greedy'}", "eval_sets.odd.temperature=0"]) == 0
    assert main([*base, f"output_dir={tmp_path / 'top1'}", "eval_sets.odd.top_k=1", "eval_sets.odd.seed=9"]) == 0
    assert main([*base, f"output_dir={tmp_path / 'free'}"]) == 0
    (greedy,), (top1,), (free,) = (read_history(tmp_path / d) for d in ("greedy", "top1", "free"))
    assert top1["sampling"] == {
        "n_samples": N_SAMPLES,
        "temperature": 1.0,
        "top_p": 1.0,
        "top_k": 1,
        "max_new_tokens": CONFIG["grpo"].get("max_new_tokens", 4),
        "stop": [],
        "seed": 9,
        "ks": [1, N_SAMPLES],
    }
    assert (greedy["sampling"]["temperature"], free["sampling"]["seed"]) == (0.0, CONFIG["seed"])
    assert top1["metrics"] == greedy["metrics"]  # only the top token: the greedy answer, whatever the seed
    assert free["metrics"]["pass@3"] != free["metrics"]["pass@1"]  # sampling at temperature 1 does vary
