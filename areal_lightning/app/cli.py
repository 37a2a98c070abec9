"""`areal-lightning fit | evaluate | plot | example | tiny-model` (also `python -m areal_lightning`)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def _add_config_arguments(
    parser: argparse.ArgumentParser,
    required: bool = True,
    help: str = "YAML config file (`areal-lightning example` writes one)",
) -> None:
    parser.add_argument("-c", "--config", required=required, help=help)
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides, e.g. trainer.max_steps=50")


def build_parser() -> argparse.ArgumentParser:
    """The command line: one sub-command per user task; heavy imports wait until a command runs."""
    from areal_lightning import __version__
    from areal_lightning.app.evaluate import add_evaluate_arguments
    from areal_lightning.app.example_configs import add_example_arguments, example_main
    from areal_lightning.app.fit import add_fit_arguments, fit_main
    from areal_lightning.app.tiny_model_command import add_tiny_model_arguments, tiny_model_main
    from areal_lightning.app.watch_checkpoints import add_watch_arguments, evaluate_command
    from areal_lightning.viz.command import add_plot_arguments, plot_main

    parser = argparse.ArgumentParser(
        prog="areal-lightning", description="RL training of language models with evaluation"
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    fit = sub.add_parser("fit", help="train with RL, evaluating on the configured triggers")
    _add_config_arguments(fit)
    add_fit_arguments(fit)
    fit.set_defaults(main=fit_main)
    evaluate = sub.add_parser("evaluate", help="evaluate a checkpoint on the configured eval sets")
    # Required, but checked by the command: its message names the run's own config.yaml.
    _add_config_arguments(
        evaluate,
        required=False,
        help="the run's config: `fit` saved it as <output_dir>/config.yaml, beside checkpoints/ (required)",
    )
    add_watch_arguments(evaluate, add_evaluate_arguments(evaluate))
    evaluate.set_defaults(main=evaluate_command)
    plot = sub.add_parser("plot", help="draw eval curves from run directories")
    add_plot_arguments(plot)
    plot.set_defaults(main=plot_main)
    example = sub.add_parser("example", help="print or write a packaged example config")
    add_example_arguments(example)
    example.set_defaults(main=example_main)
    tiny = sub.add_parser("tiny-model", help="write a tiny random-weight Hugging Face model to try a config with")
    add_tiny_model_arguments(tiny)
    tiny.set_defaults(main=tiny_model_main)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.main(args))
    except PermissionError as err:
        # A sandbox's directory that its programs cannot enter, refused as the task is built: one
        # line, before training. Any other refusal keeps its traceback.
        from areal_lightning.app.console import fail
        from areal_lightning.scoring.sandbox.pool import SandboxDirectoryError

        if not isinstance(err, SandboxDirectoryError):
            raise
        return fail(str(err))
    finally:
        # The code task's sandbox workers stop and their directories go now, not in a finalizer
        # that a process ending with os._exit (a forked one, a launched rank) never runs.
        pool = sys.modules.get("areal_lightning.scoring.sandbox.pool")
        if pool is not None:
            pool.close_all()


if __name__ == "__main__":
    sys.exit(main())
