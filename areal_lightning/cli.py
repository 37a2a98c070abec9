"""`areal-lightning fit | evaluate | plot` (also `python -m areal_lightning`)."""

from __future__ import annotations

import argparse
import logging
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path

from areal_lightning.config import Config, ConfigError, load_config

USAGE_ERROR = 2
log = logging.getLogger("areal_lightning")


def _fail(message: str) -> int:
    print(f"areal-lightning: error: {message}", file=sys.stderr)
    return USAGE_ERROR


def _quiet_lightning() -> None:
    # A single-process CPU job needs no loader workers: each prompt batch is built in microseconds.
    warnings.filterwarnings("ignore", message=r".*does not have many workers.*")
    warnings.filterwarnings("ignore", message=r".*litlogger.*")
    if not log.handlers:  # our own lines only: Lightning's loggers keep their handlers
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False


def build_trainer(cfg: Config, callbacks: list):  # noqa: ANN201 - lazy import
    """Lightning's `Trainer` from the config's `trainer` and `logger` sections."""
    import lightning as L
    from lightning.pytorch.callbacks import ModelCheckpoint

    from areal_lightning.tracking.loggers import build_loggers

    output_dir = Path(cfg.output_dir)
    t = cfg.trainer
    checkpoints = ModelCheckpoint(dirpath=output_dir / "checkpoints", filename="step{step}", auto_insert_metric_name=False,
                                  every_n_train_steps=t.checkpoint_every_n_steps, save_top_k=-1, save_last=True)
    return L.Trainer(
        max_steps=t.max_steps, max_epochs=t.max_epochs if t.max_epochs is not None else -1,
        accelerator=t.accelerator, devices=t.devices, strategy=t.strategy, precision=t.precision,
        log_every_n_steps=t.log_every_n_steps, enable_progress_bar=t.enable_progress_bar,
        default_root_dir=str(output_dir), logger=build_loggers(cfg, output_dir) or False, callbacks=[*callbacks, checkpoints],
        enable_model_summary=False,
    )


def fit_main(args: argparse.Namespace) -> int:
    """Trains the config's module with the evaluation callback; returns the exit status."""
    try:
        cfg = load_config(args.config, args.overrides)
    except ConfigError as err:
        return _fail(str(err))
    if args.ckpt is not None and not Path(args.ckpt).is_file():
        return _fail(f"--ckpt {args.ckpt!r} is not a checkpoint file")
    _quiet_lightning()
    import lightning as L

    from areal_lightning.callbacks.evaluation import EvaluationCallback
    from areal_lightning.config import save_config
    from areal_lightning.rl.grpo import GRPOModule

    L.seed_everything(cfg.seed, verbose=False)
    module = GRPOModule.from_config(cfg)
    callback = EvaluationCallback.from_config(cfg)
    trainer = build_trainer(cfg, [callback])
    if trainer.is_global_zero:
        log.info("config saved to %s", save_config(cfg, cfg.output_dir))
    from areal_lightning.tracking.loggers import finish_wandb

    try:
        trainer.fit(module, ckpt_path=args.ckpt)
    finally:
        finish_wandb(trainer.loggers)  # Lightning leaves the W&B run open
    if trainer.is_global_zero:
        _plot_run(Path(cfg.output_dir))
    return 0


def _plot_run(run_dir: Path) -> None:
    from areal_lightning.viz.plot import PlotError, plot_runs

    try:
        log.info("eval history: %s\nplot: %s", run_dir / "eval_history.jsonl", plot_runs([run_dir]))
    except PlotError as err:
        log.warning("no plot drawn: %s", err)


def _add_config_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-c", "--config", required=True, help="YAML config file (e.g. examples/arithmetic/grpo.yaml)")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides, e.g. trainer.max_steps=50")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="areal-lightning", description="RL training of language models with evaluation")
    sub = parser.add_subparsers(dest="command", required=True)
    fit = sub.add_parser("fit", help="train with RL, evaluating on the configured triggers")
    _add_config_arguments(fit)
    fit.add_argument("--ckpt", default=None, help="resume from this Lightning checkpoint")
    fit.set_defaults(main=fit_main)

    from areal_lightning.evaluate_cmd import add_evaluate_arguments, evaluate_main

    evaluate = sub.add_parser("evaluate", help="evaluate a checkpoint on the configured eval sets")
    _add_config_arguments(evaluate)
    add_evaluate_arguments(evaluate)
    evaluate.set_defaults(main=evaluate_main)

    from areal_lightning.viz.plot import add_plot_arguments, plot_main

    plot = sub.add_parser("plot", help="draw eval curves from run directories")
    add_plot_arguments(plot)
    plot.set_defaults(main=plot_main)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.main(args))


if __name__ == "__main__":
    sys.exit(main())
