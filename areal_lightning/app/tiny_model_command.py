"""`areal-lightning tiny-model DIR`: a tiny random-weight Hugging Face model and its tokenizer, written
from a config (nothing is downloaded), to try a config on a laptop before a real model is at hand."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from areal_lightning.app.console import fail


def add_tiny_model_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("directory", help="where to write the model (a new or empty directory)")
    parser.add_argument(
        "--reward-model",
        action="store_true",
        help="a sequence-classification model with one score (for RewardModelGrader) instead of a causal LM",
    )
    parser.add_argument("--seed", type=int, default=0, help="the weights' seed (default 0)")


def tiny_model_main(args: argparse.Namespace) -> int:
    """Writes the model, or refuses a directory that holds files (it never overwrites a model)."""
    out = Path(args.directory)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        what = "is a file" if not out.is_dir() else "is not empty"
        return fail(f"{args.directory!r} {what}; give a new directory (tiny-model never overwrites a model)")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # no "Writing model shards" bar
    try:
        import transformers  # noqa: F401
    except ImportError:
        return fail("tiny-model needs transformers: pip install 'areal-lightning[hf]'")
    from areal_lightning.rl.engines.hf.tiny_model import save_tiny_llama, save_tiny_reward_model

    if args.reward_model:
        save_tiny_reward_model(out, seed=args.seed)
        print(f"wrote a random reward model and its tokenizer to {out}: RewardModelGrader({str(out)!r})")
    else:
        save_tiny_llama(out, seed=args.seed)
        print(
            f"wrote a random-weight Llama and its tokenizer to {out}: a policy (policy.path={out}) or a judge "
            "(its completions are noise: its metrics show the pipeline, not skill)"
        )
    return 0
