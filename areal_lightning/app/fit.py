"""`areal-lightning fit -c CONFIG [key=value ...] [--ckpt PATH | --new-run]`: train with evaluation.

A new run goes into an ``output_dir`` that holds no run (or, with ``--new-run``, the next free
trial directory beside it) under a new run id. ``--ckpt`` continues the run that wrote the
checkpoint: same run id, same eval history, same W&B run, same CSV version (see `app.runs`).
"""

from __future__ import annotations

import argparse
import json
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from areal_lightning.app.config import (
    CONFIG_FILENAME,
    Config,
    ConfigError,
    WandbMode,
    load_config,
    save_config,
    to_yaml,
)
from areal_lightning.app.config_keys import flat
from areal_lightning.app.console import (
    ROUNDS_FAILED,
    USAGE_ERROR,
    fail,
    log,
    quiet_lightning,
    report_rounds,
    wandb_where,
)
from areal_lightning.tracking.writable import option_problem

if TYPE_CHECKING:
    import lightning as L

    from areal_lightning.app.interrupt import StopOnSignal


@dataclass
class _Run:
    cfg: Config
    resumed_from_step: int | None = None
    wandb_step: int | None = None  # the checkpoint's W&B rewind point


MODE_KEY = "evaluator.execution.mode"
"""The key of the evaluation mode, which the async worker's early start peeks at."""


def add_fit_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds the options of `areal-lightning fit` (``-c`` and the overrides come from the CLI)."""
    parser.add_argument(
        "--ckpt",
        default=None,
        help="resume the run that wrote this checkpoint (e.g. <output_dir>/checkpoints/last.ckpt): "
        "same run id, eval history, W&B run and CSV version",
    )
    parser.add_argument(
        "--new-run",
        action="store_true",
        help="if output_dir already holds a run, start this one in the next free trial "
        "directory beside it (trial_name <trial>-1, <trial>-2, ...) instead of stopping",
    )


def _is_launching_process() -> bool:
    """True in the process a user started; False in those Lightning (or torchrun, SLURM) starts per
    device, which must not re-decide the run (rank 0 may already have written into output_dir)."""
    from lightning.pytorch.utilities import rank_zero_only

    return getattr(rank_zero_only, "rank", 0) == 0 and int(os.environ.get("NODE_RANK", "0")) == 0


def _decide_run(args: argparse.Namespace, cfg: Config) -> _Run | str:
    """The run to start or continue, or the message of why not (exit 2, nothing written)."""
    from areal_lightning.app.checkpoints import CheckpointError, load_checkpoint
    from areal_lightning.app.runs import (
        RunDirError,
        checkpoint_run,
        next_free_trial,
        run_files,
        run_id_in_dir,
        used_dir_message,
    )
    from areal_lightning.tracking.history import new_run_id

    if args.ckpt is not None:
        try:
            ckpt = checkpoint_run(load_checkpoint(args.ckpt))
        except CheckpointError as err:
            return str(err)
        run_id = ckpt.run_id
        if run_id is None:
            run_id = new_run_id()
            log.info(
                "checkpoint %s has no run id (written before run ids existed); the run continues as %s",
                args.ckpt,
                run_id,
            )
        other = run_id_in_dir(cfg.output_dir)
        if other is not None and other != run_id:
            return (
                f"output_dir {cfg.output_dir!r} holds run {other}, but --ckpt {args.ckpt!r} is of run {run_id}; "
                "resume into the run's own output_dir, or a fresh one (another trial_name=...)"
            )
        cfg.run_id = run_id
        return _Run(cfg, resumed_from_step=ckpt.step, wandb_step=ckpt.wandb_step)
    if args.new_run:
        try:
            cfg = next_free_trial(cfg, lambda extra: load_config(args.config, [*args.overrides, *extra]))
        except RunDirError as err:
            return str(err)
    else:
        found = run_files(cfg.output_dir)
        if found:
            return used_dir_message(cfg.output_dir, found, cfg.trial_name)
    cfg.run_id = new_run_id()
    return _Run(cfg)


def _inherited_run(args: argparse.Namespace) -> _Run | str:
    """In a per-device process: the launching process's decision, from the environment when
    Lightning started this process. Under torchrun or SLURM it is not there; then the run id and
    directory stay undecided here, which is harmless: rank 0 alone writes files and talks to W&B,
    and Lightning broadcasts rank 0's checkpoint directory."""
    from areal_lightning.app.runs import RUN_ENV
    from areal_lightning.tracking.history import new_run_id

    handed = json.loads(os.environ.get(RUN_ENV, "{}"))
    try:
        cfg = load_config(args.config, [*args.overrides, *(f"{k}={v}" for k, v in handed.items() if k == "trial_name")])
    except ConfigError as err:
        return str(err)
    cfg.run_id = handed.get("run_id") or new_run_id()
    return _Run(cfg)


