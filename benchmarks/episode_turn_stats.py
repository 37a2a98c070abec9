"""What the per-turn completion statistics cost episodes, side by side in one run.

Three cases, each timed with and without the statistics alternately (A, B, A, B ...) so that the
machine's load hits both alike; the medians are compared:

* a training step of the packaged MT2 or MT4 config (its tiny policy after the format warm-up;
  rollout, loss, backward), with `step_episode_completion_stats` against none;
* an evaluation round of the config's eval set, with the statistics (and the engine's scores they
  read) against neither;
* on 2 gloo ranks, the statistics of one training step alone (update, then one packed gather of
  every metric's states), and their sync against the same metrics' compute with torchmetrics' own
  sync (two collectives and a barrier per state, as `step_completion_stats` syncs single-turn
  training's six metrics).

Run: ``.venv/bin/python benchmarks/episode_turn_stats.py [--config arithmetic_mt4] [--repeats 7]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from areal_lightning.app.builders import build_eval_sets
from areal_lightning.app.config import load_config
from areal_lightning.eval_round import run_round
from areal_lightning.rl.episodes import evaluation as episode_eval, training as episode_training
from areal_lightning.rl.episodes.completions import _computed_over_ranks
from areal_lightning.rl.grpo.module import GRPOModule
from areal_lightning.rl.grpo.warmup import format_warmup

CONFIGS = Path(__file__).resolve().parents[1] / "areal_lightning" / "app" / "configs"


def _module(config: str, warmup: bool = True) -> tuple[GRPOModule, Any]:
    cfg = load_config(str(CONFIGS / f"{config}.yaml"), [])
    module = GRPOModule.from_config(cfg)
    if warmup:  # the answer format: episodes of the lengths a run has
        format_warmup(module.policy, module.task, steps=cfg.grpo.warmup_steps, lr=cfg.grpo.warmup_lr, seed=cfg.seed)
    module.train_dataloader()
    return module, cfg


def _alternate(a: Callable[[], object], b: Callable[[], object], repeats: int) -> tuple[float, float]:
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(repeats):
        for fn, out in ((a, times[0]), (b, times[1])):
            start = time.perf_counter()
            fn()
            out.append(time.perf_counter() - start)
    return statistics.median(times[0]), statistics.median(times[1])


def _train_step(module: GRPOModule, batch: dict[str, Any], stats: bool) -> None:
    real = episode_training.step_episode_completion_stats
    if not stats:
        episode_training.step_episode_completion_stats = lambda *args, **kwargs: {}  # type: ignore[assignment]
    try:
        episodes = episode_training.roll_out(module, batch, module._train_samples)
        rewards = torch.tensor([e.reward(module.episodes) for e in episodes])
        loss, _ = episode_training.episode_loss(module, episodes, rewards)
        loss.backward()
        module.policy.zero_grad()
    finally:
        episode_training.step_episode_completion_stats = real


def _round(module: GRPOModule, cfg: Any, stats: bool) -> None:
    eval_sets = build_eval_sets(cfg, module.task)
    real = episode_eval.update_episode_completion_metrics
    if not stats:  # as before the statistics: no scores asked for, nothing counted
        episode_eval.update_episode_completion_metrics = lambda *args, **kwargs: None  # type: ignore[assignment]
        for eval_set in eval_sets:
            eval_set.options["token_scores"] = False
    try:
        run_round(module, eval_sets, GRPOModule.evaluate, seed=1, global_step=0, epoch=0)
    finally:
        episode_eval.update_episode_completion_metrics = real


def _ddp_stats(rank: int, world_size: int, config: str, repeats: int) -> tuple[float, float, float]:
    """Median times of one step's statistics (update and sync), and of the sync alone: one packed
    gather against torchmetrics' own sync of each metric (two collectives and a barrier per state)."""
    module, _ = _module(config, warmup=False)  # what the statistics cost hardly depends on the weights
    batch = next(iter(module.train_dataloader()))
    episodes = episode_training.roll_out(module, batch, module._train_samples)
    b = episode_training.episode_batch(episodes, module.tokenizer, "cpu")
    with torch.no_grad():
        logp, entropy = module.policy.completion_logprobs(b["prompt_ids"], b["prompt_mask"], b["action_ids"])
    args = (module.episodes.max_turns, module.policy.eos_id, module.task.answer_id, (logp, entropy, b["action_turns"]))
    metrics = module.train_completions
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        step, _ = _alternate(
            lambda: episode_training.step_episode_completion_stats(metrics, episodes, *args), lambda: None, repeats
        )
        packed, per_state = _alternate(
            lambda: _computed_over_ranks(metrics), lambda: [m.compute() for m in metrics.values()], repeats
        )
    return step, packed, per_state


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="arithmetic_mt4", choices=["arithmetic_mt2", "arithmetic_mt4"])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(2)
    module, cfg = _module(args.config)
    batch = next(iter(module.train_dataloader()))
    with_stats, without = _alternate(
        lambda: _train_step(module, batch, True), lambda: _train_step(module, batch, False), args.repeats
    )
    print(
        f"{args.config} training step: {without * 1e3:.0f} ms without, {with_stats * 1e3:.0f} ms with the "
        f"statistics ({with_stats / without - 1:+.1%})"
    )
    with_stats, without = _alternate(
        lambda: _round(module, cfg, True), lambda: _round(module, cfg, False), args.repeats
    )
    print(
        f"{args.config} eval round: {without * 1e3:.0f} ms without, {with_stats * 1e3:.0f} ms with the statistics "
        f"and scores ({with_stats / without - 1:+.1%})"
    )
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from ddp_utils import run_ddp

    (step, packed, per_state), _ = run_ddp(_ddp_stats, 2, args.config, args.repeats, timeout_s=600)
    print(
        f"{args.config} on 2 gloo ranks (rank 0): a step's statistics {step * 1e3:.1f} ms; their sync "
        f"{packed * 1e3:.1f} ms in one packed gather, {per_state * 1e3:.1f} ms with torchmetrics' own per state"
    )


if __name__ == "__main__":
    main()
