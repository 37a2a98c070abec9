#!/usr/bin/env bash
# The server engine's check (issue 42): two `vllm serve` processes of one model on 127.0.0.1, then
# benchmarks/server_round.py against them (a round through the servers against a plain client loop
# sending the same requests, one server against two, the weight publication and load apart), then
# both servers killed with their process groups. On a GPU machine each server takes a share of the
# GPU (--gpu-memory-utilization 0.35); with --cpu-smoke, the vLLM CPU build's servers of the tests'
# tiny Llama (a check that the script runs, not a measurement). Needs vLLM in $PYTHON's environment.
# Usage: benchmarks/gpu_check_servers.sh [--cpu-smoke] [MODEL_DIR]   (default: a tiny Llama made here, hidden
# size 128: the head size vLLM's CPU attention takes)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv-vllm/bin/python}
SMOKE=0
if [ "${1:-}" = "--cpu-smoke" ]; then SMOKE=1; shift; fi
if ! "$PYTHON" -c "import vllm" 2>/dev/null; then
  echo "gpu_check_servers: vllm is not importable by $PYTHON; skipped (make vllm-env, or PYTHON=...)"; exit 0
fi
WORK=$(mktemp -d /tmp/gpu-check-servers-XXXXXX)
PORTS=(18301 18302)
cleanup() {
  status=$?
  if [ "$status" != 0 ]; then
    for log in "$WORK"/server*.log; do echo "== the end of $log =="; tail -15 "$log"; done
  fi
  for pid in "${PIDS[@]:-}"; do kill -- -"$pid" 2>/dev/null || true; done
  rm -rf "$WORK"
}
PIDS=()
trap cleanup EXIT
MODEL=${1:-$WORK/model}
if [ ! -f "$MODEL/config.json" ]; then
  PYTHONPATH=$PWD "$PYTHON" -c "from areal_lightning.rl.engines.hf.tiny_model import save_tiny_llama; save_tiny_llama('$MODEL', hidden=128)"
fi
EXTRA=(--gpu-memory-utilization 0.35)
if [ "$SMOKE" = 1 ]; then
  EXTRA=(--dtype float32 --enforce-eager --no-enable-chunked-prefill --distributed-executor-backend uni)
  export VLLM_CPU_OMP_THREADS_BIND=nobind VLLM_CPU_KVCACHE_SPACE=1 OMP_NUM_THREADS=1 VLLM_ENABLE_V1_MULTIPROCESSING=0
fi
for port in "${PORTS[@]}"; do
  VLLM_SERVER_DEV_MODE=1 setsid timeout 1200 "$PYTHON" -m vllm.entrypoints.openai.api_server \
    --model "$MODEL" --served-model-name tiny --host 127.0.0.1 --port "$port" \
    --max-model-len 256 --seed 0 "${EXTRA[@]}" > "$WORK/server$port.log" 2>&1 &
  PIDS+=($!)
done
for port in "${PORTS[@]}"; do
  for _ in $(seq 600); do
    curl -sf "http://127.0.0.1:$port/health" > /dev/null && break
    sleep 1
  done
  curl -sf "http://127.0.0.1:$port/health" > /dev/null || { echo "server $port did not start:"; tail -20 "$WORK/server$port.log"; exit 1; }
done
ARGS=(--model "$MODEL" --urls "http://127.0.0.1:${PORTS[0]},http://127.0.0.1:${PORTS[1]}")
if [ "$SMOKE" = 1 ]; then ARGS+=(--prompts 4 --n-samples 2 --max-new-tokens 4 --repeats 1 --in-flight 4); fi
PYTHONPATH=$PWD "$PYTHON" benchmarks/server_round.py "${ARGS[@]}"