def output_paths_problem(cfg: Config) -> str | None:
    """Why the run could not write its files (``output_dir``, W&B's ``save_dir``), or None; asked
    before any work, so that a bad path is one line and not a traceback after training started."""
    paths = [("output_dir", cfg.output_dir)]
    if cfg.logger.wandb.mode is not WandbMode.DISABLED and cfg.logger.wandb.save_dir is not None:
        paths.append(("logger.wandb.save_dir", cfg.logger.wandb.save_dir))
    for key, path in paths:
        problem = option_problem(key, path)
        if problem is not None:
            return f"{problem}; pass a writable {key}=..."
    return None


def _save_config(run: _Run) -> Path:
    """config.yaml of a new run; a resumed run keeps the file and adds its own config if it differs."""
    cfg = run.cfg
    path = Path(cfg.output_dir) / CONFIG_FILENAME
    if run.resumed_from_step is None or not path.is_file():
        return save_config(cfg, cfg.output_dir)
    if path.read_text() == to_yaml(cfg):
        return path
    resumed = path.with_name(f"config.resumed-step{run.resumed_from_step}.yaml")
    resumed.write_text(to_yaml(cfg))
    return resumed


def _record_resume(run: _Run, ckpt: str) -> None:
    from areal_lightning.tracking.history import EvalHistory
    from areal_lightning.tracking.records import event_record

    assert run.resumed_from_step is not None
    EvalHistory.in_run_dir(run.cfg.output_dir).append(
        event_record(
            "resume",
            run.resumed_from_step,
            run_id=run.cfg.run_id,
            message=f"resumed from {ckpt} at step {run.resumed_from_step}; later records written before this one "
            "are superseded",
        )
    )


def _prestart_async_worker(args: argparse.Namespace) -> None:
    """In async mode, the worker's fork server starts importing torch and Lightning now, beside this
    process's own start-up (reading the config imports them too), so that the worker is ready
    when training starts. A peek at the raw YAML and overrides: a config that does not load is
    reported by `load_config`, and a missed peek only makes the worker start later."""
    from omegaconf import OmegaConf

    try:
        layers = [OmegaConf.load(args.config)] if args.config else []
        layers += [OmegaConf.from_dotlist([override]) for override in args.overrides]
        mode = policy = engine = None
        for layer in layers:  # the last layer that sets it wins, in either spelling (grouped or flat)
            keys = (MODE_KEY, flat(MODE_KEY), "policy.kind", "policy.eval_engine")
            found = [OmegaConf.select(layer, key) for key in keys]
            mode = next((m for m in found[:2] if m is not None), mode)
            policy = found[2] if found[2] is not None else policy
            engine = found[3] if found[3] is not None else engine
    except Exception:  # noqa: BLE001 - load_config names what is wrong
        return
    # Rounds through inference servers run in a thread of this process: no worker to start.
    if str(mode).lower() == "async" and str(engine).lower() != "server":
        from areal_lightning.callbacks.worker_launch import prestart

        hf = ["areal_lightning.rl.engines.hf.policy", "transformers"] if str(policy).lower() == "hf" else []
        prestart(["areal_lightning.rl.grpo.module", "areal_lightning.rl.rollout_eval", *hf])


