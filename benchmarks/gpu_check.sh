#!/usr/bin/env bash
# GPU check (under 5 minutes): GRPO steps and evaluation of a GPT-2-small-sized random-weight
# HFPolicy; prints eval tokens/s (ours, HF generate dynamic and static cache), train steps/s and
# peak GPU memory. Needs torch, transformers, lightning and torchmetrics; omegaconf (and wandb,
# not used here) come from wheels in .whl/ when present, e.g. made on a machine with network by
#   python3 -m pip download --no-deps -d .whl omegaconf antlr4-python3-runtime==4.9.3 pyyaml
# Usage: benchmarks/gpu_check.sh [--cpu-smoke] [--steps N]
# The server engine (two vllm serve processes): benchmarks/gpu_check_servers.sh, run after this one.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if compgen -G ".whl/*.whl" > /dev/null; then
  "$PYTHON" -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-}
exec timeout 290 "$PYTHON" benchmarks/gpu_check.py "$@"
