"""A corpus of broken configurations: each is refused by `areal-lightning fit` with exit status 2,
one message that names the key and what is accepted, no traceback, and nothing written.

Each file of `bad_configs/` says on its first line what the message must match
(``# expect: <regex>``). The files run in-process through the CLI's `main` (a subprocess per file
would cost seconds of imports each); a few cases also run as real subprocesses.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest
from procs import run_in_group

from areal_lightning.app.cli import main

CORPUS = Path(__file__).resolve().parent / "bad_configs"
FILES = sorted(CORPUS.glob("*.yaml"))
GOOD_BASE = "eval_sets: {easy: {size: 4, n_samples: 4}}\ntrainer: {max_steps: 2}\n"
BAD_OVERRIDES = [
    (["evaluator.freq_stpes=5"], r"unknown config key `evaluator.freq_stpes` \(from the command line\).*`freq_steps`"),
    (["trainer.max_steps=abc"], r"`trainer.max_steps` \(from the command line\).*wrong type.*'abc'"),
    (["trainer.max_steps=0"], r"trainer.max_steps must be a positive integer, got 0"),
    (["evaluator.freq_steps=-5"], r"evaluator.freq_steps must be a positive integer or null, got -5"),
    (["eval_sets.easy.size=0"], r"eval_sets.easy.size must be a positive integer, got 0"),
    (["evaluator.metric_thresholds.rewrd=0.9"], r"metric_thresholds.rewrd names a metric.*Did you mean `reward/.*`"),
    (
        ["eval_sets.easy.n_samples=2", "evaluator.metric_thresholds.pass@4=0.5"],
        r"metric_thresholds.pass@4 names a metric the evaluation does not log.*pass@1, pass@1/stderr, pass@2,",
    ),
    (["policy.kind=hf"], r"policy.path is required for policy.kind: hf; give the local directory"),
    (["trainer.max_steps"], r"override 'trainer.max_steps' is not of the form key=value"),
    (
        ["eval_sets=[a,b]"],
        r"`eval_sets` \(from the command line\) must be a mapping of keys to values, got \['a', 'b'\]",
    ),
    (["evaluator.threshold_action=stop"], r"evaluator.threshold_action must be alert while metric_thresholds is empty"),
    (["seed=-1"], r"seed must be a non-negative integer, got -1"),
    (["policy.max_len=8"], r"policy.max_len must be at least 9 for task.train_digits=1 and grpo.max_new_tokens=4"),
]


def _expected(path: Path) -> str:
    first = path.read_text().splitlines()[0]
    assert first.startswith("# expect: "), f"{path.name}: the first line must be '# expect: <regex>'"
    return first.removeprefix("# expect: ")


def _refused(argv: list[str], cwd: Path, capsys: pytest.CaptureFixture[str]) -> str:
    """Runs the CLI in `cwd`; asserts exit 2, no traceback and an untouched `cwd`; returns stderr."""
    before = sorted(os.listdir(cwd))
    old = Path.cwd()
    os.chdir(cwd)
    try:
        status = main(argv)
    finally:
        os.chdir(old)
    out, err = capsys.readouterr()
    assert status == 2, (argv, out, err)
    assert err.startswith("areal-lightning: error: ") and err.count("\n") == 1, err  # one line, our prefix
    assert "Traceback" not in out + err
    assert sorted(os.listdir(cwd)) == before, "a refused config wrote files"
    return err


def test_the_corpus_is_big_enough() -> None:
    assert len(FILES) >= 30


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_bad_config_file_is_refused_naming_the_key(path: Path, tmp_path: Path, capsys) -> None:
    err = _refused(["fit", "-c", str(path)], tmp_path, capsys)  # output_dir is relative: under tmp_path
    assert re.search(_expected(path), err), err


@pytest.mark.parametrize(("overrides", "match"), BAD_OVERRIDES, ids=[" ".join(o) for o, _ in BAD_OVERRIDES])
def test_bad_override_is_refused_naming_the_key(overrides: list[str], match: str, tmp_path: Path, capsys) -> None:
    base = tmp_path / "base.yaml"
    base.write_text(GOOD_BASE)
    err = _refused(["fit", "-c", str(base), f"output_dir={tmp_path}/out", *overrides], tmp_path, capsys)
    assert re.search(match, err), err
    assert not (tmp_path / "out").exists()


def test_missing_checkpoint_is_refused_before_work(tmp_path: Path, capsys) -> None:
    base = tmp_path / "base.yaml"
    base.write_text(GOOD_BASE)
    err = _refused(["fit", "-c", str(base), f"output_dir={tmp_path}/out", "--ckpt", "nope.ckpt"], tmp_path, capsys)
    assert "--ckpt 'nope.ckpt' does not exist; pass a Lightning checkpoint file" in err


@pytest.mark.parametrize(
    "name", ["02_typo_evaluator", "20_pass_at_k_above_n", "28_malformed_unclosed_brace", "36_unknown_precision"]
)
@pytest.mark.process
def test_real_cli_process_exits_2_without_traceback(name: str, tmp_path: Path) -> None:
    path = CORPUS / f"{name}.yaml"
    proc = run_in_group([sys.executable, "-m", "areal_lightning", "fit", "-c", str(path)], timeout=180, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert re.search(_expected(path), proc.stderr) and "Traceback" not in proc.stderr
    assert os.listdir(tmp_path) == []


def test_a_good_base_is_accepted(tmp_path: Path) -> None:
    """The override cases fail because of the override alone."""
    from areal_lightning.app.config import load_config

    base = tmp_path / "base.yaml"
    base.write_text(GOOD_BASE)
    assert load_config(base, []).trainer.max_steps == 2


# Refused only once the metrics (threshold names come from the metrics themselves) or Lightning's
# own lists (accelerator, strategy, precision) are loaded; every other file is refused before.
NEEDS_HEAVY_IMPORTS = {
    "19_threshold_unknown_metric",
    "20_pass_at_k_above_n",
    "21_maj_at_k_above_n",
    "36_unknown_precision",
    "37_unknown_accelerator",
    "38_unknown_strategy",
}
HEAVY_MODULES = ("torch", "torchmetrics", "lightning", "matplotlib", "wandb")
_LIGHT_PROBE = """
import contextlib, io, json, sys
from areal_lightning.app.cli import main
out = []
for path in sys.argv[1:]:
    with contextlib.redirect_stderr(io.StringIO()):
        status = main(["fit", "-c", path])
    out.append([path, status, [m for m in HEAVY if m in sys.modules]])
print(json.dumps(out))
""".replace("HEAVY", repr(HEAVY_MODULES))


@pytest.mark.process
def test_most_bad_configs_are_refused_before_torch_or_lightning_is_imported(tmp_path: Path) -> None:
    # One fresh interpreter refuses them in turn: a heavy import by any of them stays in sys.modules.
    light = [str(p) for p in FILES if p.stem not in NEEDS_HEAVY_IMPORTS]
    assert len(light) >= 30
    proc = run_in_group([sys.executable, "-c", _LIGHT_PROBE, *light], timeout=180, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    for path, status, heavy in json.loads(proc.stdout):
        assert (status, heavy) == (2, []), Path(path).name