def _read_config(args: argparse.Namespace) -> Config:
    """The command's config, the async worker's fork server started first (it imports meanwhile)."""
    _prestart_async_worker(args)
    return load_config(args.config, args.overrides)


def fit_main(args: argparse.Namespace) -> int:
    """Trains the config's module with the evaluation callback; returns the exit status."""
    try:
        cfg = _read_config(args)
    except ConfigError as err:
        return fail(str(err))
    if args.ckpt is not None and args.new_run:
        return fail("--ckpt resumes a run and --new-run starts a new one; pass one of them")
    quiet_lightning()
    launching = _is_launching_process()
    run = _decide_run(args, cfg) if launching else _inherited_run(args)
    if isinstance(run, str):
        return fail(run)
    cfg = run.cfg
    problem = output_paths_problem(cfg) if launching else None
    if problem is not None:
        return fail(problem)
    import lightning as L

    from areal_lightning.app.builders import build_callback, build_module, build_trainer
    from areal_lightning.app.interrupt import StopOnSignal
    from areal_lightning.app.runs import CHECKPOINT_DIRNAME, LAST_CHECKPOINT, last_logged_eval_step, latest_csv_version

    assert cfg.run_id is not None
    resumed = run.resumed_from_step is not None
    L.seed_everything(cfg.seed, verbose=False)
    module = build_module(cfg)
    module.warmed_up = args.ckpt is not None  # the checkpoint holds warmed-up weights: no second warm-up
    stop = StopOnSignal(Path(cfg.output_dir) / CHECKPOINT_DIRNAME / LAST_CHECKPOINT)
    trainer = build_trainer(
        cfg,
        [build_callback(cfg)],
        last_callbacks=[stop],
        csv_version=latest_csv_version(cfg.output_dir) if resumed else None,
        rewind_wandb_to=run.wandb_step if resumed else None,
        logged_eval_through=last_logged_eval_step(cfg.output_dir, cfg.run_id) if resumed else None,
    )
    if trainer.is_global_zero:
        log.info("run %s in %s; config saved to %s", cfg.run_id, cfg.output_dir, _save_config(run))
        if resumed:
            _record_resume(run, args.ckpt)
    records_before = _count_records(cfg.output_dir) if trainer.is_global_zero else 0
    from areal_lightning.callbacks.integrity_checks import IntegrityError

    try:
        status = _fit_as_run(trainer, module, args.ckpt, cfg, stop)
    except IntegrityError as err:  # evaluator.decisions.integrity: fail, before the first step; recorded as events
        return fail(str(err)) if trainer.is_global_zero else USAGE_ERROR
    _finish_wandb(trainer, status)
    if not trainer.is_global_zero:
        return status  # rank 0 reports for every rank: the rounds and their failures are the same on all
    if status and status != ROUNDS_FAILED:
        _report_stop(args, cfg, stop, trainer.global_step)
        return status
    if not status:
        _plot_run(Path(cfg.output_dir))
    failed, total = _rounds_since(cfg.output_dir, records_before, cfg.run_id)
    if status:  # a round stopped training (the sanity round, or on_error: raise)
        failed, total = max(failed, 1), max(total, 1)
    return report_rounds(failed, total, _history_file(cfg.output_dir))


def _history_file(output_dir: str) -> Path:
    from areal_lightning.tracking.history import history_path

    return history_path(Path(output_dir))


def _count_records(output_dir: str) -> int:
    from areal_lightning.tracking.history import read_history

    path = _history_file(output_dir)
    return len(read_history(path)) if path.is_file() else 0


def _rounds_since(output_dir: str, records_before: int, run_id: str) -> tuple[int, int]:
    """(failed, all) evaluation rounds this session recorded: records after the first
    `records_before` of the run's history. A round is recorded as one eval record per eval set
    (at one step), and one ``error`` event per set that failed; a round with an error failed."""
    from areal_lightning.tracking.history import eval_rows, event_rows, read_history

    path = _history_file(output_dir)
    if not path.is_file():
        return 0, 0
    new = [r for r in read_history(path)[records_before:] if r.get("run_id") == run_id]
    failed = {r["step"] for r in event_rows(new, "error")}  # a round whose eval sets failed: one error each
    return len(failed), len(failed | {r["step"] for r in eval_rows(new)})


