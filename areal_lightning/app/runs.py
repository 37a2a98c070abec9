"""Run identity and run directories: a new run never mixes with an old one, a resumed run goes on.

A run directory (``output_dir``) holds one run. `fit` refuses to start a new run in a directory
that holds one (`run_files`), or moves to the next free trial directory with ``--new-run``
(`next_free_trial`). Every run has an id (`new_run_id`), kept in ``config.yaml``, every history
record and every checkpoint (`RunIdentity`); ``fit --ckpt`` reads it back (`checkpoint_run`) and
continues the run under it, including its W&B run and its CSV version.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from areal_lightning.app.config import CONFIG_FILENAME, Config
from areal_lightning.tracking.history import HISTORY_FILENAME, eval_rows, read_history, split_runs

RUN_ENV = "AREAL_LIGHTNING_RUN"
"""How the process a user started hands its run decision (run id, trial name) to the processes
Lightning starts for the other devices: they run the same command again and inherit its environment."""

RUN_ID_KEY = "run_id"
"""Where a checkpoint and ``config.yaml`` keep the run's id."""
WANDB_STEP_KEY = "wandb_step"
"""Where a checkpoint keeps the ``_step`` of the last row its W&B run held when it was saved."""
CHECKPOINT_DIRNAME = "checkpoints"
"""Checkpoints go to ``<output_dir>/checkpoints`` (``last.ckpt`` and ``step<N>.ckpt``)."""
LAST_CHECKPOINT = "last.ckpt"
"""The newest checkpoint of a run (Lightning's ``save_last``, and the one written on a stop signal)."""
CSV_DIRNAME = "csv"
"""Lightning's CSV logs go to ``<output_dir>/csv/version_<n>/metrics.csv``."""
WANDB_DIRNAME = "wandb"
RUN_FILES = (CONFIG_FILENAME, HISTORY_FILENAME, CHECKPOINT_DIRNAME, CSV_DIRNAME, WANDB_DIRNAME)
"""What a run writes into its ``output_dir``; any of them means the directory holds a run."""
NEW_RUN_OPTION = "--new-run"
_CSV_VERSION = re.compile(r"version_(\d+)")
_TRIAL_SUFFIX = re.compile(r"^(.*)-(\d+)$")


class RunDirError(ValueError):
    """The run directory cannot take this run; the message says why and what to do instead."""


def run_files(output_dir: str | Path) -> list[str]:
    """The files and directories of an earlier run in `output_dir` (`RUN_FILES` present), [] if none.

    Example:
        >>> run_files("no/such/dir")
        []
    """
    out = Path(output_dir)
    return [name for name in RUN_FILES if (out / name).exists()]


def used_dir_message(output_dir: str | Path, found: list[str], trial_name: str) -> str:
    """Why `fit` stops before a used directory, and the ways on (resuming only where a checkpoint is)."""
    out = Path(output_dir)
    if not any((out / CHECKPOINT_DIRNAME).glob("*.ckpt")):
        return (
            f"output_dir {str(out)!r} holds a run that stopped before its first checkpoint ({', '.join(found)}), "
            f"so there is nothing to resume; nothing was written. Either pass {NEW_RUN_OPTION} to start the run "
            f"in the next free trial directory beside it ({_bumped(trial_name, 1)}), or give another "
            f"trial_name=... (or output_dir=...), or delete the directory (rm -r {shlex.quote(str(out))}) and run "
            "the same command again"
        )
    return (
        f"output_dir {str(out)!r} already holds a run ({', '.join(found)}); nothing was written. Either "
        f"start a new run with another trial_name=... (or output_dir=...), or resume this one with "
        f"--ckpt {out / CHECKPOINT_DIRNAME / 'last.ckpt'}, or pass {NEW_RUN_OPTION} to start the new run in the "
        f"next free trial directory beside it ({_bumped(trial_name, 1)}, ...)"
    )


def _bumped(trial_name: str, k: int) -> str:
    match = _TRIAL_SUFFIX.match(trial_name)
    base, start = (match.group(1), int(match.group(2))) if match else (trial_name, 0)
    return f"{base}-{start + k}"


def next_free_trial(cfg: Config, load: Callable[[list[str]], Config]) -> Config:
    """The config with the first trial name ``<trial>-1``, ``<trial>-2``, ... whose output_dir
    holds no run; `cfg` itself when its output_dir is free.

    Args:
        cfg: the config as the user gave it.
        load: loads the config again with extra overrides (so ``${trial_name}`` resolves anew).

    Raises:
        RunDirError: the output_dir does not depend on trial_name, so no trial name frees it.
    """
    if not run_files(cfg.output_dir):
        return cfg
    k = 1
    while True:
        candidate = load([f"trial_name={_bumped(cfg.trial_name, k)}"])
        if Path(candidate.output_dir) == Path(cfg.output_dir):
            raise RunDirError(
                f"{NEW_RUN_OPTION} picks the next free trial_name, but output_dir={cfg.output_dir!r} does not "
                "contain ${trial_name}; give a new output_dir=... instead"
            )
        if not run_files(candidate.output_dir):
            return candidate
        k += 1


