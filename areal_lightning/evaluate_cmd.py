"""`areal-lightning evaluate`: placeholder wiring, replaced by the sharded evaluate command."""

from __future__ import annotations

import argparse


def add_evaluate_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ckpt", required=True, help="Lightning checkpoint to evaluate")


def evaluate_main(args: argparse.Namespace) -> int:
    raise NotImplementedError("areal-lightning evaluate is not implemented yet")