def _fit_as_run(trainer: Any, module: Any, ckpt: str | None, cfg: Config, stop: Any) -> int:
    """`trainer.fit` with the run's identity in the environment (processes the launcher starts
    inherit it); the exit status: 0, `ROUNDS_FAILED` when a failed round stopped training, or the
    signal's status when `stop` saw one end training."""
    from areal_lightning.app.interrupt import signal_exit_status
    from areal_lightning.app.runs import RUN_ENV
    from areal_lightning.eval_round import EvalRoundError
    from areal_lightning.tracking.wandb_logger import finish_wandb

    saved_env = os.environ.get(RUN_ENV)
    os.environ[RUN_ENV] = json.dumps({"run_id": cfg.run_id, "trial_name": cfg.trial_name})
    try:
        trainer.fit(module, ckpt_path=ckpt)
    except EvalRoundError:
        return ROUNDS_FAILED  # the sanity round (or on_error: raise) stopped training; logged and recorded
    except BaseException:
        # Lightning ends a Ctrl-C with sys.exit(1) and re-raises SIGTERMException: `stop` saw which.
        if stop.stopped_by is None:
            finish_wandb(trainer.loggers, exit_code=1)
            raise
        return signal_exit_status(stop.stopped_by)
    finally:
        if saved_env is None:
            os.environ.pop(RUN_ENV, None)
        else:
            os.environ[RUN_ENV] = saved_env
    return 0


def _finish_wandb(trainer: L.Trainer, status: int) -> None:
    """Ends the W&B run (Lightning leaves it open), then says where it is: W&B itself is silent here."""
    from areal_lightning.tracking.wandb_logger import finish_wandb

    where = wandb_where(trainer.loggers) if trainer.is_global_zero else None
    finish_wandb(trainer.loggers, exit_code=status)
    if where is not None:
        log.info("%s", where)


def _report_stop(args: argparse.Namespace, cfg: Config, stop: StopOnSignal, step: int) -> None:
    """The stop in the eval history (an ``interrupted`` event) and on stderr, with the command that
    resumes the run from the newest checkpoint."""
    from areal_lightning.app.runs import resume_command
    from areal_lightning.tracking.history import EvalHistory
    from areal_lightning.tracking.records import event_record

    assert stop.stopped_by is not None
    name = stop.stopped_by.name
    if stop.saved_step is not None:
        step = stop.saved_step
        what = f"training stopped by {name} after step {step}; checkpoint of that step: {stop.path}"
    elif stop.path.is_file():
        what = (
            f"training stopped by {name} at once during step {step + 1}, without a new checkpoint; "
            f"the latest is {stop.path}"
        )
    else:
        what = f"training stopped by {name} at once during step {step + 1}, before any checkpoint"
    command = (
        resume_command(args.config, args.overrides, stop.path, trial_name=cfg.trial_name if args.new_run else None)
        if stop.path.is_file()
        else None
    )
    message = f"{what}; resume with: {command}" if command else f"{what}; nothing to resume from"
    EvalHistory.in_run_dir(cfg.output_dir).append(
        event_record(
            "interrupted",
            step,
            run_id=cfg.run_id,
            message=message,
            signal=name,
            checkpoint=str(stop.path) if command else None,
            resume_command=command,
        )
    )
    log.warning("%s", what)
    if command:
        log.warning("resume with:\n  %s", command)


def _plot_run(run_dir: Path) -> None:
    from areal_lightning.tracking.history import history_path
    from areal_lightning.viz.plot import PlotError, plot_runs
    from areal_lightning.viz.runs import PlotNote

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", PlotNote)  # the rings of standalone evaluations: the figure shows them
            log.info("eval history: %s\nplot: %s", history_path(run_dir), plot_runs([run_dir]))
    except PlotError as err:
        log.warning("no plot drawn: %s", err)
