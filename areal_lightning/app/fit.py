"""`areal-lightning fit -c CONFIG [key=value ...] [--ckpt PATH]`: train with evaluation on the triggers."""

from __future__ import annotations

import argparse
from pathlib import Path

from areal_lightning.app.config import ConfigError, load_config, save_config
from areal_lightning.app.console import fail, log, quiet_lightning


def add_fit_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds the options of `areal-lightning fit` (``-c`` and the overrides come from the CLI)."""
    parser.add_argument("--ckpt", default=None, help="resume from this Lightning checkpoint")


def fit_main(args: argparse.Namespace) -> int:
    """Trains the config's module with the evaluation callback; returns the exit status."""
    try:
        cfg = load_config(args.config, args.overrides)
    except ConfigError as err:
        return fail(str(err))
    if args.ckpt is not None and not Path(args.ckpt).is_file():
        return fail(f"--ckpt {args.ckpt!r} is not a checkpoint file")
    quiet_lightning()
    import lightning as L

    from areal_lightning.app.builders import build_callback, build_trainer
    from areal_lightning.rl.grpo import GRPOModule
    from areal_lightning.tracking.wandb_logger import finish_wandb

    L.seed_everything(cfg.seed, verbose=False)
    module = GRPOModule.from_config(cfg)
    trainer = build_trainer(cfg, [build_callback(cfg)])
    if trainer.is_global_zero:
        log.info("config saved to %s", save_config(cfg, cfg.output_dir))
    try:
        trainer.fit(module, ckpt_path=args.ckpt)
    finally:
        finish_wandb(trainer.loggers)  # Lightning leaves the W&B run open
    if trainer.is_global_zero:
        _plot_run(Path(cfg.output_dir))
    return 0


def _plot_run(run_dir: Path) -> None:
    from areal_lightning.tracking.history import history_path
    from areal_lightning.viz.plot import PlotError, plot_runs

    try:
        log.info("eval history: %s\nplot: %s", history_path(run_dir), plot_runs([run_dir]))
    except PlotError as err:
        log.warning("no plot drawn: %s", err)