def start_run(cfg: Config) -> Config:
    """Gives a script that trains from a config (as `fit` does, e.g. ``examples/math/gsm8k_grpo.py``)
    one run identity: a new ``cfg.run_id`` in the process the user started, handed to the
    processes Lightning starts for the other devices (they run the script again) through the
    environment. The builders then put it everywhere `fit` does: ``config.yaml`` (`save_config`),
    the history, every checkpoint and the W&B run.

    Raises:
        RunDirError: the process the user started found a run in ``cfg.output_dir`` already.
    """
    import json
    import os

    from areal_lightning.tracking.history import new_run_id

    handed = json.loads(os.environ.get(RUN_ENV, "{}"))
    if handed.get("run_id"):  # a per-device process: the launching process decided
        cfg.run_id = handed["run_id"]
        return cfg
    found = run_files(cfg.output_dir)
    if found:
        raise RunDirError(used_dir_message(cfg.output_dir, found, cfg.trial_name))
    cfg.run_id = new_run_id()
    os.environ[RUN_ENV] = json.dumps({"run_id": cfg.run_id, "trial_name": cfg.trial_name})
    return cfg


def run_id_in_dir(output_dir: str | Path) -> str | None:
    """The run id that ``<output_dir>/config.yaml`` names, or None (no file, or written before run ids)."""
    path = Path(output_dir) / CONFIG_FILENAME
    if not path.is_file():
        return None
    data = yaml.safe_load(path.read_text())
    return data.get(RUN_ID_KEY) if isinstance(data, dict) else None


@dataclass(frozen=True)
class CheckpointRun:
    """What `fit --ckpt` needs of a checkpoint before building anything."""

    run_id: str | None
    """The id of the run that wrote it; None for a checkpoint written before run ids."""
    step: int
    """The global step it was saved at."""
    wandb_step: int | None = None
    """The ``_step`` of the last row of the run's W&B run when it was saved: where a resumed
    session rewinds the W&B run to. None: no W&B row then (or a checkpoint from before)."""


def checkpoint_run(ckpt: dict[str, Any]) -> CheckpointRun:
    """The run id, step and W&B rewind point of a loaded Lightning checkpoint (see
    `evaluate.load_checkpoint`)."""
    wandb_step = ckpt.get(WANDB_STEP_KEY)
    return CheckpointRun(
        run_id=ckpt.get(RUN_ID_KEY),
        step=int(ckpt["global_step"]),
        wandb_step=None if wandb_step is None else int(wandb_step),
    )


def resume_command(config: str | None, overrides: list[str], ckpt: str | Path, trial_name: str | None = None) -> str:
    """The shell command that resumes a run from `ckpt`: the user's config and overrides (a later
    ``--ckpt`` replaces an earlier one), with `trial_name` pinned when ``--new-run`` moved the run.

    Example:
        >>> resume_command("grpo.yaml", ["trainer.max_steps=50"], "runs/x/checkpoints/last.ckpt")
        'areal-lightning fit -c grpo.yaml trainer.max_steps=50 --ckpt runs/x/checkpoints/last.ckpt'
        >>> resume_command("my config.yaml", [], "c.ckpt", trial_name="t-1")
        "areal-lightning fit -c 'my config.yaml' trial_name=t-1 --ckpt c.ckpt"
    """
    words = ["areal-lightning", "fit"]
    if config is not None:
        words += ["-c", config]
    words += [o for o in overrides if not o.startswith("trial_name=")] if trial_name else list(overrides)
    if trial_name:
        words.append(f"trial_name={trial_name}")
    return shlex.join([*words, "--ckpt", str(ckpt)])


def latest_csv_version(output_dir: str | Path) -> int | None:
    """The highest ``<output_dir>/csv/version_<n>``: the version of the run the directory holds."""
    versions = [
        int(m.group(1))
        for d in (Path(output_dir) / CSV_DIRNAME).glob("version_*")
        if (m := _CSV_VERSION.fullmatch(d.name)) and d.is_dir()
    ]
    return max(versions, default=None)


def last_logged_eval_step(output_dir: str | Path, run_id: str) -> int | None:
    """The highest step the run's earlier sessions evaluated during training (their history
    records), i.e. the last eval point they sent to W&B; None when there is none."""
    try:
        records = read_history(output_dir)
    except FileNotFoundError:
        return None
    steps = [
        int(r["step"])
        for r in eval_rows(split_runs(records).get(run_id, []))
        if r.get("source", "training") == "training"
    ]
    return max(steps, default=None)


class RunIdentity(Callback):
    """Writes the run's id into every checkpoint (``checkpoint["run_id"]``), so that a resumed
    run, and ``evaluate`` of any of its checkpoints, know which run the weights belong to; and the
    ``_step`` of the W&B run's last row (``checkpoint["wandb_step"]``), where a resumed session
    rewinds the W&B run to (rank 0 alone talks to W&B, and writes the checkpoint).

    Args:
        run_id: the run's id.

    Example:
        >>> ckpt = {}
        >>> RunIdentity("k3j9x2a1").on_save_checkpoint(None, None, ckpt)
        >>> ckpt
        {'run_id': 'k3j9x2a1'}
    """

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id

    @override
    def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        checkpoint[RUN_ID_KEY] = self.run_id
        if trainer is not None and trainer.is_global_zero:
            from areal_lightning.tracking.wandb_logger import last_logged_step

            wandb_step = last_logged_step(trainer.loggers)
            if wandb_step is not None:
                checkpoint[WANDB_STEP_KEY] = wandb_step


__all__ = [
    "RUN_FILES",
    "CheckpointRun",
    "RunDirError",
    "RunIdentity",
    "checkpoint_run",
    "last_logged_eval_step",
    "latest_csv_version",
    "next_free_trial",
    "resume_command",
    "run_files",
    "run_id_in_dir",
    "start_run",
    "used_dir_message",
]
