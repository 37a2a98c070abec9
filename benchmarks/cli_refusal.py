"""How fast `areal-lightning fit -c BAD.yaml` refuses a bad config, side by side in one run.

Two files of the bad-config corpus, each refused by a fresh ``python -m areal_lightning fit``,
alternating, ``--repeats`` times: one refused by the config's own checks (no torch, no
Lightning), one refused only by Lightning's list of accelerators (which imports Lightning and
torch). The ratio of their medians is what a user saves on the common mistakes.

    .venv/bin/python benchmarks/cli_refusal.py [--repeats 5] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

CORPUS = Path(__file__).resolve().parents[1] / "tests" / "reliability" / "bad_configs"
LIGHT = "11_zero_freq_steps"
HEAVY = "37_unknown_accelerator"


def _refusal_secs(name: str) -> float:
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "areal_lightning", "fit", "-c", str(CORPUS / f"{name}.yaml")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    secs = time.perf_counter() - start
    if proc.returncode != 2:
        raise SystemExit(f"{name}: expected exit status 2, got {proc.returncode}: {proc.stderr[-500:]}")
    return secs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    times: dict[str, list[float]] = {LIGHT: [], HEAVY: []}
    for _ in range(args.repeats):
        for name in times:
            times[name].append(_refusal_secs(name))
    medians = {name: statistics.median(values) for name, values in times.items()}
    result = {
        "light_s": medians[LIGHT],
        "heavy_s": medians[HEAVY],
        "ratio_heavy_over_light": medians[HEAVY] / medians[LIGHT],
        "repeats": args.repeats,
    }
    if args.json:
        print(json.dumps(result))
        return
    print(f"refused by the config's checks ({LIGHT}):   median {medians[LIGHT]:.2f} s")
    print(f"refused by Lightning's list ({HEAVY}): median {medians[HEAVY]:.2f} s")
    print(f"ratio: {result['ratio_heavy_over_light']:.1f}x")


if __name__ == "__main__":
    main()
