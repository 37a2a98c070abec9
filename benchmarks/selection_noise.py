"""Which checkpoint does "the best" pick on a noisy eval set? A simulation with known true accuracies.

Each trial draws one training run's true accuracy curve over ``--rounds`` evaluated checkpoints
(it rises from 0.2-0.4 to a peak of 0.55-0.75 at a random round, then falls back by 0 to 10
points, as RL runs that over-train or collapse do, with 1 point of jitter per checkpoint), and one
eval set of N prompts drawn from a population of prompts of varied difficulty. A prompt's chance at
checkpoint t is ``sigmoid(theta_t + difficulty_i + u_ti)``: ``theta_t`` sets the population's
accuracy to the curve, ``u_ti`` is the checkpoint's own luck on that prompt. Every round samples
``--samples`` completions per prompt and records each prompt's share correct, as the default
evaluation does; the rules of `BestValues` (the package's own code) watch ``accuracy`` round after
round and end on a checkpoint. A pick is "truly worse" when the population accuracy of the picked
checkpoint is 2 points or more below the best checkpoint's.

Run: ``python benchmarks/selection_noise.py`` (about 2 minutes on one CPU core).
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np

from areal_lightning.callbacks.best import BestValues
from areal_lightning.callbacks.selection import SelectionRule

WORSE_BY = 0.02
DIFFICULTY_SD = 1.5
LUCK_SD = 0.5
HERMITE = np.polynomial.hermite_e.hermegauss(40)  # nodes and weights for E[f(Z)], Z ~ N(0, 1)


def population_accuracy(theta: float) -> float:
    """E[sigmoid(theta + D + U)] with D ~ N(0, 1.5^2), U ~ N(0, 0.5^2): one normal of their joint sd."""
    nodes, weights = HERMITE
    sd = math.hypot(DIFFICULTY_SD, LUCK_SD)
    return float(np.sum(weights / (1 + np.exp(-(theta + sd * nodes)))) / math.sqrt(2 * math.pi))


def theta_for(accuracy: float) -> float:
    low, high = -10.0, 10.0
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if population_accuracy(mid) < accuracy else (low, mid)
    return (low + high) / 2


def true_curve(rng: np.random.Generator, rounds: int) -> np.ndarray:
    start, peak = rng.uniform(0.2, 0.4), rng.uniform(0.55, 0.75)
    top, fall = rng.integers(rounds // 3, rounds), rng.uniform(0.0, 0.10)
    t = np.arange(rounds)
    rise = start + (peak - start) * np.minimum(t / max(top, 1), 1.0)
    after = np.clip((t - top) / max(rounds - 1 - top, 1), 0.0, 1.0)
    return np.clip(rise - fall * after + rng.normal(0.0, 0.01, rounds), 0.02, 0.98)


def one_trial(rng: np.random.Generator, prompts: int, args: argparse.Namespace, rules: list[BestValues]) -> list[float]:
    """Each rule's regret: the best checkpoint's true accuracy minus the picked one's."""
    curve = true_curve(rng, args.rounds)
    thetas = [theta_for(a) for a in curve]
    difficulty = rng.normal(0.0, DIFFICULTY_SD, prompts)
    # The same per-sample seeds every round (as the evaluation's): one uniform per prompt and sample,
    # a sample is right when its uniform falls below the prompt's chance at that checkpoint.
    uniforms = rng.random((prompts, args.samples))
    luck = rng.normal(0.0, LUCK_SD, prompts)
    rho = args.luck_corr
    for t, theta in enumerate(thetas):
        if t:  # each checkpoint's luck on a prompt: an AR(1) walk, so neighbours share most of it
            luck = rho * luck + math.sqrt(1 - rho * rho) * rng.normal(0.0, LUCK_SD, prompts)
        p = 1 / (1 + np.exp(-(theta + difficulty + luck)))
        draws = rng.random((prompts, args.samples)) if args.fresh_seeds else uniforms
        shares = (draws < p[:, None]).mean(axis=1)
        outcomes = {"accuracy": {i: float(v) for i, v in enumerate(shares)}}
        for rule in rules:
            rule.update("eval", {"accuracy": float(shares.mean())}, step=t, outcomes=outcomes)
    picked = [rule.best("eval", "accuracy") for rule in rules]
    return [float(curve.max() - curve[p[1]]) if p else math.nan for p in picked]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--sizes", type=int, nargs="+", default=[30, 100, 500])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--luck-corr", type=float, default=0.8, help="correlation of a prompt's luck at neighbouring checkpoints"
    )
    parser.add_argument("--fresh-seeds", action="store_true", help="new sampling seeds every round (ours keep them)")
    args = parser.parse_args()
    names = ["point", "lcb 95%", "paired 95%", "paired 80%"]
    seeds = "fresh seeds every round" if args.fresh_seeds else "the same seeds every round"
    print(
        f"{args.trials} trials, {args.rounds} rounds, {args.samples} samples per prompt, {seeds}, "
        f"luck correlation {args.luck_corr}; regret in points"
    )
    print(f"| prompts | rule | picks >= {WORSE_BY * 100:.0f} pts worse than the best | mean regret | p90 regret |")
    print("| ---: | --- | ---: | ---: | ---: |")
    start = time.perf_counter()
    for prompts in args.sizes:
        rng = np.random.default_rng([args.seed, prompts])
        regrets = []
        for _ in range(args.trials):
            rules = [
                BestValues({"accuracy": "max"}, SelectionRule.POINT),
                BestValues({"accuracy": "max"}, SelectionRule.LCB),
                BestValues({"accuracy": "max"}, SelectionRule.PAIRED),
                BestValues({"accuracy": "max"}, SelectionRule.PAIRED, confidence=0.8),
            ]
            regrets.append(one_trial(rng, prompts, args, rules))
        r = np.array(regrets)
        for j, name in enumerate(names):
            worse = np.mean(r[:, j] >= WORSE_BY - 1e-12)
            print(
                f"| {prompts} | {name} | {worse:.1%} | {r[:, j].mean() * 100:.2f} | "
                f"{np.quantile(r[:, j], 0.9) * 100:.2f} |"
            )
    print(f"({time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()
